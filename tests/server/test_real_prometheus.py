"""A real Prometheus scrapes a real JupyterLab's /jupyter-gpu/metrics, as docs/prometheus.md tells a cluster to.

One Prometheus (Debian's package, installed here when running as root, as CI does) scrapes the session's JupyterLab
with eight simulated A100s under the JupyterHub-style base URL /user/alice/, every second, four ways: the docs'
one-server job (Bearer token from a file), the docs' JupyterHub job (targets in a file_sd file with their own path
and instance), the README's `type: token` header, and no token at all. A notebook's kernel holds simulated memory
on GPU 4. The docs' alert rules are loaded, and every query of the docs and the Grafana dashboard is run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from lab_server import TOKEN, LabServer, free_port
from prometheus_docs import (
    alert_rules,
    dashboard_queries,
    documented_alert_rules,
    documented_queries,
    fenced_blocks,
)

from jupyter_gpu.metrics.sample import Sample
from jupyter_gpu.server.prometheus import render

INSTALL = ("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
           "prometheus")
POLICY_RC = Path("/usr/sbin/policy-rc.d")
NOTEBOOK = "prometheus/scraped.ipynb"
HELD_GPU, HELD_BYTES = 4, 3 * 2**30  # GPU 4 of the a100x8-mig scenario idles at 0-2 % utilisation
THROTTLED_GPU = "6"  # held at its power limit in that scenario
SERVER_PATH = "/user/alice/"  # the lab_a100 fixture's base URL
JOBS_UP = ("jupyter-gpu", "jupyter-gpu-hub", "jupyter-gpu-token-header")
JOB_WITHOUT_TOKEN = "jupyter-gpu-no-token"
WAIT_S = 30.0
EXPOSITION_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
EXPOSITION_ESCAPE = re.compile(r"\\(.)")


def _install_prometheus() -> None:
    """Debian's package, without letting its maintainer script start the daemon: the test runs the binary itself."""
    if subprocess.run(["apt-cache", "show", "prometheus"], capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True, timeout=300)
    # The package's postinst starts /etc/init.d/prometheus (listening on :9090) unless policy-rc.d forbids it;
    # 101 is "action forbidden". Someone else's policy file is left as it is.
    added_policy = not POLICY_RC.exists()
    if added_policy:
        POLICY_RC.write_text("#!/bin/sh\nexit 101\n")
        POLICY_RC.chmod(0o755)
    try:
        result = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "prometheus"],
                                capture_output=True, text=True, timeout=600,
                                env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    finally:
        if added_policy:
            POLICY_RC.unlink()
    if result.returncode != 0:
        pytest.fail(f"`{INSTALL}` failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")


def prometheus_binary() -> str:
    found = shutil.which("prometheus") or ("/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None)
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip(f"needs Prometheus: install Debian's package (`sudo sh -c '{INSTALL}'`) or put `prometheus` on "
                    "PATH, then run this test again")
    _install_prometheus()
    return shutil.which("prometheus") or "/usr/bin/prometheus"


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def get(self, path: str, **params: str | float) -> Any:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as reply:
                payload = json.load(reply)
        except urllib.error.HTTPError as error:
            # Until its storage is open Prometheus answers every API call with a plain-text 503; the caller
            # polling for readiness treats that like a refused connection (HTTPError is an OSError).
            if error.code == 503:
                raise
            payload = json.load(error)
        assert payload["status"] == "success", f"{path} {params}: {payload}"
        return payload["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        return self.get("/api/v1/query", query=expr, **({} if at is None else {"time": at}))["result"]

    def wait_for(self, what: str, found: Callable[[], Any]) -> Any:
        """Poll until `found()` is truthy: the first scrapes and rule evaluations take a few seconds."""
        deadline = time.monotonic() + WAIT_S
        while not (value := found()):
            assert self.process.poll() is None, f"Prometheus exited:\n{self.log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"{what} within {WAIT_S:g} s; log:\n{self.log.read_text()[-3000:]}"
            time.sleep(0.25)
        return value


def _config(workdir: Path, port: int) -> Path:
    token_file = workdir / "jupyter-token"
    token_file.write_text(TOKEN + "\n")  # a trailing newline, as `echo` writes: Prometheus strips it
    hub_targets = workdir / "jupyterhub-servers.json"
    hub_targets.write_text(json.dumps([{"targets": [f"127.0.0.1:{port}"], "labels": {
        "__metrics_path__": f"{SERVER_PATH}jupyter-gpu/metrics", "instance": "alice", "user": "alice"}}]))
    (workdir / "jupyter-gpu-alerts.yml").write_text(documented_alert_rules())
    target = [{"targets": [f"127.0.0.1:{port}"]}]
    path = f"{SERVER_PATH}jupyter-gpu/metrics"
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": ["jupyter-gpu-alerts.yml"],
        "scrape_configs": [
            {"job_name": "jupyter-gpu", "metrics_path": path, "static_configs": target,
             "authorization": {"type": "Bearer", "credentials_file": str(token_file)}},
            {"job_name": "jupyter-gpu-hub", "follow_redirects": False,
             "file_sd_configs": [{"files": [str(hub_targets)]}],
             "authorization": {"type": "Bearer", "credentials_file": str(token_file)}},
            {"job_name": "jupyter-gpu-token-header", "metrics_path": path, "static_configs": target,
             "authorization": {"type": "token", "credentials": TOKEN}},
            {"job_name": JOB_WITHOUT_TOKEN, "metrics_path": path, "static_configs": target},
        ],
    }
    config_file = workdir / "prometheus.yml"
    config_file.write_text(json.dumps(config, indent=2))  # JSON is YAML
    return config_file


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def prometheus_bin() -> str:
    return prometheus_binary()


@pytest.fixture(scope="module")
def lab(prometheus_bin: str, request: pytest.FixtureRequest) -> LabServer:
    """The session's JupyterLab (conftest's lab_a100), started only once there is a Prometheus to scrape it."""
    return request.getfixturevalue("lab_a100")


@pytest.fixture(scope="module")
def notebook(lab: LabServer) -> Iterator[dict[str, Any]]:
    """A notebook whose kernel holds 3 GiB of GPU 4, seen by the server before Prometheus starts."""
    session = lab.new_notebook(NOTEBOOK)
    pid = lab.kernel_pid(session["kernel"]["id"])
    lab.hold_memory(pid, "3GiB", device=HELD_GPU)
    lab.wait_for_metrics(lambda payload: any(h["paths"] == [NOTEBOOK] for h in payload["holders"]))
    yield session
    assert lab.request(f"api/sessions/{session['id']}", method="DELETE").status == 204


@pytest.fixture(scope="module")
def prometheus(prometheus_bin: str, notebook: dict[str, Any], lab: LabServer,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    workdir = tmp_path_factory.mktemp("prometheus")
    config = _config(workdir, urllib.parse.urlsplit(lab.base).port or 80)
    port = free_port()
    log = workdir / "prometheus.log"
    with log.open("wb") as out:
        argv = [prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}"]
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    server = Prometheus(f"http://127.0.0.1:{port}", process, log)
    try:
        def every_target_scraped() -> bool:
            try:
                targets = server.get("/api/v1/targets")["activeTargets"]
            except OSError:  # not listening yet, or listening but not ready (503)
                return False
            return len(targets) == 4 and all(t["health"] != "unknown" for t in targets)

        server.wait_for("every target scraped once", every_target_scraped)
        yield server
    finally:
        _stop(process)
        # Prometheus runs no children: once it has exited and been reaped, nothing of it is left.
        assert process.returncode is not None and not Path(f"/proc/{process.pid}").exists()
        assert not _processes_with(str(config)), "a Prometheus process outlived the test"


def _processes_with(argument: str) -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if argument.encode() in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:  # exited while we looked
            continue
    return pids


def _series(result: list[dict[str, Any]]) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(r["metric"]["__name__"], frozenset((k, v) for k, v in r["metric"].items()
                                                if k not in ("__name__", "job", "instance"))): float(r["value"][1])
            for r in result}


def _rendered(sample: Sample) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """What the server exported for `sample`, as the same (name, labels) -> value (holders and their idle time
    aside: the next tests check those)."""
    out = {}
    for line in render(sample, []).splitlines():
        if line.startswith(("#", "jupyter_gpu_holder_memory_bytes", "jupyter_gpu_kernel_idle_seconds")):
            continue
        series, value = line.rsplit(" ", 1)
        name = series.partition("{")[0]
        labels = {key: EXPOSITION_ESCAPE.sub(lambda m: {"n": "\n"}.get(m[1], m[1]), raw)
                  for key, raw in EXPOSITION_LABEL.findall(series)}
        out[(name, frozenset(labels.items()))] = float(value)
    return out


def test_with_the_token_every_gpu_gauge_is_the_reading_the_server_took(prometheus: Prometheus, lab: LabServer) -> None:
    # One evaluation time, a little in the past: every series' newest point is then from the same finished scrape.
    selector = ('{job="jupyter-gpu", __name__=~"jupyter_gpu_.*", '
                '__name__!~"jupyter_gpu_holder_memory_bytes|jupyter_gpu_kernel_idle_seconds"}')

    def scraped() -> list[dict[str, Any]] | None:
        result = prometheus.query(selector, at=time.time() - 1.5)
        names = {r["metric"]["__name__"] for r in result}
        return result if "jupyter_gpu_sample_timestamp_seconds" in names else None

    result = prometheus.wait_for("the GPU gauges", scraped)
    series = _series(result)
    (stamp,) = [value for (name, _), value in series.items() if name == "jupyter_gpu_sample_timestamp_seconds"]
    payload = lab.request("jupyter-gpu/api/metrics").json()
    (reading,) = [s for s in payload["history"] + [payload["latest"]] if s["timestamp"] == stamp]
    assert series == _rendered(Sample.from_dict(reading))
    assert series[("jupyter_gpu_up", frozenset({("backend", "simulated:a100x8-mig"), ("simulated", "true")}))] == 1
    memory = {dict(labels)["gpu"]: value for (name, labels), value in series.items()
              if name == "jupyter_gpu_memory_total_bytes"}
    assert sorted(memory) == [str(i) for i in range(8)] and set(memory.values()) == {80 * 2**30}
    # MIG boards (0, 1) report no utilisation: no series, not a 0.
    assert {dict(labels)["gpu"] for (name, labels) in series if name == "jupyter_gpu_utilization_percent"} == {
        "2", "3", "4", "5", "6", "7"}


def test_the_memory_a_notebook_holds_is_scraped_with_its_notebook_and_kernel(prometheus: Prometheus,
                                                                             notebook: dict[str, Any]) -> None:
    for job, instance in (("jupyter-gpu", None), ("jupyter-gpu-hub", "alice")):
        selector = f'jupyter_gpu_holder_memory_bytes{{job="{job}", notebook="{NOTEBOOK}"}}'
        (row,) = prometheus.wait_for(f"{NOTEBOOK}'s memory in job {job}", lambda s=selector: prometheus.query(s))
        labels = row["metric"]
        assert (labels["gpu"], labels["kind"], labels["kernel_id"]) == (str(HELD_GPU), "kernel",
                                                                         notebook["kernel"]["id"])
        assert float(row["value"][1]) == HELD_BYTES
        if instance is not None:
            assert labels["instance"] == instance


def test_the_kernel_holding_memory_is_scraped_with_its_idle_seconds_under_the_same_labels(
        prometheus: Prometheus, notebook: dict[str, Any]) -> None:
    selector = f'{{job="jupyter-gpu", notebook="{NOTEBOOK}"}}'
    idle_query = f"jupyter_gpu_kernel_idle_seconds{selector}"
    (first,) = prometheus.wait_for("the kernel's idle seconds", lambda: prometheus.query(idle_query))
    (memory,) = prometheus.query(f"jupyter_gpu_holder_memory_bytes{selector}")
    assert {k: v for k, v in first["metric"].items() if k != "__name__"} == {
        k: v for k, v in memory["metric"].items() if k != "__name__"}
    assert first["metric"]["kernel_id"] == notebook["kernel"]["id"]
    # It counts on while the kernel runs nothing: a later scrape says more.
    later = prometheus.wait_for("a later idle figure", lambda: [
        r for r in prometheus.query(idle_query) if float(r["value"][1]) >= float(first["value"][1]) + 1.5])
    assert len(later) == 1


FORGOTTEN_KERNEL_TEST = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # A notebook left open over lunch: 3 GiB on GPU 0, idle from minute 0, one minute more each minute.
      - series: 'jupyter_gpu_holder_memory_bytes{forgotten}'
        values: '3221225472x60'
      - series: 'jupyter_gpu_kernel_idle_seconds{forgotten}'
        values: '0+60x60'
      # A notebook whose kernel runs a cell every 20 minutes holds memory too, and is never forgotten.
      - series: 'jupyter_gpu_holder_memory_bytes{at_work}'
        values: '8589934592x60'
      - series: 'jupyter_gpu_kernel_idle_seconds{at_work}'
        values: '0+60x19 0+60x19 0+60x19'
    alert_rule_test:
      - eval_time: 30m
        alertname: JupyterGpuForgottenKernel
        exp_alerts: []
      - eval_time: 31m
        alertname: JupyterGpuForgottenKernel
        exp_alerts: &forgotten_only
          - exp_labels: {{severity: warning, instance: gpu-node-1, gpu: "0", kernel_id: k1, notebook: forgotten.ipynb}}
            exp_annotations:
              summary: '{summary}'
              description: '{description}'
      - eval_time: 59m
        alertname: JupyterGpuForgottenKernel
        exp_alerts: *forgotten_only
"""


def test_the_forgotten_kernel_alert_goes_off_after_30_idle_minutes_and_never_for_a_kernel_at_work(
        prometheus_bin: str, tmp_path: Path) -> None:
    """`promtool test rules` (Prometheus' own rule evaluator) plays an hour of two kernels' series through the
    documented rule: one left idle, one that runs a cell every 20 minutes."""
    rules = tmp_path / "jupyter-gpu-alerts.yml"
    rules.write_text(documented_alert_rules())
    (rule,) = [rule for rule in alert_rules() if rule["alert"] == "JupyterGpuForgottenKernel"]
    summary = (rule["annotations"]["summary"].replace("{{ $labels.notebook }}", "forgotten.ipynb")
               .replace("{{ $labels.instance }}", "gpu-node-1").replace("{{ $value | humanize1024 }}", "3Gi")
               .replace("{{ $labels.gpu }}", "0"))
    test = tmp_path / "forgotten-kernel-test.yml"
    labels = '{{instance="gpu-node-1",job="jupyter-gpu",gpu="{}",kind="kernel",kernel_id="{}",notebook="{}"}}'
    test.write_text(FORGOTTEN_KERNEL_TEST.format(rules=rules.name, summary=summary.replace("'", "''"),
                                                 forgotten=labels.format(0, "k1", "forgotten.ipynb"),
                                                 at_work=labels.format(1, "k2", "training.ipynb"),
                                                 description=rule["annotations"]["description"].replace("'", "''")))
    promtool = str(Path(prometheus_bin).with_name("promtool"))
    result = subprocess.run([promtool, "test", "rules", test.name], capture_output=True, text=True, timeout=60,
                            cwd=tmp_path)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def test_without_the_token_the_target_is_down_with_a_403_and_with_either_header_it_is_up(
        prometheus: Prometheus) -> None:
    targets = {t["labels"]["job"]: t for t in prometheus.get("/api/v1/targets")["activeTargets"]}
    assert sorted(targets) == sorted((*JOBS_UP, JOB_WITHOUT_TOKEN))
    refused = targets[JOB_WITHOUT_TOKEN]
    assert refused["health"] == "down" and "403" in refused["lastError"], refused
    assert {job: (targets[job]["health"], targets[job]["lastError"]) for job in JOBS_UP} == {
        job: ("up", "") for job in JOBS_UP}
    assert targets["jupyter-gpu-hub"]["scrapeUrl"].endswith(f"{SERVER_PATH}jupyter-gpu/metrics")
    assert targets["jupyter-gpu-hub"]["labels"]["instance"] == "alice"


def test_the_documented_alert_rules_load_and_go_off_for_what_they_describe(prometheus: Prometheus) -> None:
    documented = [rule["alert"] for rule in alert_rules()]

    def evaluated() -> list[dict[str, Any]] | None:
        rules = [rule for group in prometheus.get("/api/v1/rules")["groups"] for rule in group["rules"]]
        return rules if rules and all(rule["health"] != "unknown" for rule in rules) else None

    rules = prometheus.wait_for("every rule evaluated", evaluated)
    assert [rule["name"] for rule in rules] == documented
    assert {rule["name"]: (rule["health"], rule.get("lastError", "")) for rule in rules} == {
        name: ("ok", "") for name in documented}
    expected = {("JupyterGpuScrapeDown", "pending", "job", JOB_WITHOUT_TOKEN),
                ("JupyterGpuThrottled", "pending", "gpu", THROTTLED_GPU),
                ("JupyterGpuIdleKernelHoldsMemory", "pending", "notebook", NOTEBOOK),
                ("JupyterGpuSimulatedBackend", "firing", "backend", "simulated:a100x8-mig")}

    def active() -> set[tuple[str, str, str, str]] | None:
        alerts = prometheus.get("/api/v1/alerts")["alerts"]
        seen = {(a["labels"]["alertname"], a["state"], key, a["labels"].get(key)) for a in alerts
                for key in ("job", "gpu", "notebook", "backend")}
        return seen if expected <= seen else None

    seen = prometheus.wait_for(f"the alerts {sorted(expected)}", active)
    # The notebook's kernel has run nothing for seconds, not 30 minutes (promtool below plays the 30 minutes).
    assert not {alert for alert in seen if alert[0] in ("JupyterGpuLost", "JupyterGpuMetricsUnavailable",
                                                        "JupyterGpuForgottenKernel")}


def test_every_documented_and_dashboard_query_runs_in_prometheus(prometheus: Prometheus) -> None:
    queries = documented_queries() + dashboard_queries()
    results = {expr: prometheus.query(expr) for expr in queries}  # get() asserts "success": no parse or type error
    # "Idle for more than 30 minutes": the notebook's kernel has been idle for seconds, so not yet; with the
    # threshold at 0 the same query finds it, with the memory it holds.
    forgotten = [expr for expr in results if re.search(r"jupyter_gpu_kernel_idle_seconds(\{[^}]*\})? > 30 \* 60", expr)]
    assert len(forgotten) == 2  # the docs' query and the dashboard's panel
    for expr in forgotten:
        assert not any(r["metric"].get("notebook") == NOTEBOOK for r in results[expr])
        now = prometheus.wait_for(f"{NOTEBOOK} in {expr} at 0 s", lambda e=expr: [
            r for r in prometheus.query(e.replace("30 * 60", "0")) if r["metric"].get("notebook") == NOTEBOOK])
        # Two of the jobs scrape the server under one instance name, which the query's sum adds up.
        assert sorted(float(r["value"][1]) for r in now) == [HELD_BYTES, 2 * HELD_BYTES]
    # What they are about: the notebook's memory, per notebook and on idle GPUs (not the stat panels' totals).
    per_notebook = [expr for expr in results if re.search(r"by \([^)]*notebook", expr) and not expr.startswith("sum(")
                    and expr not in forgotten]
    assert len(per_notebook) >= 4
    assert [expr for expr in per_notebook
            if not any(r["metric"].get("notebook") == NOTEBOOK for r in results[expr])] == []
    throttled = results["jupyter_gpu_throttled == 1"]
    assert {r["metric"]["gpu"] for r in throttled if r["metric"]["job"] == "jupyter-gpu"} == {THROTTLED_GPU}


def test_the_documented_scrape_configs_pass_promtool(prometheus_bin: str, tmp_path: Path) -> None:
    """promtool also checks that the token files and the file_sd file exist and parse: they are laid out in tmp."""
    promtool = str(Path(prometheus_bin).with_name("promtool"))
    (file_sd,) = fenced_blocks("json")
    configs = [block for block in fenced_blocks("yaml") if "scrape_configs" in yaml.safe_load(block)]
    assert len(configs) == 2  # one server, JupyterHub
    for index, block in enumerate(configs):
        for path in set(re.findall(r"/etc/prometheus/[\w.-]+", block)):
            local = tmp_path / Path(path).name
            local.write_text(file_sd if local.suffix == ".json" else TOKEN)
            block = block.replace(path, str(local))
        config = tmp_path / f"prometheus-{index}.yml"
        config.write_text(block)
        result = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr
