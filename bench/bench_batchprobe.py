"""Does `%batchprobe` find the true largest batch size, in fewer trials and less time than Lightning and accelerate?

On the same training steps and the same limits, in one process, one tool after the other:

1. `%batchprobe`'s engine, `probe_batch_size` (default margin 0.1): its `max_batch_size` and `recommended`,
   with the count of search trials and of all trials (search + verify + recommend), and the path its search took
   (batch size, fitted, `Trial.how` of every trial).
2. Lightning `Tuner(trainer).scale_batch_size(mode="power")` and `mode="binsearch"`, with `init_val=2`,
   `steps_per_trial=2` and `max_val=65536` to match the probe (the step runs under manual optimisation, so
   forward, backward and optimizer step all happen inside `training_step`).
3. accelerate `find_executable_batch_size(starting_batch_size=S)`, S the next power of two >= 2x the true limit,
   as users start it: above the limit, from where it only shrinks (x0.9 per out-of-memory error).

The steps (`--models`, comma-separated; each a real CPU torch training step built here from its definition with
random weights, nothing downloaded: `opt.zero_grad()`, forward on random data of `batch_size` samples,
cross-entropy, backward, `opt.step()`):

a. `mlp`, allocating: an MLP 32->2048->10 with six activations, Adam, whose activations grow with the batch,
   under a CPU memory budget (`--budgets`, MiB: 64 and 256).
b. `oom-only`: raises `torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")` when the batch
   size is above a hidden limit (`--hidden`: 48, 300, 1000) and allocates nothing that grows: no memory signal.
c. `mlp-adam`, allocating: the model of docs/batchprobe.md's example (example_notebooks/03_batchprobe.ipynb):
   64->256 (BatchNorm1d, ReLU) ->256 (ReLU) ->10, Adam lr 1e-3; budget 12 MiB.
d. `resnet`, allocating: a CIFAR-style ResNet, a 3x3 stem and three stages of two basic residual blocks
   (Conv2d 3x3 without bias + BatchNorm2d + ReLU, twice, plus the identity or a 1x1 conv + BatchNorm2d
   shortcut), widths 8/16/32, strides 1/2/2, AdaptiveAvgPool2d + Linear to 10 classes; input 3x32x32, SGD lr 0.1
   momentum 0.9; budget 128 MiB.
e. `transformer`, allocating: an Embedding (vocabulary 256) plus learned positions, `nn.TransformerEncoder` of
   2 layers (d_model 64, 4 heads, feed-forward 256, dropout 0.1, batch_first), a Linear head to the vocabulary,
   sequence length 32, AdamW lr 1e-3, cross-entropy over every token; budget 192 MiB.

`--model-budgets mlp-adam=12,resnet=128,transformer=192` (MiB) changes the budgets of c-e; they are chosen so the
true limit is in the hundreds to low thousands and one probe takes seconds on one core. For the allocating steps
the probe enforces its budget itself; the other tools' every call of the step runs inside a fresh
`TensorBudget(torch, "cpu", limit)`, so they get a `torch.OutOfMemoryError` at the same bytes as the probe.
Neither Lightning nor accelerate recognises the budget's own message ("CPU out of memory (jupyter-gpu memory
budget) ..."; checked and printed below), so for them it is re-raised with the wording a CUDA allocator uses
("CUDA out of memory. ..."), which is what they would see on a GPU.

Every tool gets its own copy of the step, built from seed 0 with one step at batch 2 already taken (so Adam's or
the momentum's state exists and every tool starts from the same live bytes). "trials" counts the batch sizes each
tool ran its step at, one per attempt (as Lightning counts); a size run again counts again. "search" trials are
those that located the limit (for the other tools all of them). The true limit is found by brute force, each call
on a freshly built copy (the same starting state every time): an independent doubling and bisection, then every
size in a window around it is run (`--window`; the whole range 1..2^k for the cheap OOM-only step), and all sizes
up to the limit must fit and all above it fail. The column "doubling+bisection" is, for `%batchprobe`, the number
of trials a plain search that doubles from 2 and then bisects needs to find that exact limit: Lightning 2.6.6
binsearch's own sequence without its final 5% trim, computed from the known limit (nothing run); the details
say whether it equals the sizes Lightning binsearch really ran. Wall time of the other tools excludes the
harness's own cost of creating a TensorBudget per call (a scan of gc.get_objects), which a GPU run would not
have; it is printed.

Lightning and accelerate are not dependencies of jupyter_gpu: they live in a separate venv.

    python3 -m venv .bench-venv
    .bench-venv/bin/pip install torch==2.13.0 lightning accelerate   # torch pinned: no CUDA torch pulled in
    .bench-venv/bin/pip install -e .
    .bench-venv/bin/python bench/bench_batchprobe.py [--models mlp,oom-only,mlp-adam,resnet,transformer]
        [--budgets 64,256] [--hidden 48,300,1000] [--model-budgets mlp-adam=12,...] [--window 16]

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
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from models import ResNet
from torch import nn

from jupyter_gpu.batchprobe.budget import TensorBudget
from jupyter_gpu.batchprobe.oom import FailureKind, budget_message, classify
from jupyter_gpu.batchprobe.runner import ProbeRequest, probe_batch_size

MiB = 2**20
START = 2
STEPS = 2
MAXIMUM = 65536
WIDTH = 2048  # the `mlp` step's hidden width: ~47 KiB of activations per sample, few parameters
OOM_ONLY_MESSAGE = "CUDA out of memory. Tried to allocate 2.00 GiB"
LIGHTNING_MAX_TRIALS = 25  # scale_batch_size's default max_trials
LIGHTNING_VALUE_CAP = 8192  # _adjust_batch_size's default max_val, which binsearch's failure branch leaves in place


# -- the models -------------------------------------------------------------------------------------------------


VOCABULARY, SEQUENCE = 256, 32


class TinyTransformer(nn.Module):
    """Token and learned position embeddings, a 2-layer TransformerEncoder, and a linear head to the vocabulary."""

    def __init__(self, d_model: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCABULARY, d_model)
        self.position = nn.Parameter(torch.randn(SEQUENCE, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, VOCABULARY)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens) + self.position))


def _classes(inputs: tuple[int, ...]) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    return lambda rows: (torch.randn(rows, *inputs), torch.randint(0, 10, (rows,)))


def _tokens(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randint(0, VOCABULARY, (rows, SEQUENCE)), torch.randint(0, VOCABULARY, (rows, SEQUENCE)))


def _token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


@dataclass(frozen=True)
class Spec:
    """One step: its model, optimizer, random data of a batch and loss."""

    label: str  # the table's "step" column
    build: Callable[[], nn.Module]
    optimizer: Callable[[Any], torch.optim.Optimizer]
    batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy
    budget_mib: int | None = None  # the default budget of the new allocating steps


def _adam(parameters: Any) -> torch.optim.Optimizer:
    return torch.optim.Adam(parameters, lr=1e-3)


SPECS = {
    "mlp": Spec("allocating MLP", lambda: nn.Sequential(
        nn.Linear(32, WIDTH), nn.GELU(), nn.Tanh(), nn.SiLU(), nn.GELU(), nn.Tanh(), nn.SiLU(), nn.Linear(WIDTH, 10)),
        _adam, _classes((32,))),
    "oom-only": Spec("OOM-only", lambda: nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)), _adam,
                     _classes((32,))),
    "mlp-adam": Spec("MLP + Adam (docs example)", lambda: nn.Sequential(
        nn.Linear(64, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)),
        _adam, _classes((64,)), budget_mib=12),
    "resnet": Spec("ResNet-style CNN", ResNet, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
                   _classes((3, 32, 32)), budget_mib=128),
    "transformer": Spec("small transformer", TinyTransformer, lambda p: torch.optim.AdamW(p, lr=1e-3), _tokens,
                        _token_loss, budget_mib=192),
}


# -- the harness ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    model: str  # a key of SPECS
    limit: str  # how the table shows the limit
    budget_bytes: int | None = None  # allocating: the CPU memory budget
    hidden: int | None = None  # OOM-only: fails above this size

    @property
    def step(self) -> str:
        return SPECS[self.model].label


@dataclass
class Row:
    tool: str
    returned: int | None
    search_trials: int  # the trials that located the limit (all of them for the other tools)
    all_trials: int  # every trial: search, verify, recommend
    seconds: float
    sizes: list[int] = field(default_factory=list)
    error: str | None = None
    harness_seconds: float = 0.0  # TensorBudget set-up, excluded from `seconds`
    baselines: tuple[int, int] | None = None  # min/max live tensor bytes when a budget was created
    path: list[tuple[int, bool, str]] = field(default_factory=list)  # ours: (batch size, fitted, how) per trial
    ours: bool = False


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
    """A model, its optimizer (state already created) and one training step at a given batch size."""

    def __init__(self, case: Case) -> None:
        torch.manual_seed(0)
        self.case = case
        self.spec = SPECS[case.model]
        self.model = self.spec.build()
        self.model.train()
        self.opt = self.spec.optimizer(self.model.parameters())
        self.train(START)  # the optimizer's state exists before any tool starts: every tool sees the same live bytes

    def train(self, batch_size: int, opt: Any = None, backward: Callable[[Any], None] | None = None) -> None:
        opt = self.opt if opt is None else opt
        opt.zero_grad(set_to_none=True)
        rows = batch_size if self.case.hidden is None else 2  # OOM-only: nothing grows with the batch
        x, y = self.spec.batch(rows)
        loss = self.spec.loss(self.model(x), y)
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


@dataclass
class Truth:
    limit: int
    runs: int
    how: str
    seconds: float
    baselines: tuple[int, int] | None


def true_limit(case: Case, window: int) -> Truth:
    """The largest size whose STEPS steps fit, by brute force, every call on a freshly built step."""
    harness = Harness(case)
    runs = 0
    started = time.perf_counter()
    previous: list[weakref.ref] = []

    def fits(size: int) -> bool:
        nonlocal runs
        runs += 1
        # The same starting state for every call, as every tool gets: weights, BatchNorm statistics, optimizer
        # state and RNG from seed 0 and one step at START. The previous copy must be gone first, so the budget's
        # baseline counts exactly one model and its optimizer state (reference counting frees it; if not, collect).
        if any(ref() is not None for ref in previous):
            gc.collect()
        trainee = Trainee(case)
        previous[:] = [weakref.ref(trainee.model), weakref.ref(trainee.opt)]
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
    baselines = (min(harness.baselines), max(harness.baselines)) if harness.baselines else None
    return Truth(limit, runs, f"every size {first}..{last} run", time.perf_counter() - started, baselines)


def doubling_bisection(limit: int, start: int = START, maximum: int = MAXIMUM) -> tuple[list[int], int]:
    """The sizes a plain doubling-then-bisection search runs when exactly the sizes up to `limit` fit, and its answer.

    Computed, nothing run: Lightning 2.6.6 `_run_binsearch_scaling` step for step (its max_val checks, max_trials
    and the 8192 cap its failure branch keeps) without the final 5% margin trim.
    """
    sizes: list[int] = []
    low, high, size, fitted = 1, None, start, 0
    while size < maximum:
        sizes.append(size)
        if size <= limit:
            fitted += 1
            if fitted >= LIGHTNING_MAX_TRIALS:
                break
            low = size
            if high is not None:
                if high - low <= 1:
                    break
                size = (high + low) // 2
            else:
                size = min(size * 2, maximum)
        else:
            high = size
            size = min((high + low) // 2, LIGHTNING_VALUE_CAP)
            if high - low <= 1:
                break
    return sizes, size


def run_ours(case: Case) -> tuple[Row, Row]:
    trainee = Trainee(case)
    request = ProbeRequest(start=START, max_memory=case.budget_bytes or 8 * 1024 * MiB, steps=STEPS, maximum=MAXIMUM)
    started = time.perf_counter()
    result = probe_batch_size(trainee.train, request, namespace={"model": trainee.model, "opt": trainee.opt})
    seconds = time.perf_counter() - started
    sizes = [t.batch_size for t in result.trials]
    path = [(t.batch_size, t.fitted, getattr(t, "how", "") or t.purpose) for t in result.trials]
    search = result.search_trials
    best = Row("%batchprobe max_batch_size", result.max_batch_size, search, len(result.trials), seconds, sizes,
               baselines=(result.memory_before, result.memory_before), path=path, ours=True)
    recommended = Row(f"%batchprobe recommended (margin {request.margin})", result.recommended, search,
                      len(result.trials), seconds, ours=True)
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
            self.automatic_optimization = False  # forward, backward and the optimizer step all inside training_step
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
    return Row(tool, returned, len(sizes), len(sizes), seconds - harness.setup_seconds, sizes,
               harness_seconds=harness.setup_seconds, baselines=baselines)


def _guarded(tool: str, run: Callable[[], Row], ours: bool = False) -> Row:
    try:
        return run()
    except Exception as error:  # a tool that crashes gets a row saying so; the bench goes on
        return Row(tool, None, 0, 0, 0.0, error=f"{type(error).__name__}: {str(error).splitlines()[0][:80]}",
                   ours=ours)
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


def _ratio(value: float, ours: float | None) -> str:
    return f"{value / ours:.2f}x" if ours else "—"


def print_table(results: list[tuple[Case, Truth, list[Row]]]) -> None:
    print("| step | limit | true max | tool | returned | correct? | search trials | all trials | "
          "doubling+bisection trials (computed) | wall s | search vs ours | all vs ours | wall vs ours |")
    print("|---|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for case, truth, rows in results:
        limit = truth.limit
        ours = next((row for row in rows if row.ours and not row.error), None)
        for row in rows:
            head = f"| {case.step} | {case.limit} | {limit} | {row.tool} |"
            if row.error:
                print(f"{head} error | {row.error} | | | | | | | |")
                continue
            plain = str(len(doubling_bisection(limit)[0])) if row.ours and row is rows[0] else ""
            if row.ours:
                ratios = "1 | 1 | 1"
            else:
                ratios = (f"{_ratio(row.search_trials, ours and ours.search_trials)} | "
                          f"{_ratio(row.all_trials, ours and ours.all_trials)} | "
                          f"{_ratio(row.seconds, ours and ours.seconds)}")
            print(f"{head} {row.returned} | {verdict(row.returned, limit)} | {row.search_trials} | {row.all_trials} | "
                  f"{plain} | {row.seconds:.2f} | {ratios} |")


def _listed(items: list[str], most: int = 40) -> str:
    return ", ".join(items) if len(items) <= most else ", ".join(items[:most]) + ", …"


def print_details(results: list[tuple[Case, Truth, list[Row]]]) -> None:
    print("\nSizes each tool ran, in order (live tensor bytes when its budgets were created; harness time excluded):")
    for case, truth, rows in results:
        live = ""
        if truth.baselines is not None:
            low, high = truth.baselines
            live = f"; live before {low:,}" + (f"-{high:,}" if high != low else "") + " B"
        print(f"- {case.step}, {case.limit}: true max {truth.limit} ({truth.runs} brute-force runs, {truth.how}, "
              f"{truth.seconds:.1f} s{live})")
        plain, answer = doubling_bisection(truth.limit)
        binsearch = next((row for row in rows if row.tool == "Lightning scale_batch_size(binsearch)" and row.sizes),
                         None)
        same = "" if binsearch is None else \
            f"; the sizes Lightning binsearch ran: {'the same' if binsearch.sizes == plain else 'DIFFERENT'}"
        ours = next((row for row in rows if row.ours and row.path), None)
        mine = f"our {ours.search_trials} search trials vs " if ours else ""
        print(f"    doubling then bisection from {START} (computed): {mine}{len(plain)} trials to find {answer}: "
              f"{_listed([str(s) for s in plain])}{same}")
        for row in rows:
            if not row.sizes:
                continue
            extra = ""
            if row.baselines is not None and case.budget_bytes is not None:
                low, high = row.baselines
                extra += f"; live before {low:,}" + (f"-{high:,}" if high != low else "") + " B"
            if row.harness_seconds:
                extra += f"; budget set-up {row.harness_seconds:.2f} s excluded"
            print(f"    {row.tool}: {_listed([str(s) for s in row.sizes])}{extra}")
            if row.path:
                trials = [f"({size}, {'fits' if fitted else 'OOM'}, {how})" for size, fitted, how in row.path]
                print(f"      its trials (batch size, fitted, how): {_listed(trials, 60)}")


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


def build_cases(models: str, budgets: str, hidden: str, model_budgets: str) -> list[Case]:
    chosen = [name.strip() for name in models.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in SPECS]
    if unknown:
        raise SystemExit(f"unknown --models {', '.join(unknown)}; choose from {', '.join(SPECS)}")
    mib = {name: spec.budget_mib for name, spec in SPECS.items() if spec.budget_mib is not None}
    for item in filter(None, (part.strip() for part in model_budgets.split(","))):
        name, _, value = item.partition("=")
        if name not in mib or not value:
            raise SystemExit(f"--model-budgets: {item!r}; give NAME=MiB for {', '.join(mib)}")
        mib[name] = int(value)
    cases: list[Case] = []
    for name in chosen:
        if name == "mlp":
            cases += [Case(name, f"{b} MiB budget", budget_bytes=int(b) * MiB) for b in budgets.split(",")]
        elif name == "oom-only":
            cases += [Case(name, f"hidden {h}", hidden=int(h)) for h in hidden.split(",")]
        else:
            cases.append(Case(name, f"{mib[name]} MiB budget", budget_bytes=mib[name] * MiB))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(SPECS),
                        help=f"the steps to run, comma-separated, from {','.join(SPECS)} (default: all)")
    parser.add_argument("--budgets", default="64,256", help="CPU budgets in MiB for the `mlp` step")
    parser.add_argument("--hidden", default="48,300,1000", help="hidden limits for the `oom-only` step")
    parser.add_argument("--model-budgets", default="",
                        help="CPU budgets in MiB of the other allocating steps, e.g. resnet=128,transformer=192")
    parser.add_argument("--window", type=int, default=16, help="brute force: sizes run on each side of the limit")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: steady timings on a small shared machine)")
    args = parser.parse_args()
    cases = build_cases(args.models, args.budgets, args.hidden, args.model_budgets)
    begun = time.perf_counter()
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

    results: list[tuple[Case, Truth, list[Row]]] = []
    for case in cases:
        case_started = time.perf_counter()
        truth = true_limit(case, args.window)
        gc.collect()
        rows: list[Row] = []
        try:
            rows += list(run_ours(case))
        except Exception as error:  # our engine is being changed: a crash is a row, the bench goes on
            rows.append(Row("%batchprobe max_batch_size", None, 0, 0, 0.0, ours=True,
                            error=f"{type(error).__name__}: {str(error).splitlines()[0][:80]}"))
        gc.collect()
        if has_lightning:
            for mode in ("power", "binsearch"):
                rows.append(_guarded(f"Lightning scale_batch_size({mode})", lambda m=mode, c=case: run_lightning(c, m)))
        if has_accelerate:
            rows.append(_guarded("accelerate find_executable_batch_size",
                                 lambda c=case, limit=truth.limit: run_accelerate(c, limit)))
        results.append((case, truth, rows))
        print(f"done: {case.step}, {case.limit} (true max {truth.limit}; brute force {truth.seconds:.1f} s, "
              f"case {time.perf_counter() - case_started:.1f} s)", flush=True)
    print()
    print_table(results)
    print_details(results)
    print("\nHow to read the returned sizes:")
    print("- %batchprobe max_batch_size is the largest size that ran (re-run after the last failure); "
          "`recommended` keeps 10% of the budget free and was run too.")
    print("- Lightning power returns the last power of two that fitted; binsearch returns the largest size that "
          "fitted times (1 - margin 0.05), a size it never ran.")
    print("- accelerate returns what ran last: the first size of start, start*0.9, start*0.81, ... that fitted.")
    print("- search/all vs ours: the tool's trials / %batchprobe's search / all trials; wall vs ours: its seconds / "
          "ours. doubling+bisection: the trials a plain doubling-from-2-then-bisection search needs for the exact "
          "limit (Lightning binsearch's sequence without its 5% trim), computed from the true limit.")
    print(f"\nWhole run: {time.perf_counter() - begun:.1f} s")


if __name__ == "__main__":
    main()
