"""Does `%batchprobe` find the true largest batch size, in fewer trials and less time than Lightning and accelerate?

On the same training steps and the same limits, in one process, one tool after the other:

1. `%batchprobe`'s engine, `probe_batch_size` (default margin 0.1): its `max_batch_size` and `recommended`,
   with the count of search trials and of all trials (search + verify + recommend).
2. Lightning `Tuner(trainer).scale_batch_size(mode="power")` and `mode="binsearch"`, with `init_val=2`,
   `steps_per_trial=2` and `max_val=65536` to match the probe (the step runs under manual optimisation, so
   forward, backward and optimizer step all happen inside `training_step`).
3. accelerate `find_executable_batch_size(starting_batch_size=S)`, S the next power of two >= 2x the true limit,
   as users start it: above the limit, from where it only shrinks (x0.9 per out-of-memory error).

The steps (each a real CPU torch training step: forward, backward, Adam step):

a. allocating: an MLP whose activations grow with the batch, under a CPU memory budget (64 and 256 MiB). The
   probe enforces its budget itself; the other tools' every call of the step runs inside a fresh
   `TensorBudget(torch, "cpu", limit)`, so they get a `torch.OutOfMemoryError` at the same bytes as the probe.
   Neither Lightning nor accelerate recognises the budget's own message ("CPU out of memory (jupyter-gpu
   memory budget) ..."; checked and printed below), so for them it is re-raised with the wording a CUDA
   allocator uses ("CUDA out of memory. ..."), which is what they would see on a GPU.
b. OOM-only: raises `torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")` when the batch
   size is above a hidden limit (48, 300, 1000) and allocates nothing that grows: no memory signal at all.

"trials" counts the batch sizes each tool ran its step at, one per attempt (as Lightning counts); a size run
again counts again. The true limit is found by brute force: an independent doubling and bisection, then every
size in a window around it is run (the whole range 1..2^k for the cheap OOM-only step), and all sizes up to
the limit must fit and all above it fail. Wall time of the other tools excludes the harness's own cost of
creating a TensorBudget per call (a scan of gc.get_objects), which a GPU run would not have; it is printed.

Lightning and accelerate are not dependencies of jupyter_gpu: they live in a separate venv.

    python3 -m venv .bench-venv
    .bench-venv/bin/pip install torch==2.13.0 lightning accelerate   # torch pinned: no CUDA torch pulled in
    .bench-venv/bin/pip install -e .
    .bench-venv/bin/python bench/bench_batchprobe.py [--budgets 64,256] [--hidden 48,300,1000] [--window 16]

Without lightning or accelerate installed it says so and runs the rest.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import logging
import math
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from jupyter_gpu.batchprobe.budget import TensorBudget
from jupyter_gpu.batchprobe.oom import FailureKind, budget_message, classify
from jupyter_gpu.batchprobe.runner import ProbeRequest, probe_batch_size

MiB = 2**20
START = 2
STEPS = 2
MAXIMUM = 65536
WIDTH = 2048  # the MLP's hidden width: ~47 KiB of activations per sample, few parameters
OOM_ONLY_MESSAGE = "CUDA out of memory. Tried to allocate 2.00 GiB"


@dataclass(frozen=True)
class Case:
    step: str  # "allocating MLP" or "OOM-only"
    limit: str  # how the table shows the limit
    budget_bytes: int | None = None  # allocating: the CPU memory budget
    hidden: int | None = None  # OOM-only: fails above this size


@dataclass
class Row:
    tool: str
    returned: int | None
    trials: str  # "5" or "4 search / 6 all"
    trial_count: int  # what the ratio uses (all trials)
    seconds: float
    sizes: list[int] = field(default_factory=list)
    error: str | None = None
    harness_seconds: float = 0.0  # TensorBudget set-up, excluded from `seconds`
    baselines: tuple[int, int] | None = None  # min/max live tensor bytes when a budget was created


class Harness:
    """Runs one call of a step under a fresh CPU budget and turns its refusal into a CUDA-style OOM."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.setup_seconds = 0.0
        self.baselines: list[int] = []

    def call(self, work: Callable[[], Any]) -> Any:
        if self.case.budget_bytes is None:
            return work()
        started = time.perf_counter()
        budget = TensorBudget(torch, "cpu", self.case.budget_bytes)
        self.setup_seconds += time.perf_counter() - started
        self.baselines.append(budget.baseline)
        message = None
        try:
            with budget.trial():
                return work()
        except Exception as error:
            failure = classify(error)
            if failure is None or failure.kind is not FailureKind.OUT_OF_MEMORY:
                raise
            message = str(error).splitlines()[0]
        finally:
            budget.close()
        # Raised outside the except block: the failed call's tensors are gone, as after a real allocator's OOM
        # once the tool's own except block ends.
        raise torch.OutOfMemoryError(f"CUDA out of memory. (CPU budget standing in for a GPU: {message})")

    def reset(self) -> None:
        self.setup_seconds = 0.0
        self.baselines = []


class Trainee:
    """A model, its Adam optimizer (state already created) and one training step at a given batch size."""

    def __init__(self, case: Case) -> None:
        torch.manual_seed(0)
        self.case = case
        if case.hidden is None:
            self.model = nn.Sequential(nn.Linear(32, WIDTH), nn.GELU(), nn.Tanh(), nn.SiLU(), nn.GELU(), nn.Tanh(),
                                       nn.SiLU(), nn.Linear(WIDTH, 10))
        else:
            self.model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.train(START)  # Adam's state exists before any tool starts: every tool sees the same live bytes

    def train(self, batch_size: int, opt: Any = None, backward: Callable[[Any], None] | None = None) -> None:
        opt = self.opt if opt is None else opt
        opt.zero_grad(set_to_none=True)
        rows = batch_size if self.case.hidden is None else 2  # OOM-only: nothing grows with the batch
        x = torch.randn(rows, 32)
        y = torch.randint(0, 10, (rows,))
        loss = nn.functional.cross_entropy(self.model(x), y)
        if self.case.hidden is not None and batch_size > self.case.hidden:
            raise torch.OutOfMemoryError(OOM_ONLY_MESSAGE)
        (backward or _backward)(loss)
        opt.step()
        # No gradients left between calls: a budget created at the next call would count them in its baseline
        # but never see them freed.
        opt.zero_grad(set_to_none=True)


def _backward(loss: Any) -> None:
    loss.backward()


def _fits(trainee: Trainee, harness: Harness, size: int) -> bool:
    try:
        harness.call(lambda: [trainee.train(size) for _ in range(STEPS)])
    except torch.OutOfMemoryError:
        return False
    return True


def true_limit(case: Case, window: int) -> tuple[int, int, str]:
    """The largest size whose STEPS steps fit, by brute force: (limit, sizes run, how it was checked)."""
    trainee = Trainee(case)
    harness = Harness(case)
    runs = 0

    def fits(size: int) -> bool:
        nonlocal runs
        runs += 1
        return _fits(trainee, harness, size)

    size = START
    while fits(size):
        size *= 2
        if size > MAXIMUM:
            raise RuntimeError(f"{case.step} {case.limit}: fits past {MAXIMUM}")
    low, high = size // 2, size  # low fits (or is START // 2 when nothing fits), high does not
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    limit = low
    first, last = (1, size) if case.hidden is not None else (max(1, limit - window), limit + window)
    wrong = [s for s in range(first, last + 1) if fits(s) != (s <= limit)]
    if wrong:
        raise RuntimeError(f"{case.step} {case.limit}: fitting is not monotone around {limit}: {wrong[:10]}")
    if case.hidden is not None and limit != case.hidden:
        raise RuntimeError(f"OOM-only step: found {limit}, hidden limit {case.hidden}")
    return limit, runs, f"every size {first}..{last} run"


def run_ours(case: Case) -> tuple[Row, Row]:
    trainee = Trainee(case)
    request = ProbeRequest(start=START, max_memory=case.budget_bytes or 8 * 1024 * MiB, steps=STEPS, maximum=MAXIMUM)
    started = time.perf_counter()
    result = probe_batch_size(trainee.train, request, namespace={"model": trainee.model, "opt": trainee.opt})
    seconds = time.perf_counter() - started
    sizes = [t.batch_size for t in result.trials]
    trials = f"{result.search_trials} search / {len(result.trials)} all"
    best = Row("%batchprobe max_batch_size", result.max_batch_size, trials, len(result.trials), seconds, sizes,
               baselines=(result.memory_before, result.memory_before))
    recommended = Row(f"%batchprobe recommended (margin {request.margin})", result.recommended, trials,
                      len(result.trials), seconds)
    return best, recommended


def _lightning_module_class() -> type:
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, Dataset

    class Samples(Dataset):
        """Batches of empty rows: the step makes its own data, so the loader holds no bytes of the budget."""

        def __len__(self) -> int:
            return 2 * MAXIMUM + 2

        def __getitem__(self, index: int) -> torch.Tensor:
            return torch.empty(0)

    class Module(pl.LightningModule):
        def __init__(self, trainee: Trainee, harness: Harness) -> None:
            super().__init__()
            self.automatic_optimization = False  # forward, backward and Adam's step all inside training_step
            self.trainee = trainee
            self.net = trainee.model
            self.harness = harness
            self.batch_size = START
            self.seen: list[int] = []

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> None:
            size = batch.shape[0]
            self.seen.append(size)
            opt = self.optimizers()
            self.harness.call(lambda: self.trainee.train(size, opt, self.manual_backward))

        def configure_optimizers(self) -> Any:
            return self.trainee.opt

        def train_dataloader(self) -> Any:
            return DataLoader(Samples(), batch_size=self.batch_size)

    return Module


def run_lightning(case: Case, mode: str) -> Row:
    import lightning.pytorch as pl
    from lightning.pytorch.tuner import Tuner

    trainee = Trainee(case)
    harness = Harness(case)
    module = _lightning_module_class()(trainee, harness)
    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                             default_root_dir=root)
        started = time.perf_counter()
        returned = Tuner(trainer).scale_batch_size(module, mode=mode, steps_per_trial=STEPS, init_val=START,
                                                   max_val=MAXIMUM)
        seconds = time.perf_counter() - started
    # One trial is a run of consecutive steps at one size (one step when it failed).
    sizes = [s for i, s in enumerate(module.seen) if i == 0 or module.seen[i - 1] != s]
    return _row(f"Lightning scale_batch_size({mode})", returned, sizes, seconds, harness)


def run_accelerate(case: Case, limit: int) -> Row:
    from accelerate.utils import find_executable_batch_size

    trainee = Trainee(case)
    harness = Harness(case)
    sizes: list[int] = []
    start = 2 ** math.ceil(math.log2(2 * limit))

    @find_executable_batch_size(starting_batch_size=start)
    def train(batch_size: int) -> int:
        sizes.append(batch_size)
        harness.call(lambda: [trainee.train(batch_size) for _ in range(STEPS)])
        return batch_size

    started = time.perf_counter()
    returned = train()
    seconds = time.perf_counter() - started
    return _row(f"accelerate find_executable_batch_size({start})", returned, sizes, seconds, harness)


def _row(tool: str, returned: int | None, sizes: list[int], seconds: float, harness: Harness) -> Row:
    baselines = (min(harness.baselines), max(harness.baselines)) if harness.baselines else None
    return Row(tool, returned, str(len(sizes)), len(sizes), seconds - harness.setup_seconds, sizes,
               harness_seconds=harness.setup_seconds, baselines=baselines)


def _guarded(tool: str, run: Callable[[], Row]) -> Row:
    try:
        return run()
    except Exception as error:  # a tool that crashes gets a row saying so; the bench goes on
        return Row(tool, None, "—", 0, 0.0, error=f"{type(error).__name__}: {str(error).splitlines()[0][:80]}")
    finally:
        gc.collect()


def verdict(returned: int | None, limit: int) -> str:
    if returned is None:
        return "—"
    if returned == limit:
        return "yes (exact)"
    if 0 < returned < limit:
        return f"fits ({returned / limit:.0%} of max)"
    if returned == 0:
        return "NO (returned 0)"
    return f"NO: OOMs (+{returned - limit})"


def print_table(results: list[tuple[Case, int, list[Row]]]) -> None:
    print("| step | limit | true max | tool | returned | correct? | trials | wall s | trials vs ours | wall vs ours |")
    print("|---|---|---:|---|---:|---|---:|---:|---:|---:|")
    for case, limit, rows in results:
        ours = rows[0]
        for row in rows:
            if row.error:
                print(f"| {case.step} | {case.limit} | {limit} | {row.tool} | error | {row.error} | | | | |")
                continue
            is_ours = row.tool.startswith("%batchprobe")
            trial_ratio = "1" if is_ours else f"{row.trial_count / ours.trial_count:.2f}x"
            wall_ratio = "1" if is_ours else f"{row.seconds / ours.seconds:.2f}x"
            print(f"| {case.step} | {case.limit} | {limit} | {row.tool} | {row.returned} | "
                  f"{verdict(row.returned, limit)} | {row.trials} | {row.seconds:.2f} | {trial_ratio} | {wall_ratio} |")


def print_details(results: list[tuple[Case, int, list[Row]]], checks: dict[Case, str]) -> None:
    print("\nSizes each tool ran, in order (live tensor bytes when its budgets were created; harness time excluded):")
    for case, limit, rows in results:
        print(f"- {case.step}, {case.limit}: true max {limit} ({checks[case]})")
        for row in rows:
            if not row.sizes:
                continue
            shown = ", ".join(map(str, row.sizes)) if len(row.sizes) <= 40 else \
                ", ".join(map(str, row.sizes[:40])) + ", …"
            extra = ""
            if row.baselines is not None and case.budget_bytes is not None:
                low, high = row.baselines
                extra += f"; live before {low:,}" + (f"-{high:,}" if high != low else "") + " B"
            if row.harness_seconds:
                extra += f"; budget set-up {row.harness_seconds:.2f} s excluded"
            print(f"    {row.tool}: {shown}{extra}")


def recognition_check(lightning: bool, accelerate: bool) -> None:
    """Would the other tools shrink on the budget's own error message? (Why the harness re-words it.)"""
    raw = torch.OutOfMemoryError(budget_message("CPU", 2 * MiB, 63 * MiB, 64 * MiB))
    print(f"The CPU budget's own error: {type(raw).__name__}({str(raw)!r})")
    if lightning:
        from lightning.pytorch.utilities.memory import is_oom_error

        print(f"  Lightning is_oom_error: {is_oom_error(raw)} (needs 'CUDA' and 'out of memory' in the message)")
    if accelerate:
        from accelerate.utils.memory import should_reduce_batch_size

        print(f"  accelerate should_reduce_batch_size: {should_reduce_batch_size(raw)} "
              "(needs ' out of memory.' or a CPU allocator message)")


def quiet_lightning() -> None:
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="64,256", help="CPU budgets in MiB for the allocating step")
    parser.add_argument("--hidden", default="48,300,1000", help="hidden limits for the OOM-only step")
    parser.add_argument("--window", type=int, default=16, help="brute force: sizes run on each side of the limit")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: steady timings on a small shared machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    has_lightning = importlib.util.find_spec("lightning") is not None
    has_accelerate = importlib.util.find_spec("accelerate") is not None
    versions = [f"torch {torch.__version__}"]
    if has_lightning:
        import lightning

        quiet_lightning()
        versions.append(f"lightning {lightning.__version__}")
    else:
        print("lightning is not installed in this interpreter: its rows are skipped (see the docstring for the venv)")
    if has_accelerate:
        import accelerate

        versions.append(f"accelerate {accelerate.__version__}")
    else:
        print("accelerate is not installed in this interpreter: its rows are skipped (see the docstring for the venv)")
    print(", ".join(versions) + f", {torch.get_num_threads()} torch thread(s)\n")
    recognition_check(has_lightning, has_accelerate)

    cases = [Case("allocating MLP", f"{b} MiB budget", budget_bytes=int(b) * MiB) for b in args.budgets.split(",")]
    cases += [Case("OOM-only", f"hidden {h}", hidden=int(h)) for h in args.hidden.split(",")]
    results: list[tuple[Case, int, list[Row]]] = []
    checks: dict[Case, str] = {}
    for case in cases:
        limit, runs, how = true_limit(case, args.window)
        checks[case] = f"{runs} brute-force runs, {how}"
        gc.collect()
        rows = list(run_ours(case))
        gc.collect()
        if has_lightning:
            for mode in ("power", "binsearch"):
                rows.append(_guarded(f"Lightning scale_batch_size({mode})", lambda m=mode, c=case: run_lightning(c, m)))
        if has_accelerate:
            rows.append(_guarded("accelerate find_executable_batch_size",
                                 lambda c=case, limit=limit: run_accelerate(c, limit)))
        results.append((case, limit, rows))
        print(f"done: {case.step}, {case.limit} (true max {limit})", flush=True)
    print()
    print_table(results)
    print_details(results, checks)
    print("\nHow to read the returned sizes:")
    print("- %batchprobe max_batch_size is the largest size that ran (re-run after the last failure); "
          "`recommended` keeps 10% of the budget free and was run too.")
    print("- Lightning power returns the last power of two that fitted; binsearch returns the largest size that "
          "fitted times (1 - margin 0.05), a size it never ran.")
    print("- accelerate returns what ran last: the first size of start, start*0.9, start*0.81, ... that fitted.")
    print("- trials vs ours: the tool's trials / %batchprobe's all trials; wall vs ours: its seconds / ours.")


if __name__ == "__main__":
    main()
