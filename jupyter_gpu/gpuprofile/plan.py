"""What to fix first: the causes the profile measured, ranked by the time each loses per step, each with its ceiling
(the speed-up if that time went to zero) and the exact next thing to type. Pure Python.

Thresholds are the ones users already know: the TensorBoard profiler flagged data loading above 5% of the step;
below that, a fix cannot buy more than 5%.
"""

from __future__ import annotations

import os
from dataclasses import replace

from jupyter_gpu.gpuprofile.commands import needs_first
from jupyter_gpu.gpuprofile.line_time import other_time_advice
from jupyter_gpu.gpuprofile.result import (
    BUCKET_TITLES,
    COPIES,
    DATA,
    GC,
    OTHER,
    SYNC,
    PlanItem,
    ProfileResult,
    ReadyStep,
    how_often,
)
from jupyter_gpu.rendering.units import format_seconds
from jupyter_gpu.speedprobe.catalog import CodeContext, adopt_lines

DATA_SHARE = 0.05
COPY_SHARE = 0.02
GC_SHARE = 0.02
OTHER_SHARE = 0.10
MEMORY_BOUND_SHARE = 0.30
OPTIMIZER_SHARE = 0.30  # the optimizer step's kernels, of all operator time: its own item, with its own fix
SMALL_MEMORY_SHARE = 0.5


def speedup_ceiling(step: float, seconds: float) -> float | None:
    """step / (step - seconds): the speed-up if `seconds` of each step went to zero."""
    return step / (step - seconds) if 0 < seconds < step else None


def _ready(result: ProfileResult, probe: str) -> ReadyStep | None:
    return next((r for r in result.ready_steps if r.probe == probe), None)


def _command(result: ProfileResult, probe: str, fallback: str, options: str = "") -> str:
    """The ready step's command for `probe` (with `options` added), as it runs when pasted. Where the step could not
    be lifted, the command needs the wrapper "Ready steps" prints filled in first, and the line says so with its name
    (the plan and the "Ready steps" section name the same function): pasted bare, `%speedprobe train_step` failed
    with "there is no step function 'train_step' in the notebook". `fallback` where there is no ready step at all
    (a result built without them: a profile that ran no step shows no plan)."""
    ready = _ready(result, probe)
    if ready is None:
        return f"{fallback}{options}"
    command = f"{ready.command}{options}"
    return command if ready.name else needs_first(ready, command)


def compile_lines(models: list[str], option: str = "compile") -> str:
    """`G = torch.compile(G); D = torch.compile(D)`: %speedprobe's lines for its compile `option`, one per model
    the loop called, by the notebook's names."""
    return "; ".join(adopt_lines((option,), CodeContext(models=tuple(models) or ("model",))))


def _loader_advice(workers: int | None) -> str:
    """What may shorten the wait, never what the loader already does: "more workers" to a loader with one per core
    would be advice it cannot follow."""
    if workers is None:
        return "more workers, pinned memory or a lighter transform"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if workers >= cores:
        return (f"its {workers} workers already match this machine's {cores} CPU cores: a lighter transform, "
                "samples cached decoded, pinned memory or a deeper prefetch")
    return f"more workers than its {workers}, pinned memory or a lighter transform"


def _speed_options(result: ProfileResult) -> str:
    """The %speedprobe options that can still change this step, leaving out what it already does: mixed precision
    to a step already in bf16 or fp16, a fused optimizer to one that ran fused kernels, torch.compile where every
    model is compiled."""
    options = [*([] if result.compute in ("bf16", "fp16") else ["mixed precision"]), "channels_last",
               *([] if result.optimizer_fused else ["fused optimizers"]),
               *([] if result.all_models_compiled else ["torch.compile"])]
    verb = "is" if len(options) == 1 else "are"
    listed = options[0] if len(options) == 1 else f"{', '.join(options[:-1])} and {options[-1]}"
    return f"{listed} {verb}"


def with_plan(result: ProfileResult, *, loaders: list[str], total_memory: int | None,
              workers: int | None = None) -> ProfileResult:
    """`workers`: the loader's num_workers, where it is known (the advice then starts from it)."""
    step = result.seconds
    if not step:
        return result
    items: list[PlanItem] = []

    def add(cause: str, seconds: float, command: str, detail: str = "") -> None:
        items.append(PlanItem(cause=cause, seconds=seconds, ceiling=speedup_ceiling(step, seconds),
                              command=command, detail=detail))

    data = result.bucket(DATA)
    if data is not None and data.share >= DATA_SHARE:
        loader = loaders[0] if loaders else "LOADER"
        add("waiting for data", data.seconds,
            _command(result, "%dataprobe", f"%dataprobe {loader} --step STEP"),
            f"the host blocked in the DataLoader's next(): {_loader_advice(workers)} (%dataprobe measures which)")
    # On the CPU a read waits for nothing: its microseconds are the copy, not a stall, so it is not ranked by them.
    timed_syncs = result.device.startswith("cuda")
    for sync in result.syncs:
        if timed_syncs:
            add(f"sync at {sync.where}: {sync.source}", sync.seconds,
                f"edit {sync.where}: keep the value on the device (e.g. accumulate loss.detach()) and read it "
                "every N steps",
                f"{', '.join(sync.kinds)}, {how_often(sync.per_step)}")
    copies = result.bucket(COPIES)
    if copies is not None and copies.share >= COPY_SHARE and result.copies is not None and (
            result.copies.pageable or result.copies.blocking):
        add("host→device copies", copies.seconds,
            "DataLoader(..., pin_memory=True) and .to(device, non_blocking=True)",
            f"{how_often(result.copies.count, 'copy', 'copies')}, {result.copies.pageable:.3g} from pageable memory, "
            f"{result.copies.blocking:.3g} blocking")
    compute = _compute_seconds(result)
    if compute and result.flops and result.ceiling and result.ceiling.matmul_flops:
        at_ceiling = result.flops / result.ceiling.matmul_flops
        if compute > at_ceiling:
            share = result.of_ceiling
            add("compute below this device's matmul ceiling", compute - at_ceiling,
                _command(result, "%speedprobe", "%speedprobe STEP"),
                f"{result.compute_phases} {format_seconds(compute)} per step at "
                f"{share:.0%} of what a big {result.compute} matmul reaches here; {_speed_options(result)} "
                "measured by %speedprobe" if share is not None else "")
    # Models already compiled are not told to compile; when every model the loop called is, fusion is done.
    if (result.memory_bound_share is not None and result.memory_bound_share >= MEMORY_BOUND_SHARE and compute
            and not result.all_models_compiled):
        # The share is of the model's own operator time; the optimizer's part of the compute is not the model's.
        model_share = 1.0 - (result.optimizer_share or 0.0)
        add("memory-bound operators (fusion candidates)", compute * model_share * result.memory_bound_share,
            f"{compile_lines(result.uncompiled_models)}  "
            f"(or {_command(result, '%speedprobe', '%speedprobe STEP', ' --try compile')})",
            f"{result.memory_bound_share:.0%} of the model's operator time in operators below the ridge point")
    if (result.optimizer_share is not None and result.optimizer_share >= OPTIMIZER_SHARE and compute
            and not result.optimizer_fused):
        add("the optimizer's step (an unfused optimizer: one pass over every parameter and its state per operation)",
            compute * result.optimizer_share,
            f"{_command(result, '%speedprobe', '%speedprobe STEP', ' --try fused-optimizer')}  (or pass fused=True "
            "where the optimizer is made)",
            f"{result.optimizer_share:.0%} of operator time in the optimizer's own kernels, not the model's: a "
            "fused optimizer updates each parameter in one kernel; compiling the model does not touch them")
    timeline = result.gpu_timeline
    if timeline is not None and timeline.launch_bound:
        add("launch-bound: the GPU waits between many short kernels", timeline.launch_wait + timeline.kernel_wait,
            f"{compile_lines(result.models, 'compile-reduce-overhead')}  (fusion and CUDA graphs)",
            f"{timeline.kernels_per_step:.0f} kernels per step, median {format_seconds(timeline.median_kernel)}, "
            f"GPU busy {timeline.busy:.0%}")
    gc_bucket = result.bucket(GC)
    if gc_bucket is not None and gc_bucket.share >= GC_SHARE:
        add("garbage collection pauses", gc_bucket.seconds,
            "import gc; gc.freeze()  (after the model and data are built)",
            "Python's cycle collector walked every object the notebook holds")
    stalls = _stalls_item(result, loaders)
    if stalls is not None:
        items.append(stalls)
    other = result.bucket(OTHER)
    if other is not None and other.share >= OTHER_SHARE:
        # Measured line by line (line_time.py), not guessed: nanoGPT's was making batches and clipping, not its print.
        add("other host time", other.seconds, *other_time_advice(result.other_lines, other.seconds))
    items.sort(key=lambda item: -item.seconds)
    if result.anomaly_detection:
        # Its cost is in every other figure and cannot be told apart from them: first, untimed.
        items.insert(0, PlanItem(
            cause="autograd anomaly detection is on", seconds=0.0, ceiling=None,
            command="torch.autograd.set_detect_anomaly(False)  # a debugging mode: off for training and profiling",
            detail="it records a traceback for every forward operation and checks every backward result for NaN, "
                   "in every step; every figure here includes that cost"))
    if (total_memory and result.peak_memory is not None and result.peak_memory < SMALL_MEMORY_SHARE * total_memory):
        items.append(PlanItem(cause="the step uses a small part of the GPU's memory", seconds=0.0, ceiling=None,
                              command=_command(result, "%batchprobe", "%batchprobe STEP"),
                              detail=f"peak {result.peak_memory / total_memory:.0%} of the device's memory: a "
                                     "larger batch may raise throughput"))
    for sync in result.syncs:
        if not timed_syncs:
            items.append(PlanItem(cause=f"sync at {sync.where}: {sync.source}", seconds=0.0, ceiling=None,
                                  command=f"edit {sync.where}: keep the value on the device and read it every N steps",
                                  detail=f"{', '.join(sync.kinds)}, {how_often(sync.per_step)}; free on the CPU, "
                                         "a wait for the GPU on CUDA"))
    return replace(result, plan=items)


def _stalls_item(result: ProfileResult, loaders: list[str]) -> PlanItem | None:
    """Steps that stall again and again: the typical step leaves them out, the run pays them. Their time lost per step
    is the mean step over the typical one; the fix follows the bucket they grow."""
    cause = result.stall_cause()
    mean, step = result.mean_seconds, result.seconds
    if cause is None or not mean or not step:  # a cause means stalls that raise the mean step above the typical
        return None
    stalled = [result.step_seconds[i] for i in result.stalled_steps]
    commands = {
        DATA: _command(result, "%dataprobe", f"%dataprobe {loaders[0] if loaders else 'LOADER'} --step STEP"),
        GC: "import gc; gc.freeze()  (after the model and data are built)",
        SYNC: "edit the sync lines above: read values every N steps, not every step",
    }
    command = commands.get(cause, "look at what the loop does every few steps (evaluation, checkpoints, logging)")
    numbers = ", ".join(str(i + 1) for i in result.stalled_steps[:8]) + (", ..." if len(stalled) > 8 else "")
    return PlanItem(
        cause=f"recurring stalls, mostly {BUCKET_TITLES[cause]}", seconds=mean - step, ceiling=mean / step,
        command=command,
        detail=f"{len(stalled)} of {result.steps} profiled steps took {format_seconds(min(stalled))} - "
               f"{format_seconds(max(stalled))} (steps {numbers}) against a typical {format_seconds(step)}: the "
               f"mean step is {format_seconds(mean)}, and the typical step's shares leave the stalls out")


def _compute_seconds(result: ProfileResult) -> float:
    """Per-step time of forward, backward and optimizer: GPU time where CUDA events measured it, else host time."""
    total = 0.0
    for key in ("forward", "backward", "optimizer"):
        bucket = result.bucket(key)
        if bucket is not None:
            total += bucket.gpu_seconds if bucket.gpu_seconds is not None else bucket.seconds
    return total
