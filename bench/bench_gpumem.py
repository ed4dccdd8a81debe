"""Does `%gpumem` map a notebook of 10,000 tensors in under half a second, and what does it tell the user that the
usual alternatives do not?

Every case is a real IPython shell (`IPython.testing.globalipapp.start_ipython()`), its variables made by
`ip.run_cell(...)` as a user's cells make them, on the CPU, in one process (one torch thread: the 2 vCPUs are
shared). The cases, each in a fresh namespace (`ip.reset()`, then `gc.collect()`):

a. `resnet-adam`: `bench/models.py`'s ResNet (widths 8/16/32) and Adam after one training step (parameters,
   gradients, Adam's state), the batch `x, y` and the `loss` the step backpropagated (its graph freed).
b. `transformer`: an Embedding, a 2-layer `nn.TransformerEncoder` built from an `nn.TransformerEncoderLayer`
   (d_model 128, 4 heads; the `layer` it copied stays in the namespace, as in a notebook), a Linear head, AdamW
   after one step.
c. `notebook-10k`: case a, then what a notebook of a few hours keeps: `history['train']` and `history['val']` with
   3,000 scalar loss tensors each, a dict of 2,500 feature vectors, an object with tensor attributes and a list of
   1,000 embeddings, 100 kept (images, labels) batches, a validation `loss` computed with autograd on (its graph
   keeps the forward's activations), a displayed `model(x[:4]).softmax(1)` that `Out` holds with its graph, and a
   last error whose frame keeps a local tensor: over 10,000 storages in all.

Per case, in R rounds (default 5, each in a rotated order, after one untimed warm-up round whose times are printed
as the first call), timed with `time.perf_counter()`, `gc.collect()` untimed before each:

1. **ours**: `map_memory(ip.user_ns, ip)`, all of `%gpumem` but the display, and `str(result)`, its text.
2. **gc snippet**: what users paste from StackOverflow, `for obj in gc.get_objects(): try: if torch.is_tensor(obj)
   or (hasattr(obj, 'data') and torch.is_tensor(obj.data)): print(type(obj), obj.size())` with `except: pass`,
   collecting the (type, size) pairs in a list instead of printing them.
3. **memlab**: `pytorch_memlab.MemReporter(model).report()` (0.3.2), its printout captured; `model` is the
   namespace's model. Without pytorch_memlab the bench says how to install it and leaves the column empty.

Reported per case: median seconds, ours / each (below 1: ours is faster), and the share of the live tensor bytes
each names by a path a user can type. The denominator is the same for all three: the CPU total `%gpumem` reports,
every storage its walk named (the saved tensors of the autograd graphs included) and every other storage the garbage
collector sees as a tensor. Ours: the bytes of the entries whose path is a Python expression (`x`,
`history['val'][12]`, `Out[3]`, `model.blocks.0.conv1.weight` read as `model.blocks[0].conv1.weight`), not a label
("graph of loss", "last error: frame evaluate, local logits"); the share with the graphs' bytes is the next column
(ours' coverage). The gc snippet: 0%, it prints types and shapes; what it *sees* (the distinct storages of the
objects it lists, untimed) is printed below the table. Memlab: the storages it lists under a name it took from
`model.named_parameters()` (gradients as `name.grad`), read from its own table after `report()`
(`reporter.device_tensor_stat`: rows of name and bytes, a storage's bytes on the first row that reached it, 0 on
the others), each counted at its exact storage size; everything else it calls `Tensor123`. Its own bytes are not
used: it multiplies each storage's byte count by the element size again (on torch 2 `untyped_storage().size()` is
already in bytes) and rounds it up to 512 B, so it reports 4.3 MiB for 1.1 MiB. The same share with
`reporter.add_optimizer(opt)`, which also names the optimizer's state, is printed (untimed) where there is one.
Also: ours' entry count, objects visited, per-device coverage, walk and rendering time apart, and how many full
collections of Python's garbage collector ran inside each contestant's timed calls (counted by a `gc.callbacks`
hook). Ours keeps a few objects per storage while it walks, and at 10,000 storages that sets off a full collection,
a pass over every object in the process, in each call; to show what it costs, after the rounds (outside the
medians) the stages of one more `map_memory` are timed apart (the walk, the live-storage scan, the sorted entries)
and three more whole calls with the collector off (`gc.disable()`).

Goal (the issue): ours under 0.5 s on the notebook with 10,000 tensors (✓/✗ in the table).

    .venv/bin/python bench/bench_gpumem.py [--rounds 5] [--cases resnet-adam,transformer,notebook-10k] [--markdown]
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import gc
import io
import platform
import re
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from tables import print_report

from jupyter_gpu.gpumem.allocator import device_totals
from jupyter_gpu.gpumem.result import MemoryMap
from jupyter_gpu.gpumem.runner import map_memory, walk_notebook
from jupyter_gpu.rendering.units import format_bytes

GOAL_SECONDS = 0.5
GOAL_STORAGES = 10_000
MEMLAB_INSTALL = ".venv/bin/python -m pip install pytorch-memlab==0.3.2"


# -- the notebooks ------------------------------------------------------------------------------------------------

RESNET_ADAM = """
import torch
from torch import nn
from models import ResNet

torch.manual_seed(0)
model = ResNet()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
loss = nn.functional.cross_entropy(model(x), y)
loss.backward()
opt.step()
"""

TRANSFORMER = """
import torch
from torch import nn

torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(128, nhead=4, dim_feedforward=512, batch_first=True)
model = nn.Sequential(nn.Embedding(1000, 128), nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
                      nn.Linear(128, 2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
tokens, labels = torch.randint(0, 1000, (32, 32)), torch.randint(0, 2, (32,))
loss = nn.functional.cross_entropy(model(tokens).mean(1), labels)
loss.backward()
opt.step()
"""

NOTEBOOK_STATE = """
history = {"train": [torch.tensor(2.3 - step * 1e-4) for step in range(3000)],
           "val": [torch.rand(()) for _ in range(3000)]}
features = {f"img{index:04d}": torch.randn(64) for index in range(2500)}

class Retrieval:
    def __init__(self):
        self.keys = torch.randn(512, 64)
        self.values = torch.randn(512, 64)
        self.embeddings = [torch.randn(16) for _ in range(1000)]

index = Retrieval()
batches = [(torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))) for _ in range(100)]
loss = nn.functional.cross_entropy(model(x), y)  # a validation loss, autograd on: the graph stays
"""

DISPLAYED = "model(x[:4]).softmax(1)"

FAILING = """
def evaluate(batch):
    logits = model(batch)
    raise RuntimeError("shapes do not match")

evaluate(x[:8])
"""


@dataclass(frozen=True)
class Case:
    name: str
    what: str
    cells: tuple[str, ...]


CASES = {case.name: case for case in (
    Case("resnet-adam", "ResNet 8/16/32 + Adam after one step", (RESNET_ADAM,)),
    Case("transformer", "2-layer encoder + AdamW after one step", (TRANSFORMER,)),
    Case("notebook-10k", "ResNet + Adam, history, features, batches, kept graph, Out, last error",
         (RESNET_ADAM, NOTEBOOK_STATE, DISPLAYED, FAILING)),
)}


def fresh_notebook(shell: Any, case: Case) -> None:
    """An empty namespace and no last error, then the case's cells run as a user runs them (output hidden)."""
    shell.reset(new_session=False)
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    gc.collect()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for cell in case.cells:
            shell.run_cell(cell, store_history=True)


# -- the contestants -----------------------------------------------------------------------------------------------


@dataclass
class OursRun:
    result: MemoryMap
    render_seconds: float


def ours(shell: Any) -> OursRun:
    result = map_memory(shell.user_ns, shell)
    started = time.perf_counter()
    str(result)
    return OursRun(result, time.perf_counter() - started)


def gc_snippet() -> list[tuple[type, Any]]:
    """The StackOverflow loop, as pasted, with the (type, size) pairs collected instead of printed."""
    found = []
    for obj in gc.get_objects():
        try:
            if torch.is_tensor(obj) or (hasattr(obj, "data") and torch.is_tensor(obj.data)):
                found.append((type(obj), obj.size()))
        except Exception:  # the snippet's bare `except: pass`: some objects raise on hasattr
            pass
    return found


def memlab_available() -> bool:
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # it prints that it found no CUDA device
            import pytorch_memlab  # noqa: F401
    except ImportError:
        return False
    return True


def memlab(shell: Any, with_optimizer: bool = False) -> Any:
    """`MemReporter(model).report()`, its printout swallowed; returns the reporter, whose table stays readable."""
    from pytorch_memlab import MemReporter

    reporter = MemReporter(shell.user_ns["model"])
    if with_optimizer:
        reporter.add_optimizer(shell.user_ns["opt"])
    with contextlib.redirect_stdout(io.StringIO()):
        reporter.report()
    return reporter


# -- what each one names --------------------------------------------------------------------------------------------


# `model.blocks.0.conv1.weight`, as `named_parameters()` spells a Sequential's child, is typed `model.blocks[0]...`
MODULE_INDEX = re.compile(r"\.(\d+)(?=[.\[\]]|$)")


def typeable(path: str) -> bool:
    """A path a user can type: a Python expression (`history['val'][3]`, `Out[2]`, `model.blocks.0.conv1.weight`
    read as `model.blocks[0].conv1.weight`), not a label ("graph of loss", "hidden _")."""
    try:
        ast.parse(MODULE_INDEX.sub(r"[\1]", path), mode="eval")
    except SyntaxError:
        return False
    return True


def ours_named_by_path(result: MemoryMap) -> int:
    return sum(entry.bytes for entry in result.entries if typeable(entry.path))


def cpu_total(result: MemoryMap) -> int:
    return next((totals.total_bytes or 0 for totals in result.devices if totals.device == "cpu"), 0)


def gc_snippet_sees() -> int:
    """Bytes of the distinct storages behind the objects the snippet lists (untimed; nothing kept)."""
    seen: dict[tuple[str, int], int] = {}
    for obj in gc.get_objects():
        try:
            tensor = obj if torch.is_tensor(obj) else obj.data if hasattr(obj, "data") else None
            if torch.is_tensor(tensor) and tensor.untyped_storage().data_ptr():
                storage = tensor.untyped_storage()
                seen[(str(tensor.device), storage.data_ptr())] = storage.nbytes()
        except Exception:
            continue
    return sum(seen.values())


def memlab_name_sizes(shell: Any, with_optimizer: bool) -> dict[str, int]:
    """Every name memlab derives from the model (and the optimizer), with the exact bytes of the storage behind it."""
    model, sizes = shell.user_ns["model"], {}
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    for name, parameter in model.named_parameters():
        sizes[name] = parameter.untyped_storage().nbytes()
        if parameter.grad is not None:
            sizes[f"{name}.grad"] = parameter.grad.untyped_storage().nbytes()
    if with_optimizer:
        optimizer = shell.user_ns["opt"]
        for parameter, state in optimizer.state.items():
            for key, value in state.items():
                if torch.is_tensor(value) and id(parameter) in names:
                    sizes[f"{type(optimizer).__name__}.{names[id(parameter)]}.{key}"] = value.untyped_storage().nbytes()
    return sizes


@dataclass
class MemlabReading:
    named_bytes: int          # exact bytes of the storages memlab lists under a model-derived name
    reported_bytes: int       # memlab's own total (bytes x element size, each rounded up to 512 B)
    rows: int


def memlab_reading(shell: Any, reporter: Any, with_optimizer: bool) -> MemlabReading:
    sizes = memlab_name_sizes(shell, with_optimizer)
    rows = reporter.device_tensor_stat.get(torch.device("cpu"), [])
    named = sum(sizes[name] for name, _, _, counted in rows if counted and name.split("(")[0] in sizes)
    return MemlabReading(named, sum(counted for *_, counted in rows), len(rows))


# -- one case -----------------------------------------------------------------------------------------------------


@dataclass
class Row:
    case: Case
    seconds: dict[str, list[float]] = field(default_factory=dict)
    first_call: dict[str, float] = field(default_factory=dict)
    last: OursRun | None = None
    walk_seconds: list[float] = field(default_factory=list)
    render_seconds: list[float] = field(default_factory=list)
    full_collections: dict[str, int] = field(default_factory=dict)
    stages: dict[str, float] = field(default_factory=dict)
    snippet_objects: int = 0
    snippet_sees: int = 0
    memlab: MemlabReading | None = None
    memlab_with_optimizer: MemlabReading | None = None

    def median(self, name: str) -> float | None:
        times = self.seconds.get(name)
        return statistics.median(times) if times else None

    @property
    def total(self) -> int:
        return cpu_total(self.last.result) if self.last else 0


class FullCollections:
    """Counts Python's full (generation 2) collections while entered. A call that keeps tens of thousands of objects
    alive across the young collections (records, names, entries: a few per storage) sets one off, and a full pass
    visits every object in the process (here about 350,000): it is part of that call's cost."""

    def __init__(self) -> None:
        self.count = 0

    def _seen(self, phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2:
            self.count += 1

    def __enter__(self) -> FullCollections:
        gc.callbacks.append(self._seen)
        return self

    def __exit__(self, *exception: object) -> None:
        gc.callbacks.remove(self._seen)


def ours_by_stage(shell: Any, runs: int = 3) -> dict[str, float]:
    """Diagnostics, not in the medians: one more run of map_memory's stages, each timed (the walk, the allocator and
    live-storage totals, the sorted entries), and the median of `runs` whole calls with the collector off, to show
    what the full collections a call sets off cost it."""
    gc.collect()
    started = time.perf_counter()
    walk = walk_notebook(torch, shell.user_ns, shell)
    walked = time.perf_counter()
    device_totals(torch, walk)
    totalled = time.perf_counter()
    walk.entries()
    stages = {"walk": walked - started, "totals (a gc scan of live storages)": totalled - walked,
              "entries": time.perf_counter() - totalled}
    del walk
    without_collector = []
    for _ in range(runs):
        gc.collect()
        gc.disable()
        try:
            started = time.perf_counter()
            ours(shell)
            without_collector.append(time.perf_counter() - started)
        finally:
            gc.enable()
    stages["whole call, collector off"] = statistics.median(without_collector)
    return stages


def run_case(shell: Any, case: Case, rounds: int, with_memlab: bool) -> Row:
    fresh_notebook(shell, case)
    row = Row(case)
    contestants: dict[str, Callable[[], Any]] = {"ours": lambda: ours(shell), "gc snippet": gc_snippet}
    if with_memlab:
        contestants["memlab"] = lambda: memlab(shell)
    names = list(contestants)
    for round_index in range(rounds + 1):  # round 0 warms up: imports, first reads, caches
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            if name == "ours":
                row.last = None  # every run finds the same heap: the previous result's objects are gone
            gc.collect()
            with FullCollections() as passes:
                started = time.perf_counter()
                outcome = contestants[name]()
                elapsed = time.perf_counter() - started
            if round_index == 0:
                row.first_call[name] = elapsed
                continue
            row.seconds.setdefault(name, []).append(elapsed)
            row.full_collections[name] = row.full_collections.get(name, 0) + passes.count
            if name == "ours":
                row.last = outcome
                row.walk_seconds.append(outcome.result.seconds)
                row.render_seconds.append(outcome.render_seconds)
            elif name == "gc snippet":
                row.snippet_objects = len(outcome)
            del outcome
    row.stages = ours_by_stage(shell)
    row.snippet_sees = gc_snippet_sees()
    if with_memlab:
        row.memlab = memlab_reading(shell, memlab(shell), with_optimizer=False)
        if "opt" in shell.user_ns:
            row.memlab_with_optimizer = memlab_reading(shell, memlab(shell, with_optimizer=True), with_optimizer=True)
    return row


# -- output -------------------------------------------------------------------------------------------------------


HEADINGS = ("case", "contents", "storages", "ours s", "gc snippet s", "ours / gc", "memlab s", "ours / memlab",
            "named by a path: ours / gc / memlab", "ours: + graphs", f"ours < {GOAL_SECONDS:g} s")


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _ratio(ours_seconds: float | None, theirs: float | None) -> str:
    return "—" if ours_seconds is None or not theirs else f"{ours_seconds / theirs:.2f}"


def _share(part: int | None, whole: int) -> str:
    return "—" if part is None or not whole else f"{part / whole:.1%}"


def table_rows(rows: list[Row]) -> list[tuple[str, ...]]:
    out = []
    for row in rows:
        storages = len(row.last.result.entries) if row.last else 0
        mine, snippet, theirs = row.median("ours"), row.median("gc snippet"), row.median("memlab")
        goal = ""
        if storages >= GOAL_STORAGES and mine is not None:
            goal = "✓" if mine < GOAL_SECONDS else "✗"
        named = row.last and ours_named_by_path(row.last.result)
        shares = " / ".join((_share(named, row.total), "0%",
                             _share(row.memlab.named_bytes if row.memlab else None, row.total)))
        out.append((row.case.name, row.case.what, f"{storages:,}", _seconds(mine), _seconds(snippet),
                    _ratio(mine, snippet), _seconds(theirs), _ratio(mine, theirs), shares,
                    _share(row.last and row.last.result.named_bytes, row.total), goal))
    return out


def print_details(rows: list[Row]) -> None:
    print("\nPer case:")
    for row in rows:
        if row.last is None:
            continue
        result = row.last.result
        coverage = ", ".join(f"{device} {share:.1%}" if share is not None else f"{device} —"
                             for device, share in result.coverage.items())
        spread = {name: f"{min(times):.3f}–{max(times):.3f}" for name, times in row.seconds.items()}
        print(f"- {row.case.name}: ours {len(result.entries):,} entries, {result.objects_visited:,} objects visited, "
              f"coverage {coverage}; live tensor bytes {format_bytes(row.total)}, "
              f"{format_bytes(ours_named_by_path(result))} of them named by a typeable path")
        print(f"    ours: walk and reconciliation {statistics.median(row.walk_seconds):.3f} s, text "
              f"{statistics.median(row.render_seconds):.3f} s (medians)")
        print("    range over the rounds: " + "; ".join(f"{name} {text} s" for name, text in spread.items()))
        print(f"    full collections of Python's gc inside the {len(row.walk_seconds)} timed calls: "
              + "; ".join(f"{name} {count}" for name, count in row.full_collections.items()))
        print("    ours, diagnostics outside the medians: " + "; ".join(f"{stage} {seconds:.3f} s"
                                                             for stage, seconds in row.stages.items()))
        print("    first call (warm-up, untimed in the medians): "
              + "; ".join(f"{name} {seconds:.3f} s" for name, seconds in row.first_call.items()))
        print(f"    gc snippet: lists {row.snippet_objects:,} objects, names none; their storages are "
              f"{format_bytes(row.snippet_sees)} ({_share(row.snippet_sees, row.total)} of the live bytes)")
        if row.memlab is not None:
            print(f"    memlab: {row.memlab.rows:,} rows, its own total {format_bytes(row.memlab.reported_bytes)} "
                  f"(bytes x element size, up to 512 B each), {format_bytes(row.memlab.named_bytes)} under "
                  f"parameter names ({_share(row.memlab.named_bytes, row.total)})")
        if row.memlab_with_optimizer is not None:
            print(f"    memlab with add_optimizer(opt) (untimed): "
                  f"{format_bytes(row.memlab_with_optimizer.named_bytes)} named "
                  f"({_share(row.memlab_with_optimizer.named_bytes, row.total)})")
        for note in result.notes:
            print(f"    ours' note: {note}")


def summary(rows: list[Row]) -> None:
    for row in rows:
        storages = len(row.last.result.entries) if row.last else 0
        mine = row.median("ours")
        if storages >= GOAL_STORAGES and mine is not None:
            verdict = "met ✓" if mine < GOAL_SECONDS else "NOT met ✗"
            print(f"\nGoal: ours under {GOAL_SECONDS:g} s on {row.case.name} ({storages:,} storages): "
                  f"{mine:.3f} s, {verdict}")


# -- main ---------------------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per case, after one warm-up round")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated, from " + ", ".join(CASES))
    parser.add_argument("--markdown", action="store_true", help="the table as Markdown, to paste in docs")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    names = [name.strip() for name in args.cases.split(",") if name.strip()]
    unknown = [name for name in names if name not in CASES]
    if unknown:
        raise SystemExit(f"unknown case {unknown[0]!r}; choose from {', '.join(CASES)}")
    torch.set_num_threads(1)
    # isinstance and hasattr on every object the collector holds warn (torch's deprecated `reduce_op`, a traitlets
    # Config that `hasattr(obj, "data")` makes complain): said once here, silenced for every contestant alike.
    warnings.simplefilter("ignore")
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    with_memlab = memlab_available()
    version = "not installed"
    if with_memlab:
        from importlib.metadata import version as package_version

        version = package_version("pytorch-memlab")
    print(f"torch {torch.__version__}, Python {platform.python_version()}, {torch.get_num_threads()} torch thread; "
          f"pytorch_memlab {version}; {args.rounds} rounds per case after a warm-up round; warnings silenced (the gc "
          "snippet's hasattr and memlab's isinstance on every object warn about torch.distributed.reduce_op and a "
          "traitlets Config)\n", flush=True)
    if not with_memlab:
        print(f"pytorch_memlab is not importable: `{MEMLAB_INSTALL}` to compare with it\n")
    begun = time.perf_counter()
    rows = []
    for name in names:
        rows.append(run_case(shell, CASES[name], args.rounds, with_memlab))
        print(f"done: {name}", flush=True)
    print_report(HEADINGS, table_rows(rows), args.markdown, [lambda: summary(rows), lambda: print_details(rows)], begun)


if __name__ == "__main__":
    main()
