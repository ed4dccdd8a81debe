"""The rings hold: no import cycles inside the package, pure modules stay pure, the probe layer imports no surface.

The import graph is built from the code (every `import` statement, those inside functions and `if TYPE_CHECKING:`
blocks included), not from what one run happens to import, so a deferred import cannot hide a cycle.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "jupyter_gpu"

# Ring 1: pure Python. They may import each other and the standard library, nothing from the outside world.
PURE = [
    "jupyter_gpu", "jupyter_gpu.version", "jupyter_gpu.models", "jupyter_gpu.rendering", "jupyter_gpu.rendering.units",
    "jupyter_gpu.rendering.kit",
    "jupyter_gpu.torch_errors", "jupyter_gpu.torch_errors.oom", "jupyter_gpu.torch_errors.mismatch",
    "jupyter_gpu.memory_growth", "jupyter_gpu.cell_usage",
    "jupyter_gpu.gpucells", "jupyter_gpu.gpucells.result", "jupyter_gpu.gpucells.log", "jupyter_gpu.gpucells.render",
    "jupyter_gpu.device_uuid", "jupyter_gpu.atomic_write",
    "jupyter_gpu.autoload.config", "jupyter_gpu.autoload.notice",
    "jupyter_gpu.gpucheck.report", "jupyter_gpu.gpucheck.render", "jupyter_gpu.gpucheck.request",
    "jupyter_gpu.gpucheck.diagnose.engine", "jupyter_gpu.gpucheck.diagnose.device_rules",
    "jupyter_gpu.gpucheck.diagnose.host_rules", "jupyter_gpu.gpucheck.diagnose.install_rules",
    "jupyter_gpu.gpucheck.diagnose.usage", "jupyter_gpu.gpucheck.diagnose.view",
    "jupyter_gpu.gpucheck.diagnose.visibility", "jupyter_gpu.gpucheck.diagnose.wheels",
    "jupyter_gpu.gpucheck.diagnose.fixes", "jupyter_gpu.gpucheck.diagnose.stack",
    "jupyter_gpu.gpucheck.diagnose.companion_rules", "jupyter_gpu.gpucheck.diagnose.activity_rules",
    "jupyter_gpu.gpucheck.diagnose.nvml_classes",
    "jupyter_gpu.gputime.stats", "jupyter_gpu.gputime.ops", "jupyter_gpu.gputime.result",
    "jupyter_gpu.gputime.advice", "jupyter_gpu.gputime.render", "jupyter_gpu.gputime.compare",
    "jupyter_gpu.batchprobe.search", "jupyter_gpu.batchprobe.oom", "jupyter_gpu.batchprobe.result",
    "jupyter_gpu.batchprobe.render", "jupyter_gpu.batchprobe.estimate_result", "jupyter_gpu.batchprobe.estimate_render",
    "jupyter_gpu.probekit.user_line", "jupyter_gpu.probekit.library_code", "jupyter_gpu.probekit.ticker",
    "jupyter_gpu.probekit",
    "jupyter_gpu.probekit.exceptions", "jupyter_gpu.probekit.device_memory",
    "jupyter_gpu.gpuprofile", "jupyter_gpu.gpuprofile.peaks", "jupyter_gpu.gpuprofile.result",
    "jupyter_gpu.gpuprofile.timeline", "jupyter_gpu.gpuprofile.plan", "jupyter_gpu.gpuprofile.lift",
    "jupyter_gpu.gpuprofile.render", "jupyter_gpu.gpuprofile.request",
    "jupyter_gpu.dataprobe", "jupyter_gpu.dataprobe.settings", "jupyter_gpu.dataprobe.result",
    "jupyter_gpu.dataprobe.decide", "jupyter_gpu.dataprobe.render",
    "jupyter_gpu.speedprobe", "jupyter_gpu.speedprobe.catalog", "jupyter_gpu.speedprobe.result",
    "jupyter_gpu.speedprobe.decide", "jupyter_gpu.speedprobe.render", "jupyter_gpu.gpucheck.diagnose.worker_rules",
    "jupyter_gpu.snapshot", "jupyter_gpu.snapshot.paths", "jupyter_gpu.snapshot.schedulers",
    "jupyter_gpu.gputime.compiled",
    "jupyter_gpu.gpumem", "jupyter_gpu.gpumem.result", "jupyter_gpu.gpumem.reconcile", "jupyter_gpu.gpumem.history",
    "jupyter_gpu.gpumem.render", "jupyter_gpu.gpumem.collector",
    "jupyter_gpu.distributed", "jupyter_gpu.distributed.links", "jupyter_gpu.distributed.readiness",
    "jupyter_gpu.distributed.report", "jupyter_gpu.distributed.render", "jupyter_gpu.distributed.topology",
    "jupyter_gpu.distributed.topology_rules",
    "jupyter_gpu.distributed.topology_render", "jupyter_gpu.distributed.collective",
    "jupyter_gpu.distributed.collective_render",
    "jupyter_gpu.ddpprofile", "jupyter_gpu.ddpprofile.analyse", "jupyter_gpu.ddpprofile.mistakes",
    "jupyter_gpu.ddpprofile.plan", "jupyter_gpu.ddpprofile.result", "jupyter_gpu.ddpprofile.render",
    "jupyter_gpu.metrics.sample", "jupyter_gpu.metrics.alerts", "jupyter_gpu.metrics.sampler",
    "jupyter_gpu.metrics.recording", "jupyter_gpu.metrics.recorder", "jupyter_gpu.metrics.backends.base",
    "jupyter_gpu.server.attribution", "jupyter_gpu.server.prometheus", "jupyter_gpu.server.kernels",
    "jupyter_gpu.server.series",
]
OUTSIDE_WORLD = ["torch", "pynvml", "IPython", "ipywidgets", "tornado", "jupyter_server", "matplotlib", "numpy"]

# Ring 2, the probe layer: the only code that touches torch, NVML, /proc and subprocesses. It serves surfaces
# and must never reach up into one.
PROBE_PREFIXES = ["jupyter_gpu.facts", "jupyter_gpu.metrics.backends.nvml",
                  "jupyter_gpu.metrics.backends.simulated", "jupyter_gpu.metrics.backends.replay",
                  "jupyter_gpu.metrics.backends.claims", "jupyter_gpu.metrics.backends.select",
                  "jupyter_gpu.metrics.hub", "jupyter_gpu.server.processes", "jupyter_gpu.kernel_torch",
                  "jupyter_gpu.gputime.opcount", "jupyter_gpu.gputime.availability",
                  "jupyter_gpu.gputime.busy", "jupyter_gpu.gputime.runner", "jupyter_gpu.batchprobe.budget",
                  "jupyter_gpu.probekit.clock", "jupyter_gpu.probekit.cell_meter",
                  "jupyter_gpu.probekit.training_state", "jupyter_gpu.probekit.release",
                  "jupyter_gpu.probekit.storages", "jupyter_gpu.batchprobe.holders",
                  "jupyter_gpu.batchprobe.estimate", "jupyter_gpu.batchprobe.runner", "jupyter_gpu.gpucheck.run",
                  "jupyter_gpu.autoload.install", "jupyter_gpu.autoload.startup", "jupyter_gpu.dataprobe.loaders",
                  "jupyter_gpu.dataprobe.measure", "jupyter_gpu.dataprobe.pitfalls", "jupyter_gpu.dataprobe.runner",
                  "jupyter_gpu.speedprobe.flags", "jupyter_gpu.speedprobe.variants", "jupyter_gpu.speedprobe.measure",
                  "jupyter_gpu.speedprobe.runner", "jupyter_gpu.gpumem.roots", "jupyter_gpu.gpumem.graph",
                  "jupyter_gpu.gpumem.caches", "jupyter_gpu.gpumem.walk", "jupyter_gpu.gpumem.allocator",
                  "jupyter_gpu.gpumem.free",
                  "jupyter_gpu.gpumem.watch", "jupyter_gpu.gpumem.runner", "jupyter_gpu.distributed.host_facts",
                  "jupyter_gpu.distributed.launch_facts", "jupyter_gpu.distributed.gather",
                  "jupyter_gpu.distributed.runner", "jupyter_gpu.distributed.nvml_topology",
                  "jupyter_gpu.distributed.simulated_topology",
                  "jupyter_gpu.distributed.allreduce", "jupyter_gpu.distributed.allreduce_worker",
                  "jupyter_gpu.gpuprofile.instrument", "jupyter_gpu.gpuprofile.census",
                  "jupyter_gpu.gpuprofile.ceiling", "jupyter_gpu.gpuprofile.batches", "jupyter_gpu.gpuprofile.runner",
                  "jupyter_gpu.gpuprofile.apply", "jupyter_gpu.gpuprofile.assemble"]
SURFACE_PREFIXES = ["jupyter_gpu.magics", "jupyter_gpu.widgets", "jupyter_gpu.server.extension",
                    "jupyter_gpu.server.handlers", "jupyter_gpu.cli", "jupyter_gpu.autoload.extension"]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py") if "labextension" not in p.parts}


def imported(name: str, path: Path) -> set[str]:
    """The package's modules that `name` imports anywhere in its code."""
    known = modules()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


@cache
def graph() -> dict[str, frozenset[str]]:
    return {name: frozenset(imported(name, path)) for name, path in modules().items()}


def cycles(edges: dict[str, frozenset[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def within(name: str, prefixes: list[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in graph()[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_the_graph_is_built_from_the_code() -> None:
    # Guards the test itself: deferred and TYPE_CHECKING imports are seen, and `from pkg import mod` names mod.
    assert "jupyter_gpu.magics.gpucheck" in graph()["jupyter_gpu.magics"]  # inside magic_classes()
    assert "jupyter_gpu.gpucheck.gate" in graph()["jupyter_gpu"]  # `from jupyter_gpu.gpucheck import gate`
    assert cycles({"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset()}) == [
        ["a", "b", "c"]]


def test_there_is_no_import_cycle_in_the_package() -> None:
    assert cycles(graph()) == []


def test_the_pure_modules_exist() -> None:
    assert sorted(set(PURE) - set(modules())) == []


def test_pure_modules_import_nothing_of_the_outside_world_in_a_fresh_interpreter() -> None:
    script = (f"import importlib, json, sys\n"
              f"for name in {PURE!r}: importlib.import_module(name)\n"
              f"print(json.dumps(sorted(m for m in {OUTSIDE_WORLD!r} if m in sys.modules)))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == []


# The package's own __init__ is pure to import, but its lazy API names every feature by design.
@pytest.mark.parametrize("name", [name for name in PURE if name != "jupyter_gpu"])
def test_a_pure_module_reaches_no_probe_or_surface_module(name: str) -> None:
    upward = sorted(m for m in reachable(name) if within(m, PROBE_PREFIXES + SURFACE_PREFIXES))
    assert upward == []


def test_the_probe_layer_imports_no_surface() -> None:
    probes = [m for m in modules() if within(m, PROBE_PREFIXES)]
    assert len(probes) > 10
    upward = {m: sorted(t for t in reachable(m) if within(t, SURFACE_PREFIXES)) for m in probes}
    assert {m: s for m, s in upward.items() if s} == {}


def test_only_the_torch_seam_looks_torch_up_in_sys_modules() -> None:
    # One door to the kernel's torch (`kernel_torch.loaded_torch`), so "never import torch, never start CUDA"
    # is kept in one place.
    lookups = ('sys.modules.get("torch")', "sys.modules.get('torch')", '"torch" in sys.modules',
               '"torch" not in sys.modules', 'sys.modules["torch"]')
    found = sorted(name for name, path in modules().items() if name != "jupyter_gpu.kernel_torch"
                   and any(lookup in path.read_text() for lookup in lookups))
    assert found == []


def test_the_diagnosis_rules_read_snapshot_paths_with_posixpath_only() -> None:
    # A snapshot's paths are the checked machine's; the host replaying it must not reinterpret them.
    rules = [p for name, p in modules().items() if name.startswith("jupyter_gpu.gpucheck.diagnose.")]
    assert rules and [p.name for p in rules if "os.path" in p.read_text() or "os.pathsep" in p.read_text()] == []


def test_every_result_names_a_renderer_module_that_renders_it() -> None:
    # Results are data the pure core builds; their renderer is imported by name on first display, the one
    # string-named dependency in the package. Checked here so a moved or renamed renderer fails a test.
    import importlib

    renderers = {}
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and node.target.id == "renderer" and isinstance(node.value, ast.Constant)):
                renderers[name] = node.value.value
    assert len(renderers) >= 4
    for owner, renderer in renderers.items():
        assert renderer in modules(), f"{owner} names {renderer}, which is not a module of the package"
        module = importlib.import_module(renderer)
        assert callable(module.render_text) and callable(module.render_html)
        assert not within(renderer, PROBE_PREFIXES + SURFACE_PREFIXES)


# The rooms: each package directly under jupyter_gpu/. Shared rooms hold what several features use; surfaces show
# features to the user. Every other room is a feature's, so a new feature's room is held to the rules below the
# moment it exists.
SHARED_ROOMS = {"probekit", "facts", "metrics", "rendering", "snapshot", "torch_errors"}
SURFACE_ROOMS = {"magics", "widgets", "server", "autoload", "labextension"}


def room(name: str) -> str | None:
    """The room a module lives in; None for the package's top-level modules (shared by all)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else None


def feature_rooms() -> set[str]:
    return {r for name in modules() if (r := room(name)) and r not in SHARED_ROOMS | SURFACE_ROOMS}


def room_edges() -> dict[str, set[str]]:
    """Feature room -> the other feature rooms its modules import."""
    features = feature_rooms()
    edges: dict[str, set[str]] = {r: set() for r in features}
    for name, targets in graph().items():
        if room(name) in features:
            edges[room(name)].update(room(t) for t in targets if room(t) in features and room(t) != room(name))
    return edges


def test_the_rooms_are_found_from_the_package() -> None:
    assert {"gpucheck", "gputime", "batchprobe", "dataprobe", "speedprobe", "gpumem", "distributed"} <= feature_rooms()
    assert not feature_rooms() & (SHARED_ROOMS | SURFACE_ROOMS)
    assert all((PACKAGE / r).is_dir() for r in SHARED_ROOMS | SURFACE_ROOMS)
    assert room("jupyter_gpu.models") is None and room("jupyter_gpu.probekit.clock") == "probekit"
    assert room("jupyter_gpu.rendering.units") == "rendering"
    assert room("jupyter_gpu.gpumem") == "gpumem"  # a room's own __init__


def test_no_two_feature_rooms_import_each_other() -> None:
    # Directly or round a longer loop: one feature can then be changed, moved or deleted without the other.
    edges = room_edges()
    assert cycles({r: frozenset(targets) for r, targets in edges.items()}) == []


def test_what_three_features_share_lives_outside_every_features_room() -> None:
    # A module that three feature rooms import (its own included) belongs to a shared room (probekit, facts,
    # metrics) or the package's top level, not to whichever feature happened to write it first.
    users: dict[str, set[str]] = {}
    for name, targets in graph().items():
        if room(name) in feature_rooms():
            for target in targets:
                users.setdefault(target, {room(target)}).add(room(name))
    shared_by_three = {m: sorted(u) for m, u in users.items() if room(m) in feature_rooms() and len(u) >= 3}
    assert shared_by_three == {}


def test_shared_rooms_and_top_level_modules_import_no_feature_room() -> None:
    # What features share must not reach back into one of them. The package's __init__ (its lazy public API),
    # __main__, the CLI and `options` (every magic's parser, imported only by the magics and the CLI) are surfaces
    # that name every feature by design.
    features = feature_rooms()
    surfaces = {"jupyter_gpu", "jupyter_gpu.__main__", "jupyter_gpu.cli", "jupyter_gpu.options"}
    assert {name for name, targets in graph().items() if "jupyter_gpu.options" in targets
            and room(name) not in SURFACE_ROOMS} <= surfaces
    upward = {name: sorted(t for t in targets if room(t) in features) for name, targets in graph().items()
              if (room(name) in SHARED_ROOMS or room(name) is None) and name not in surfaces}
    assert {name: found for name, found in upward.items() if found} == {}


def test_the_top_level_holds_at_most_ten_modules_and_the_shared_vocabulary_lives_in_named_packages() -> None:
    # Issue 54: 16 flat modules hid the shared vocabulary among the entry points. The rest went into packages named
    # for what they hold: rendering/ (units, kit), torch_errors/ (oom, mismatch), snapshot/ (paths, schedulers).
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(top) <= 10, top
    assert {"cli", "options", "models", "version"} <= set(top)
    for package in ("rendering", "torch_errors", "snapshot"):
        assert package in SHARED_ROOMS and (PACKAGE / package / "__init__.py").is_file()
