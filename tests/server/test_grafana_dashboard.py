"""The Grafana dashboard and docs/prometheus.md query only what the server exports, by the names it exports.

The exported names and labels come from `prometheus.render` itself, over every simulated scenario with every kind of
holder, so a renamed metric or label fails here instead of leaving an empty panel. The helpers that read the
queries out of the dashboard and the docs live in tests/fixtures/prometheus_docs.py, shared with
test_real_prometheus.py, which runs them all.
"""

from __future__ import annotations

import re
from dataclasses import replace
from functools import cache

from prometheus_docs import (
    DOCS,
    alert_rules,
    dashboard,
    dashboard_queries,
    documented_queries,
    template_queries,
)

from jupyter_gpu.metrics.backends.simulated import SCENARIOS, SimulatedBackend
from jupyter_gpu.metrics.sample import GpuProcess, Sample
from jupyter_gpu.server.attribution import ProcessInfo, attribute
from jupyter_gpu.server.kernels import KernelInfo
from jupyter_gpu.server.prometheus import render

DATASOURCE = "${DS_PROMETHEUS}"
# What Prometheus adds itself: the `up` series of every target, and the target's `job` and `instance` labels.
PROMETHEUS_SERIES = {"up": {"job", "instance"}}
TARGET_LABELS = {"job", "instance"}
PROMQL_FUNCTIONS = {"sum", "avg", "max", "min", "count", "topk", "sort_desc", "avg_over_time", "max_over_time",
                    "min_over_time", "time", "vector"}
PROMQL_KEYWORDS = {"and", "or", "unless"}
SAMPLE_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? \S+$")
LABEL_NAME = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="')
STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
SELECTOR = re.compile(r"(?P<name>\b[a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{(?P<matchers>[^}]*)\}")
MATCHER_NAME = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
IDENTIFIER = re.compile(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b(\s*\()?")


def _text_with_every_holder_kind(sample: Sample) -> str:
    """A notebook's kernel, the server user's own program and another user's process, all on the first GPU."""
    kernel_pid, own_pid, others_pid, server_uid = 101, 102, 103, 1000
    if sample.devices:
        first = replace(sample.devices[0], processes=(GpuProcess(kernel_pid, 2**30), GpuProcess(own_pid, 2**20),
                                                      GpuProcess(others_pid, 2**20)))
        sample = replace(sample, devices=(first, *sample.devices[1:]))
    processes = {kernel_pid: ProcessInfo(kernel_pid, 1, server_uid, "python"),
                 own_pid: ProcessInfo(own_pid, 1, server_uid, "train"),
                 others_pid: ProcessInfo(others_pid, 1, server_uid + 1, "serve")}
    kernels = [KernelInfo("k1", "python3", kernel_pid, "idle", 0.0, None, ("a.ipynb",))]
    return render(sample, attribute(sample, kernels, processes.get, server_uid))


@cache
def exported_series() -> dict[str, frozenset[str]]:
    """Every metric name the server writes, with every label it puts on it."""
    texts = [render(None, [])] + [_text_with_every_holder_kind(SimulatedBackend(name).read()) for name in SCENARIOS]
    labels: dict[str, set[str]] = {}
    for line in "\n".join(texts).splitlines():
        if line.startswith("# TYPE "):
            labels.setdefault(line.split()[2], set())
        elif not line.startswith("#") and (match := SAMPLE_LINE.match(line)):
            labels.setdefault(match["name"], set()).update(LABEL_NAME.findall(match["labels"] or ""))
    return {name: frozenset(names) for name, names in labels.items()}


def _names_used(expr: str) -> tuple[dict[str, set[str]], set[str], set[str]]:
    """(label names matched per metric selector, labels grouped on, functions called) in one PromQL expression."""
    expr = re.sub(r"\[[^\]]*\]", "", STRING.sub('""', expr))  # strings and range durations name nothing
    grouped = {label.strip() for clause in GROUPING.findall(expr) for label in clause.split(",") if label.strip()}
    expr = GROUPING.sub(" ", expr)
    selectors: dict[str, set[str]] = {}
    for match in SELECTOR.finditer(expr):
        selectors.setdefault(match["name"] or "", set()).update(MATCHER_NAME.findall(match["matchers"]))
    expr = SELECTOR.sub(lambda m: f" {m['name'] or ''} ", expr)
    functions = set()
    for match in IDENTIFIER.finditer(expr):
        name = match.group(0).rstrip("( \t\n")
        if name in PROMQL_KEYWORDS:  # `and (...)` once its `on (...)` is gone: not a call
            continue
        if match.group(1):
            functions.add(name)
        else:
            selectors.setdefault(name, set())
    return selectors, grouped, functions


def _problems(expr: str, functions_allowed: set[str]) -> list[str]:
    known = {**exported_series(), **PROMETHEUS_SERIES}
    every_label = set().union(*known.values()) | TARGET_LABELS
    selectors, grouped, functions = _names_used(expr)
    problems = [f"metric {name!r}" for name in selectors if name and name not in known]
    if "" in selectors:
        problems.append("a selector without a metric name")
    problems += [f"label {label!r} on {name}" for name, labels in selectors.items() if name in known
                 for label in labels - known[name] - TARGET_LABELS]
    problems += [f"grouping label {label!r}" for label in grouped - every_label]
    problems += [f"function {name!r}" for name in functions - functions_allowed]
    if not any(name.startswith("jupyter_gpu_") or name in PROMETHEUS_SERIES for name in selectors):
        problems.append("no metric at all")
    return problems


def test_the_exported_names_are_read_from_the_server_s_own_text() -> None:
    series = exported_series()
    assert series["jupyter_gpu_holder_memory_bytes"] == {"gpu", "kind", "kernel_id", "notebook", "program"}
    assert series["jupyter_gpu_up"] == {"backend", "simulated"}
    assert series["jupyter_gpu_throttled"] == {"gpu", "uuid", "name"}
    assert all(name.startswith("jupyter_gpu_") for name in series)


def test_the_checker_catches_a_wrong_metric_label_or_function() -> None:
    assert _problems('sum by (instance, notebook) (jupyter_gpu_holder_memory_bytes{kind="kernel"})',
                     PROMQL_FUNCTIONS) == []
    assert _problems("jupyter_gpu_memory_used", PROMQL_FUNCTIONS) == ["metric 'jupyter_gpu_memory_used'"]
    assert _problems('jupyter_gpu_throttled{notebook="a"}', PROMQL_FUNCTIONS) == [
        "label 'notebook' on jupyter_gpu_throttled"]
    assert _problems("sum by (node) (jupyter_gpu_up)", PROMQL_FUNCTIONS) == ["grouping label 'node'"]
    assert _problems("rate(jupyter_gpu_up[5m])", PROMQL_FUNCTIONS) == ["function 'rate'"]


def test_every_dashboard_query_uses_exported_metrics_and_labels() -> None:
    queries = dashboard_queries()
    assert len(queries) >= 15
    problems = {expr: found for expr in queries if (found := _problems(expr, PROMQL_FUNCTIONS))}
    assert problems == {}
    for query in template_queries():
        # Grafana's own `label_values(metric, label)`, not PromQL.
        metric, label = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query).groups()
        assert label in exported_series()[metric] | TARGET_LABELS, query
    used = {name for expr in queries for name in _names_used(expr)[0]}
    # Every figure the server exports has a panel (the timestamp is for the stale-reading alert).
    assert set(exported_series()) - used == {"jupyter_gpu_sample_timestamp_seconds"}


def test_every_documented_query_and_alert_uses_exported_metrics_and_labels() -> None:
    queries = documented_queries()
    rules = alert_rules()
    assert len(queries) >= 9 and len(rules) >= 6
    problems = {expr: found for expr in queries + [rule["expr"] for rule in rules]
                if (found := _problems(expr, PROMQL_FUNCTIONS))}
    assert problems == {}
    every_label = set().union(*exported_series().values()) | TARGET_LABELS
    templated = {label for rule in rules for text in rule["annotations"].values()
                 for label in re.findall(r"\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)", text)}
    assert templated and templated <= every_label


def test_the_docs_name_every_exported_metric_and_no_other() -> None:
    table_rows = [line for line in DOCS.read_text().splitlines() if line.startswith("| `jupyter_gpu_")]
    documented = {re.match(r"\| `(jupyter_gpu_[a-z_]+)`", row)[1] for row in table_rows}
    mentioned = set(re.findall(r"\bjupyter_gpu_[a-z_]+\b", DOCS.read_text()))
    assert documented == set(exported_series()) - {"jupyter_gpu_holder_memory_bytes"}  # that one has its own table
    assert mentioned == set(exported_series())


def test_the_dashboard_is_an_importable_grafana_dashboard() -> None:
    board = dashboard()
    assert board["schemaVersion"] >= 36 and board["title"] and board["uid"]
    assert [(i["name"], i["type"], i["pluginId"]) for i in board["__inputs"]] == [
        ("DS_PROMETHEUS", "datasource", "prometheus")]
    panels = board["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        assert panel["type"] in {"stat", "timeseries", "table"} and panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": DATASOURCE}
        x, y, w, h = (panel["gridPos"][key] for key in ("x", "y", "w", "h"))
        assert x >= 0 and x + w <= 24 and w > 0 and h > 0, panel["title"]
        area = {(col, row) for col in range(x, x + w) for row in range(y, y + h)}
        assert not area & cells, f"{panel['title']!r} overlaps another panel"
        cells |= area
        refs = [target["refId"] for target in panel["targets"]]
        assert refs and len(set(refs)) == len(refs)
        assert all(target["datasource"]["uid"] == DATASOURCE and target["expr"] for target in panel["targets"])
    variables = {variable["name"] for variable in board["templating"]["list"]}
    used = {name for panel in panels for target in panel["targets"] for name in re.findall(r"\$(\w+)", target["expr"])}
    assert used == variables == {"instance"}
    legends = {label for panel in panels for target in panel["targets"]
               for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", ""))}
    assert legends <= set().union(*exported_series().values()) | TARGET_LABELS
