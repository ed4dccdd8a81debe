"""Does every speed-up `%speedprobe` reports agree within 5% with the same configuration written by hand and timed by
`torch.utils.benchmark`, and does the whole probe take under two minutes?

For every step below, in one process, one after the other:

1. **ours**: `probe_speed(step, options=..., steps=N, namespace={"model": model, "opt": opt})`, the engine of
   `%speedprobe step`, on the user's step as written (no option in it). Reported per option: its speed-up (the
   baseline's median step over the option's, the engine's own timing), `agrees`, `compile_seconds`; then the
   combination it built, its `best`, its `launch` profile, and its wall time (`result.seconds`), total and minus
   the compile options' `compile_seconds` (goal: under two minutes without compilation).
2. **by hand**: for the baseline and every option the probe measured (and its combination), the user's step
   rewritten with that option written in, the way `result.code()` tells a user to: `torch.autocast(device,
   dtype=...)` around the forward and the loss (fp16 with a `torch.amp.GradScaler` scaling the backward and stepping
   the optimizer), `model.to(memory_format=torch.channels_last)` and each batch converted too, the optimizer
   built with `fused=True` (or `foreach=True`, whichever the probe's code says), `model = torch.compile(model)` (or
   `mode="reduce-overhead"`), `torch.set_float32_matmul_precision("high")` and `cudnn.allow_tf32`,
   `torch.backends.cudnn.benchmark = True`. Each is a fresh model and optimizer from the same seed as the user's,
   called 3 times untimed (compilation; the first call's time beyond a steady step is printed as its compile
   time), then timed by `torch.utils.benchmark.Timer("step()", num_threads=torch.get_num_threads())
   .blocked_autorange(min_run_time=T)` in R interleaved rounds (every round times every configuration, each round
   in a rotated order, so a change of the machine's load hits all of them alike). Timer's median of a
   configuration is the median of its R round medians; Timer speed-up = Timer median of the hand-written
   baseline / Timer median of the hand-written option.
3. **ratio** = ours speed-up / Timer speed-up, goal 0.95-1.05 (marked ✗ outside).

Noise, printed per step so that a ratio can be read against it: "Timer baseline rounds", the spread (max/min - 1) of
the hand-written baseline's R round medians, i.e. how much the same configuration timed by the same Timer moves
between rounds a few seconds apart; and "ours baseline start vs end", how much the medians of the probe's two
baseline runs differ (the same state, one before the options and one after them; the probe pools both). A ratio
further from 1 than these is not noise.

The steps, each built here from its definition with random weights (seed 0), nothing downloaded; each makes its
batch with `torch.randn`/`torch.randint` (fixed shapes), runs `opt.zero_grad()`, forward, loss, backward,
`opt.step()`, and returns the loss:

a. `cnn`: a ResNet-style CNN (3x3 stem, three stages of two basic blocks with BatchNorm, widths 16/32/64),
   cross-entropy over 10 classes, SGD lr 0.01 momentum 0.9; batch 32 of 3x32x32.
b. `transformer`: an Embedding (vocabulary 1000) with learned positions, `nn.TransformerEncoder` of 2 layers
   (d_model 128, 4 heads, feed-forward 512, dropout 0.1, batch_first), mean over the sequence, Linear to 2
   classes, AdamW lr 1e-3; batch 32, sequence 32.
c. `recipe-mlp`: the MLP of PyTorch's AMP recipe (Linear+ReLU, Linear+ReLU, Linear; MSE loss, SGD lr 1e-3):
   width 1024, batch 256 on the CPU; the recipe's width 4096, batch 512 on CUDA.
d. `tiny-mlp`: 4->24->24->2 (ReLU), cross-entropy, Adam lr 1e-3, batch 1: the launch-bound case.

The MLPs are small nn.Module classes, not nn.Sequential as in the recipe: on torch 2.13 `model.compile()` leaves a
bare `nn.Sequential` uncompiled (dynamo skips its forward, which lives in torch.nn), and the classes keep the
comparison meaningful for a user who writes `model.compile()`; both sides here compile with `torch.compile`.

On CUDA (when `torch.cuda.is_available()`) everything runs on cuda:0 and the GPU goals are checked too: AMP at
least 2x on `recipe-mlp`, `tiny-mlp` launch-bound. Without a GPU, tf32, cudnn.benchmark and reduce-overhead do not
apply (the probe says why) and are not timed by hand.

Both sides run with one torch thread (`--threads 1`, set before anything runs; `--threads 0` keeps torch's default).
On the 2-vCPU machine this was written on, a second intra-op thread buys nothing (a 1024x1024 matmul: 29-33 ms on
one thread, 35-39 ms on two) and makes every parallel region wait milliseconds for it: the `tiny-mlp` step takes
0.45 ms on one thread and 8.0 ms on two, the `cnn` step 68 ms and 2.4 s. That is the machine, not either tool, and
it would drown the comparison in noise; on a machine whose cores are its own, pass `--threads 0`.

Compilation is timed cold: the run gets fresh, empty compile caches (`TORCHINDUCTOR_CACHE_DIR`, and
`TRITON_CACHE_DIR` on CUDA, in a temporary folder removed afterwards), as a user's first `%speedprobe` would, unless
`--warm-cache` keeps the usual ones (then a second run compiles in a second or two). Within a run the hand-written
compile comes after the probe's and finds the kernels the probe compiled for the same graph in that cache, so its
compile time is the smaller one.

`--without-ticker` is a diagnostic, not a contestant: it replaces the probe's progress clock
(`jupyter_gpu.probekit.ticker.Ticker.resume`, which the probe calls before every step) with a no-op for the whole
run, to show whether the progress line costs the timed steps anything. Before 1791022 it woke the clock's thread on
every call, and that made the `tiny-mlp` baseline 1.55 times a plain loop's (median of 6 probes alternating with
and without it in one process, each between two 200-step plain loops; 1.04 without it); since then 0.95 against
1.00, within this machine's noise.

torch.compile costs 10-30 s per model on this CPU on the first compile (the cnn 16-24 s, the transformer 9-32 s),
several times per step (the option, the combination, and their hand-written twins), so a full run takes 3-6
minutes; `--no-compile` leaves it out.

    .venv/bin/python bench/bench_speedprobe.py [--quick] [--steps 20] [--try amp-bf16,fused-optimizer,...]
        [--no-compile] [--models cnn,transformer,recipe-mlp,tiny-mlp] [--rounds 3] [--min-run-time 1.0] [--threads 1]
        [--warm-cache] [--without-ticker] [--markdown]

`--quick`: 8 steps per configuration, no compile, 2 rounds of 0.3 s. Timings on a shared 2-core machine vary from
run to run: run it more than once and report each run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils.benchmark as benchmark
from models import MLP, EncoderClassifier, ResNet
from tables import print_table
from torch import nn

from jupyter_gpu.speedprobe.catalog import OPTION_NAMES, title_of
from jupyter_gpu.speedprobe.result import OptionTrial, SpeedProbeResult
from jupyter_gpu.speedprobe.runner import probe_speed

SEED = 0
RATIO_GOAL = (0.95, 1.05)
WALL_GOAL_SECONDS = 120.0  # the probe's wall time without compilation
GPU_AMP_GOAL = 2.0  # AMP on the recipe's MLP, on a GPU
HAND_WARMUP_CALLS = 3
COMPILE_OPTIONS = ("compile", "compile-reduce-overhead")
# Every configuration of a step compiles the same forward code again (the probe's and the hand-written models are
# different instances): a higher limit than dynamo's default 8 keeps a late one from silently running eager.
RECOMPILE_LIMIT = 64


# -- the models -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    name: str
    what: str
    model: Callable[[], nn.Module]
    optimizer: Callable[..., torch.optim.Optimizer]  # (parameters, **implementation flags)
    batch: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    images: bool = False  # 4-D input batches: channels_last converts them too


def workloads(device: torch.device) -> dict[str, Workload]:
    cuda = device.type == "cuda"
    width, rows = (4096, 512) if cuda else (1024, 256)
    cross_entropy, mse = nn.functional.cross_entropy, nn.functional.mse_loss
    return {workload.name: workload for workload in (
        Workload("cnn", "ResNet-style CNN, BatchNorm, SGD+momentum, batch 32 of 3x32x32",
                 lambda: ResNet(widths=(16, 32, 64)),
                 lambda params, **flags: torch.optim.SGD(params, lr=0.01, momentum=0.9, **flags),
                 lambda: (torch.randn(32, 3, 32, 32, device=device), torch.randint(0, 10, (32,), device=device)),
                 cross_entropy, images=True),
        Workload("transformer", "2-layer encoder classifier, d_model 128, AdamW, batch 32, seq 32", EncoderClassifier,
                 lambda params, **flags: torch.optim.AdamW(params, lr=1e-3, **flags),
                 lambda: (torch.randint(0, 1000, (32, 32), device=device), torch.randint(0, 2, (32,), device=device)),
                 cross_entropy),
        Workload("recipe-mlp", f"AMP recipe's MLP, width {width}, 3 layers, SGD, batch {rows}",
                 lambda: MLP((width, width, width, width)),
                 lambda params, **flags: torch.optim.SGD(params, lr=1e-3, **flags),
                 lambda: (torch.randn(rows, width, device=device), torch.randn(rows, width, device=device)), mse),
        Workload("tiny-mlp", "MLP 4->24->24->2, Adam, batch 1 (launch-bound)", lambda: MLP((4, 24, 24, 2)),
                 lambda params, **flags: torch.optim.Adam(params, lr=1e-3, **flags),
                 lambda: (torch.randn(1, 4, device=device), torch.randint(0, 2, (1,), device=device)),
                 cross_entropy),
    )}


# -- the user's step, and the same step with options written in by hand ------------------------------------------


def user_step(workload: Workload, device: torch.device) -> tuple[Callable[[], torch.Tensor], dict[str, Any]]:
    """The step as a user writes it, and the namespace the probe finds its model and optimizer in."""
    torch.manual_seed(SEED)
    model = workload.model().to(device)
    opt = workload.optimizer(model.parameters())
    batch, loss_fn = workload.batch, workload.loss

    def step() -> torch.Tensor:
        x, y = batch()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    step.__name__ = step.__qualname__ = workload.name.replace("-", "_")
    return step, {"model": model, "opt": opt}


@dataclass
class HandWritten:
    """One configuration written into the step by hand; `switches` are the process-wide flags it sets."""

    members: tuple[str, ...]
    step: Callable[[], torch.Tensor]
    switches: dict[str, Any] = field(default_factory=dict)
    first_call_seconds: float = 0.0
    steady_seconds: float = 0.0

    @property
    def compile_seconds(self) -> float | None:
        if not any(member in COMPILE_OPTIONS for member in self.members):
            return None
        return max(0.0, self.first_call_seconds - self.steady_seconds)


def hand_written(workload: Workload, members: tuple[str, ...], device: torch.device, fused: bool) -> HandWritten:
    """The user's step rewritten with `members` in it, as `result.code()` spells them; a fresh model from SEED."""
    chosen = set(members)
    device_type = device.type
    torch.manual_seed(SEED)
    model = workload.model().to(device)
    channels_last = "channels-last" in chosen
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    implementation = ({"fused": True} if fused else {"foreach": True}) if "fused-optimizer" in chosen else {}
    opt = workload.optimizer(model.parameters(), **implementation)
    # As result.code() says: torch.compile(model), which compiles the forward (model.compile() compiles
    # Module._call_impl, and the two give different graphs: on the cnn 1.14x against 1.86x here).
    if "compile" in chosen:
        model = torch.compile(model)
    if "compile-reduce-overhead" in chosen:
        model = torch.compile(model, mode="reduce-overhead")
    amp_dtype = torch.bfloat16 if "amp-bf16" in chosen else torch.float16 if "amp-fp16" in chosen else None
    scaler = torch.amp.GradScaler(device_type) if "amp-fp16" in chosen else None
    batch, loss_fn = workload.batch, workload.loss
    convert = channels_last and workload.images

    def step() -> torch.Tensor:
        x, y = batch()
        if convert:
            x = x.to(memory_format=torch.channels_last)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type, dtype=amp_dtype) if amp_dtype is not None else contextlib.nullcontext():
            loss = loss_fn(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss

    switches: dict[str, Any] = {}
    if "tf32" in chosen:
        switches.update(matmul_precision="high", cudnn_tf32=True)
    if "cudnn-benchmark" in chosen:
        switches["cudnn_benchmark"] = True
    return HandWritten(members, step, switches)


@contextlib.contextmanager
def switched(switches: dict[str, Any]) -> Iterator[None]:
    """The hand-written configuration's global flags, on only while it runs (the baseline must not see them)."""
    before = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    if "matmul_precision" in switches:
        torch.set_float32_matmul_precision(switches["matmul_precision"])
    if "cudnn_tf32" in switches:
        torch.backends.cudnn.allow_tf32 = switches["cudnn_tf32"]
    if "cudnn_benchmark" in switches:
        torch.backends.cudnn.benchmark = switches["cudnn_benchmark"]
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = before[1], before[2]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm_up(config: HandWritten, device: torch.device) -> None:
    """Untimed calls: compilation (first call, often a second), allocator growth; the first call's excess is kept."""
    with switched(config.switches):
        times = []
        for _ in range(HAND_WARMUP_CALLS):
            synchronize(device)
            began = time.perf_counter()
            config.step()
            synchronize(device)
            times.append(time.perf_counter() - began)
    config.first_call_seconds, config.steady_seconds = sum(times[:-1]), times[-1] * (len(times) - 1)


def time_by_hand(configs: list[HandWritten], rounds: int, min_run_time: float) -> list[list[float]]:
    """Every configuration's Timer median in each round; each round in a rotated order."""
    timers = [benchmark.Timer(stmt="step()", globals={"step": config.step}, num_threads=torch.get_num_threads())
              for config in configs]
    medians: list[list[float]] = [[] for _ in configs]
    for round_index in range(rounds):
        order = list(range(len(configs)))
        shift = round_index % len(order)
        for index in order[shift:] + order[:shift]:
            with switched(configs[index].switches):
                medians[index].append(timers[index].blocked_autorange(min_run_time=min_run_time).median)
    return medians


# -- one step ---------------------------------------------------------------------------------------------------


@dataclass
class Comparison:
    trial: OptionTrial
    hand: HandWritten
    timer_medians: list[float]
    timer_speedup: float

    @property
    def ratio(self) -> float | None:
        return self.trial.speedup / self.timer_speedup if self.trial.speedup and self.timer_speedup else None


@dataclass
class Row:
    workload: Workload
    result: SpeedProbeResult
    baseline: HandWritten
    baseline_medians: list[float]
    comparisons: list[Comparison]
    hand_seconds: float  # building, warming and timing the hand-written configurations

    @property
    def compile_seconds(self) -> float:
        trials = [*self.result.options, *([self.result.combination] if self.result.combination else [])]
        return sum(trial.compile_seconds or 0.0 for trial in trials)

    @property
    def timer_noise(self) -> float:
        return max(self.baseline_medians) / min(self.baseline_medians) - 1

    @property
    def probe_noise(self) -> float | None:
        """The probe's baseline before and after the options (the two halves of its times): their medians' spread."""
        times = self.result.baseline.times
        half = len(times) // 2
        if half < 2:
            return None
        first, second = statistics.median(times[:half]), statistics.median(times[half:])
        return max(first, second) / min(first, second) - 1


def reset_compiled() -> None:
    """Drop compiled code between steps and sides, so no side runs on the other's cache entries or hits the limit."""
    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset()


def run_workload(workload: Workload, device: torch.device, args: argparse.Namespace) -> Row:
    reset_compiled()
    step, namespace = user_step(workload, device)
    result = probe_speed(step, options=args.options, steps=args.steps, namespace=namespace)
    reset_compiled()
    began = time.perf_counter()
    fused = result.code_context.fused
    measured = [trial for trial in result.options if trial.measured]
    if result.combination is not None and result.combination.measured:
        measured.append(result.combination)
    configs = [hand_written(workload, (), device, fused)]
    configs += [hand_written(workload, trial.members, device, fused) for trial in measured]
    for config in configs:
        warm_up(config, device)
    medians = time_by_hand(configs, args.rounds, args.min_run_time)
    baseline_median = statistics.median(medians[0])
    comparisons = [Comparison(trial, config, times, baseline_median / statistics.median(times))
                   for trial, config, times in zip(measured, configs[1:], medians[1:], strict=True)]
    return Row(workload, result, configs[0], medians[0], comparisons, time.perf_counter() - began)


# -- output -----------------------------------------------------------------------------------------------------


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds * 1e3:.3g}" if seconds >= 1e-3 else f"{seconds * 1e3:.3f}"


def _ratio_cell(ratio: float | None) -> str:
    if ratio is None:
        return "—"
    low, high = RATIO_GOAL
    return f"{ratio:.3f}" + ("" if low <= ratio <= high else " ✗")


def _agrees(trial: OptionTrial) -> str:
    return {True: "yes", False: "NO", None: "—"}[trial.agrees]


HEADINGS = ("step", "configuration", "ours: ms, speed-up", "Timer: ms, speed-up", "ours / Timer", "agrees",
            "compile s: ours / hand")


def table_rows(rows: list[Row]) -> list[tuple[str, ...]]:
    out = []
    for row in rows:
        result = row.result
        out.append((row.workload.name, "baseline", f"{_ms(result.baseline.seconds)}",
                    f"{_ms(statistics.median(row.baseline_medians))}", "", "", ""))
        for comparison in row.comparisons:
            trial = comparison.trial
            combined = " (combination)" if len(trial.members) > 1 else ""
            best = " ★" if result.best is not None and result.best.name == trial.name else ""
            compile_cell = ""
            if comparison.hand.compile_seconds is not None:
                compile_cell = f"{trial.compile_seconds or 0:.1f} / {comparison.hand.compile_seconds:.1f}"
            out.append(("", f"{trial.title}{combined}{best}",
                        f"{_ms(trial.seconds)}, {trial.speedup:.2f}x",
                        f"{_ms(statistics.median(comparison.timer_medians))}, {comparison.timer_speedup:.2f}x",
                        _ratio_cell(comparison.ratio), _agrees(trial), compile_cell))
    return out


def print_details(rows: list[Row], device: torch.device) -> None:
    print("\nPer step: the probe's wall time, noise, the launch profile, what was skipped and why:")
    for row in rows:
        result = row.result
        wall = result.seconds
        without = wall - row.compile_seconds
        goal = "" if without <= WALL_GOAL_SECONDS else " ✗"
        probe_noise = f"{row.probe_noise:.1%}" if row.probe_noise is not None else "—"
        print(f"- {row.workload.name} ({row.workload.what}), {result.device}, batch {result.batch_size}:")
        print(f"    ours' wall time {wall:.1f} s, {without:.1f} s without compilation{goal} "
              f"(compile {row.compile_seconds:.1f} s); the hand-written side took {row.hand_seconds:.1f} s")
        print(f"    noise: Timer baseline rounds {row.timer_noise:.1%} ({len(row.baseline_medians)} rounds, "
              f"{', '.join(_ms(value) for value in row.baseline_medians)} ms); "
              f"ours baseline start vs end {probe_noise}; "
              f"ours' baseline {_ms(result.baseline.seconds)} ms against Timer's "
              f"{_ms(statistics.median(row.baseline_medians))} ms")
        if result.launch is not None:
            launch = result.launch
            print(f"    launch: {launch.ops} ops on {launch.device}, {launch.seconds_per_op * 1e6:.1f} µs per op, "
                  f"launch-bound {launch.launch_bound}")
        agreeing = [trial.name for trial in result.options if trial.agrees is True]
        disagreeing = [trial.name for trial in result.options if trial.agrees is False]
        print(f"    agree: {', '.join(agreeing) or 'none'}; do not agree: {', '.join(disagreeing) or 'none'}")
        for trial in result.options:
            if trial.agrees is False and trial.agreement is not None:
                print(f"      {trial.name}: {trial.agreement.failure}")
        print(f"    best: {result.best.title if result.best else 'keep the step as it is'}; "
              f"fastest by hand: {fastest_by_hand(row)}")
        for trial in result.options:
            if trial.skipped is not None:
                print(f"    skipped {trial.name}: {trial.skipped}")
            elif trial.error is not None:
                print(f"    {trial.name} raised {trial.error}")
        for note in result.notes:
            print(f"    note: {note}")
    if device.type == "cuda":
        gpu_goals(rows)
    else:
        print(f"\nGPU goals (AMP >= {GPU_AMP_GOAL:g}x on recipe-mlp, tiny-mlp launch-bound): not measured, no GPU")


def fastest_by_hand(row: Row) -> str:
    """The hand-written configuration Timer found fastest among those the probe says agree."""
    agreeing = [comparison for comparison in row.comparisons if comparison.trial.agrees is True]
    if not agreeing:
        return "no agreeing option"
    fastest = max(agreeing, key=lambda comparison: comparison.timer_speedup)
    return f"{title_of(fastest.trial.members)} {fastest.timer_speedup:.2f}x"


def gpu_goals(rows: list[Row]) -> None:
    by_name = {row.workload.name: row for row in rows}
    print()
    if "recipe-mlp" in by_name:
        amp = [trial for trial in by_name["recipe-mlp"].result.options
               if trial.name.startswith("amp") and trial.speedup is not None]
        best = max(amp, key=lambda trial: trial.speedup or 0, default=None)
        if best is not None:
            met = "met" if (best.speedup or 0) >= GPU_AMP_GOAL else "NOT met"
            print(f"GPU goal AMP >= {GPU_AMP_GOAL:g}x on recipe-mlp: {best.title} {best.speedup:.2f}x, {met}")
    if "tiny-mlp" in by_name and by_name["tiny-mlp"].result.launch is not None:
        bound = by_name["tiny-mlp"].result.launch.launch_bound
        print(f"GPU goal tiny-mlp launch-bound: {bound}, {'met' if bound else 'NOT met'}")


def summary(rows: list[Row]) -> None:
    ratios = [comparison.ratio for row in rows for comparison in row.comparisons if comparison.ratio is not None]
    low, high = RATIO_GOAL
    within = sum(low <= ratio <= high for ratio in ratios)
    walls = [row.result.seconds - row.compile_seconds for row in rows]
    if ratios:
        print(f"\nours / Timer: {min(ratios):.3f}–{max(ratios):.3f}, within {low:.2f}–{high:.2f} on {within} of "
              f"{len(ratios)}; Timer baseline rounds moved {min(row.timer_noise for row in rows):.1%}–"
              f"{max(row.timer_noise for row in rows):.1%}")
    print(f"ours' wall time without compilation: {min(walls):.1f}–{max(walls):.1f} s (goal <= "
          f"{WALL_GOAL_SECONDS:.0f} s on {sum(wall <= WALL_GOAL_SECONDS for wall in walls)} of {len(walls)}); "
          f"with it: {', '.join(f'{row.workload.name} {row.result.seconds:.1f} s' for row in rows)}")


# -- main -------------------------------------------------------------------------------------------------------


def chosen_options(args: argparse.Namespace) -> list[str] | None:
    """--try as given, or every option; --no-compile (and --quick) take the compile options out."""
    names = [name.strip() for name in args.try_options.split(",") if name.strip()] if args.try_options else None
    if not args.no_compile:
        return names
    return [name for name in (names or OPTION_NAMES) if name not in COMPILE_OPTIONS]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 steps, no compile, 2 rounds of 0.3 s")
    parser.add_argument("--steps", type=int, default=None, help="steps per configuration (%%speedprobe --steps)")
    parser.add_argument("--try", dest="try_options", default=None, help="options, comma-separated (--try)")
    parser.add_argument("--no-compile", action="store_true", help="leave compile and compile-reduce-overhead out")
    parser.add_argument("--models", default="cnn,transformer,recipe-mlp,tiny-mlp")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved Timer rounds (default 3, quick 2)")
    parser.add_argument("--min-run-time", type=float, default=None,
                        help="blocked_autorange's min_run_time, seconds (default 1.0, quick 0.3)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads, both sides (default 1, see the docstring; 0: torch's default)")
    parser.add_argument("--warm-cache", action="store_true",
                        help="compile with the usual inductor cache instead of a fresh, empty one")
    parser.add_argument("--without-ticker", action="store_true",
                        help="diagnostic: the probe's progress clock does not wake its thread every step")
    parser.add_argument("--markdown", action="store_true", help="the table as Markdown, to paste in docs")
    args = parser.parse_args()
    args.steps = args.steps or (8 if args.quick else 20)
    args.rounds = args.rounds or (2 if args.quick else 3)
    args.min_run_time = args.min_run_time or (0.3 if args.quick else 1.0)
    args.no_compile = args.no_compile or args.quick
    args.options = chosen_options(args)
    return args


def prepare(args: argparse.Namespace, stack: contextlib.ExitStack) -> None:
    """Threads, the compile cache and the diagnostic, before anything runs; the stack removes the cache."""
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if not args.warm_cache:
        # Read when inductor (and, on CUDA, triton) first compiles, not at import: setting them here is in time.
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-speedprobe-compile-"))
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(folder, "inductor")
        os.environ["TRITON_CACHE_DIR"] = os.path.join(folder, "triton")
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = RECOMPILE_LIMIT
    if args.without_ticker:
        from jupyter_gpu.probekit.ticker import Ticker

        Ticker.resume = lambda self, text: None  # no thread started, nothing woken; the bench shows no progress


def main() -> None:
    args = parse_args()
    device = torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")
    available = workloads(device)
    names = [name.strip() for name in args.models.split(",") if name.strip()]
    unknown = [name for name in names if name not in available]
    if unknown:
        raise SystemExit(f"unknown model {unknown[0]!r}; choose from {', '.join(available)}")
    with contextlib.ExitStack() as stack:
        prepare(args, stack)
        where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {os.cpu_count()} CPUs"
        print(f"torch {torch.__version__}, Python {platform.python_version()}, {where}, "
              f"{torch.get_num_threads()} torch threads; steps {args.steps}, options "
              f"{', '.join(args.options) if args.options else 'all'}; Timer: {args.rounds} rounds of "
              f"blocked_autorange(min_run_time={args.min_run_time:g}); compile cache "
              f"{'as it is' if args.warm_cache else 'fresh (cold compiles)'}"
              f"{'; WITHOUT the probe ticker (diagnostic)' if args.without_ticker else ''}\n", flush=True)
        begun = time.perf_counter()
        rows = []
        for name in names:
            row = run_workload(available[name], device, args)
            rows.append(row)
            print(f"done: {name} (ours {row.result.seconds:.1f} s, by hand {row.hand_seconds:.1f} s)", flush=True)
        print()
        print_table(HEADINGS, table_rows(rows), args.markdown)
        summary(rows)
        print_details(rows, device)
        print(f"\nWhole run: {time.perf_counter() - begun:.1f} s")


if __name__ == "__main__":
    main()
