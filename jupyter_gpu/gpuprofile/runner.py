"""Run `%%gpuprofile`: the user's cell under the hooks, stopped after the steps it needs, the training state put back,
then the measured ceiling, the breakdown, the plan and the ready-made probe steps.

The cell runs as written, in the notebook's namespace. What it changes in training state (models, optimizers,
schedulers, GradScaler, random generators, the global flags) is put back bitwise afterwards, unless `keep`.
"""

from __future__ import annotations

import gc
import linecache
import platform
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpu.gpuprofile import lift, plan
from jupyter_gpu.gpuprofile.instrument import ONE_RUN, Instruments, ProfilePlan, StopProfile, loaders_seen
from jupyter_gpu.gpuprofile.kernels import analyse
from jupyter_gpu.gpuprofile.peaks import BF16, FP16, FP32, TF32, find_peak
from jupyter_gpu.gpuprofile.result import (
    BACKWARD,
    BUCKETS,
    DATA,
    FORWARD,
    OPTIMIZER,
    Bucket,
    Ceiling,
    Copies,
    Operator,
    ProfileResult,
    Sync,
    middle_half,
)
from jupyter_gpu.kernel_torch import cuda_initialized
from jupyter_gpu.probekit.ticker import Ticker
from jupyter_gpu.probekit.training_state import StateSnapshot, find_training_objects

DEFAULT_STEPS = 20
DEFAULT_WARMUP = 5
TOP_OPERATORS = 10

Progress = Callable[[str], None]


class GpuProfileError(RuntimeError):
    """The profile cannot run; the message is one sentence for the user."""


@dataclass(frozen=True)
class ProfileRequest:
    steps: int | None = DEFAULT_STEPS
    warmup: int = DEFAULT_WARMUP
    seconds: float | None = None
    keep: bool = False
    apply: bool = False      # then run the loop again with the fixes that need no edit, and compare
    compile: bool = False    # --apply may try torch.compile too


@dataclass
class Profiled:
    """The result, and what the cell itself ended with: its value, or the exception to re-raise after display."""

    result: ProfileResult
    value: Any = None
    error: BaseException | None = None
    defined: list[str] = field(default_factory=list)  # names the profile defined in the namespace


def profile_training(fn: Callable[..., Any], *args: Any, steps: int = DEFAULT_STEPS, warmup: int = DEFAULT_WARMUP,
                     seconds: float | None = None, keep: bool = False, namespace: dict[str, Any] | None = None,
                     **kwargs: Any) -> ProfileResult:
    """Profile `fn(*args, **kwargs)`, a function that trains (e.g. one epoch), as `%gpuprofile` does, for scripts.

    The model, optimizer, scheduler and scaler are found among the arguments and in `namespace` (by default the
    function's module globals) and put back afterwards unless `keep`. The cell's error, if any, is raised after
    the profile was taken; Ctrl-C raises KeyboardInterrupt.
    """
    request = ProfileRequest(steps=None if seconds is not None else steps, warmup=warmup, seconds=seconds, keep=keep)
    where = namespace if namespace is not None else getattr(fn, "__globals__", {})
    arguments = {f"argument {i}": value for i, value in enumerate(args)} | dict(kwargs)
    profiled = profile_run(lambda: fn(*args, **kwargs), request, namespace=where, also=arguments)
    if profiled.error is not None:
        raise profiled.error
    return profiled.result


def profile_run(run: Callable[[], Any], request: ProfileRequest, *, namespace: dict[str, Any],
                loop_source: lift.LoopSource | None = None, progress: Progress | None = None,
                also: dict[str, Any] | None = None) -> Profiled:
    """Run `run()` (the cell, or the user's training function) under the profile. `also`: more places the training
    objects may be (a function's arguments)."""
    try:
        import torch
    except ImportError:
        raise GpuProfileError("%%gpuprofile needs PyTorch, and torch is not installed in this kernel.") from None
    objects = find_training_objects({**namespace, **(also or {})})
    from jupyter_gpu.speedprobe.flags import GlobalFlags

    snapshot = None if request.keep else StateSnapshot.take(objects)
    flags = GlobalFlags.take(torch)
    cuda_before = cuda_initialized(torch)
    if cuda_before:
        for index in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(index)
    ticker = Ticker(progress) if progress is not None else None
    instruments = Instruments(torch, ProfilePlan(warmup=request.warmup, steps=request.steps,
                                                 seconds=request.seconds),
                              on_step=(lambda text: ticker.resume(f"%%gpuprofile: {text}")) if ticker else None)
    value: Any = None
    error: BaseException | None = None
    began = time.perf_counter()
    try:
        instruments.install()
        value = run()
        instruments.finish()
    except StopProfile as stop:
        # The loop's frames hold its DataLoader iterator: clearing them shuts the workers down now.
        traceback.clear_frames(stop.__traceback__)
        del stop
    except BaseException as exc:  # shown with the partial result, then re-raised by the caller
        error = exc
    finally:
        instruments.uninstall()
        if ticker is not None:
            ticker.stop()
            progress("")  # type: ignore[misc]
    run_seconds = time.perf_counter() - began
    gc.collect()
    gpu_phases = _gpu_phase_seconds(torch, instruments)
    peak_memory = _peak_memory(torch)
    used = find_training_objects(namespace)
    before_ids = {id(obj) for obj in objects.objects()}
    created = [used.labels.get(id(obj), type(obj).__name__) for obj in used.objects() if id(obj) not in before_ids]
    if snapshot is not None:
        snapshot.restore()
    flags.restore(torch)
    result, defined, loaders = _assemble(torch, instruments, request, namespace, used, gpu_phases, peak_memory,
                                         loop_source, error, run_seconds, cuda_before)
    if created and not request.keep:
        result.notes.append(f"{', '.join(created)}: made by the cell itself, so they keep the steps it ran (only "
                            "what existed before the cell is put back).")
    if request.apply and error is None and not request.keep:
        result = _apply(torch, run, request, namespace, loop_source, progress, result, loaders)
    return Profiled(result=result, value=value, error=error, defined=defined)


def _apply(torch: Any, run: Callable[[], Any], request: ProfileRequest, namespace: dict[str, Any],
           loop_source: lift.LoopSource | None, progress: Progress | None, before: ProfileResult,
           loaders: list[str]) -> ProfileResult:
    """--apply: the probes choose and check the fixes, then the loop runs again with them, from the same state."""
    from dataclasses import replace

    from jupyter_gpu.gpuprofile.apply import applied_run, choose_fixes
    from jupyter_gpu.gpuprofile.result import AppliedFixes
    from jupyter_gpu.speedprobe.flags import GlobalFlags

    fixes = choose_fixes(torch, namespace, before, loaders, compile_too=request.compile, progress=progress)
    after = None
    if fixes.options or fixes.loader:
        objects = find_training_objects(namespace)
        snapshot, flags = StateSnapshot.take(objects), GlobalFlags.take(torch)
        device = objects.device() or torch.device("cpu")
        try:
            second = profile_run(applied_run(torch, namespace, fixes, objects, device, run),
                                 replace(request, apply=False, keep=False), namespace=namespace,
                                 loop_source=loop_source, progress=progress)
        finally:
            snapshot.restore()  # the layout channels_last changed, the fused flags: bitwise as before
            flags.restore(torch)
        if second.error is not None:
            fixes.left_out.append(("the run with the fixes", f"it raised {type(second.error).__name__}: "
                                                             f"{second.error}"))
        else:
            after = second.result.figures()
    applied = AppliedFixes(applied=fixes.titles, left_out=fixes.left_out, checked=fixes.checked, code=fixes.code,
                           before=before.figures(), after=after)
    return replace(before, applied=applied)


def _gpu_phase_seconds(torch: Any, instruments: Instruments) -> dict[tuple[int, str], float]:
    if not instruments.gpu_events or not cuda_initialized(torch):
        return {}
    torch.cuda.synchronize()
    found: dict[tuple[int, str], float] = {}
    for step, bucket, start, end in instruments.gpu_events:
        found[(step, bucket)] = found.get((step, bucket), 0.0) + start.elapsed_time(end) / 1000.0
    return found


def _peak_memory(torch: Any) -> int | None:
    if not cuda_initialized(torch):
        return None
    return max((int(torch.cuda.max_memory_allocated(i)) for i in range(torch.cuda.device_count())), default=None)


def _device_of(torch: Any, objects: Any, instruments: Instruments) -> str:
    device = objects.device()
    if device is not None:
        return str(device)
    return "cuda" if instruments.gpu_events else "cpu"


def _device_name(torch: Any, device: str) -> str:
    if device.startswith("cuda") and cuda_initialized(torch):
        return str(torch.cuda.get_device_name(torch.device(device).index or 0))
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def _compute_format(torch: Any, device: str, flops_by_dtype: dict[str, int]) -> str:
    """The format carrying most of the step's FLOPs: bf16/fp16 (autocast or low-precision weights), else fp32,
    which runs as TF32 on a CUDA device where TF32 is enabled."""
    if not flops_by_dtype:
        return FP32
    dtype = max(flops_by_dtype, key=flops_by_dtype.__getitem__)
    if dtype == "torch.bfloat16":
        return BF16
    if dtype == "torch.float16":
        return FP16
    if device.startswith("cuda"):
        from jupyter_gpu.speedprobe.flags import tf32_enabled

        if tf32_enabled(torch):
            return TF32
    return FP32


def _assemble(torch: Any, instruments: Instruments, request: ProfileRequest, namespace: dict[str, Any], used: Any,
              gpu_phases: dict[tuple[int, str], float], peak_memory: int | None, loop_source: lift.LoopSource | None,
              error: BaseException | None, run_seconds: float, cuda_before: bool
              ) -> tuple[ProfileResult, list[str], list[str]]:
    records = instruments.records
    warmup = min(request.warmup, max(len(records) - 1, 0)) if instruments.mode != ONE_RUN else 0
    profiled = records[warmup:]
    warm = records[:warmup]
    device = _device_of(torch, used, instruments)
    notes: list[str] = []
    not_measured: list[str] = []
    wanted = request.steps or 0
    if instruments.mode == ONE_RUN:
        notes.append("No optimizer step and no DataLoader batch: the cell's one run is profiled as one step.")
    elif error is None and not instruments.stopped and request.steps and len(profiled) < wanted:
        notes.append(f"The cell ended after {len(records)} {instruments.mode}: {len(warm)} warm-up and "
                     f"{len(profiled)} profiled instead of {request.warmup} + {wanted}.")
    if instruments.mode == "DataLoader batches":
        notes.append("No optimizer step ran, so each DataLoader batch is a step (an evaluation or inference loop).")
    if isinstance(error, KeyboardInterrupt):
        notes.append(f"Interrupted after {len(records)} steps: what was measured is shown.")
    step_seconds = [r.seconds for r in profiled]
    middle = middle_half(step_seconds)
    step = statistics.fmean(step_seconds[i] for i in middle) if middle else 0.0
    breakdown = []
    for key in BUCKETS:
        values = [r.buckets.get(key, 0.0) for r in profiled]
        if not values or (not any(values) and key not in (DATA, FORWARD, BACKWARD, OPTIMIZER)):
            continue
        seconds = statistics.fmean(values[i] for i in middle)
        gpu = [gpu_phases.get((warmup + i, key), 0.0) for i in middle] if gpu_phases else []
        breakdown.append(Bucket(key=key, seconds=seconds, low=min(values), high=max(values),
                                share=seconds / step if step else 0.0,
                                gpu_seconds=statistics.fmean(gpu) if gpu and any(gpu) else None))
    steps = max(len(profiled), 1)
    sites: dict[tuple[str, int], list[float]] = {}
    for record in profiled:
        for site, calls in record.sync_calls.items():
            entry = sites.setdefault(site, [0.0, 0.0])
            entry[0] += calls
            entry[1] += record.sync_seconds.get(site, 0.0)
    syncs = sorted((Sync(file=site[0], line=site[1], source=instruments.sync_source(site),
                         kinds=tuple(instruments.sites[site].kinds), per_step=calls / steps, seconds=seconds / steps)
                    for site, (calls, seconds) in sites.items()), key=lambda s: (-s.seconds, -s.per_step, s.line))
    copies = None
    if any(r.copies for r in profiled):
        copies = Copies(count=sum(r.copies for r in profiled) / steps,
                        bytes=sum(r.copy_bytes for r in profiled) / steps,
                        pageable=sum(r.pageable_copies for r in profiled) / steps,
                        blocking=sum(r.blocking_copies for r in profiled) / steps,
                        seconds=sum(r.buckets.get("copies", 0.0) for r in profiled) / steps)
    totals = instruments.census_totals
    flops = totals.flops if totals is not None and totals.flops else None
    compute = _compute_format(torch, device, totals.flops_by_dtype if totals is not None else {})
    if totals is None and profiled:
        not_measured.append("FLOPs and operators: the cell stopped before the extra step they are counted on.")
    ceiling = _ceiling(torch, device, compute, notes, not_measured, sum(step_seconds))
    timeline = analyse(instruments.kernel_events, instruments.kernel_steps, instruments.kernel_window)
    operators, memory_share = _operators(totals, ceiling)
    if not device.startswith("cuda"):
        not_measured.append("On the CPU: no GPU timeline, no per-phase GPU time and no datasheet MFU; the measured "
                            "matmul ceiling applies instead.")
    elif timeline is None:
        not_measured.append("The GPU timeline (busy %, idle time, kernels per step): "
                            + (instruments.timeline_error or "the cell stopped before its steps ran") + ".")
        if ceiling is not None and ceiling.datasheet_flops is None:
            not_measured.append(f"MFU: {_device_name(torch, device)} has no {compute} peak in the table "
                                "(peak unknown); the measured ceiling applies.")
    overhead = _overhead(torch, profiled)
    loaders = loaders_seen(namespace, instruments.samplers, torch.utils.data.DataLoader)
    ready, defined = lift.ready_steps(loop_source, instruments.loop_sites, namespace, loaders,
                                      accumulation=_accumulation(instruments), batch=instruments.last_batch)
    _define(ready, namespace, instruments.last_batch if defined else None)
    result = ProfileResult(
        device=device, device_name=_device_name(torch, device), counted=instruments.mode or ONE_RUN,
        step_seconds=step_seconds, warmup_seconds=[r.seconds for r in warm], requested=request.steps or 0,
        breakdown=breakdown, syncs=syncs, copies=copies, flops=flops, compute=compute, ceiling=ceiling,
        operators=operators, memory_bound_share=memory_share, peak_memory=peak_memory,
        batch_size=instruments.batch_size, overhead_seconds=overhead, not_measured=not_measured, notes=notes,
        interrupted=isinstance(error, KeyboardInterrupt),
        error=None if error is None or isinstance(error, KeyboardInterrupt) else f"{type(error).__name__}: {error}",
        gpu_timeline=timeline, gpu_busy=timeline.busy if timeline else None,
        ready_steps=ready, losses=[statistics.fmean(float(t) for t in r.losses) for r in profiled if r.losses])
    total_memory = None
    if device.startswith("cuda") and cuda_initialized(torch):
        total_memory = int(torch.cuda.get_device_properties(torch.device(device).index or 0).total_memory)
    result = plan.with_plan(result, loaders=loaders, total_memory=total_memory)
    return result, defined, loaders


def _define(ready: list[Any], namespace: dict[str, Any], batch: Any) -> None:
    """Define the lifted steps in the notebook, their source in the line cache so a traceback shows it."""
    for step in ready:
        if step.name is None:
            continue
        filename = f"<%%gpuprofile {step.name}>"
        linecache.cache[filename] = (len(step.code), None, step.code.splitlines(True), filename)
        exec(compile(step.code, filename, "exec"), namespace)
    if batch is not None:
        namespace[lift.BATCH] = batch


def _accumulation(instruments: Instruments) -> int:
    """DataLoader batches per optimizer step (gradient accumulation), from what the loop did."""
    if not instruments.optimizer_steps or not instruments.batches:
        return 1
    return max(1, round(instruments.batches / instruments.optimizer_steps))


# The measured ceiling takes a tenth of the profiled steps' time, within these bounds: on a loop of 1 ms steps the
# profile stays short, on a slow one the matmul is timed long enough to be steady.
CEILING_SHARE, CEILING_MIN_SECONDS, CEILING_MAX_SECONDS = 0.1, 0.05, 0.35


def _ceiling(torch: Any, device: str, compute: str, notes: list[str], not_measured: list[str],
             profiled_seconds: float) -> Ceiling | None:
    from jupyter_gpu.gpuprofile.ceiling import measure_ceiling

    try:
        budget = min(max(CEILING_SHARE * profiled_seconds, CEILING_MIN_SECONDS), CEILING_MAX_SECONDS)
        matmul, bandwidth, seconds = measure_ceiling(torch, device, compute, budget)
    except (RuntimeError, TypeError) as exc:
        not_measured.append(f"The measured ceiling: a {compute} matmul on {device} failed ({exc}).")
        return None
    peak = find_peak(_device_name(torch, device)) if device.startswith("cuda") else None
    return Ceiling(device=device, compute=compute, matmul_flops=matmul, bandwidth=bandwidth, seconds=seconds,
                   datasheet_name=peak.name if peak else None,
                   datasheet_flops=peak.peak_flops(compute) if peak else None,
                   datasheet_bandwidth=peak.bandwidth_gbs * 1e9 if peak else None,
                   datasheet_source=peak.source if peak else None)


def _operators(totals: Any, ceiling: Ceiling | None) -> tuple[list[Operator], float | None]:
    if totals is None:
        return [], None
    ridge = ceiling.ridge_point if ceiling else None
    found = []
    for name, count in totals.operators.items():
        if not count.bytes and not count.flops:
            continue  # views and metadata: nothing computed, nothing moved
        intensity = count.flops / count.bytes if count.bytes else None
        bound = None if ridge is None or intensity is None else ("compute" if intensity >= ridge else "memory")
        if ridge is not None and count.bytes and not count.flops:
            bound = "memory"  # no FLOPs counted (elementwise, norms, copies): it only moves data
        found.append(Operator(name=name, calls=count.calls, seconds=count.seconds, flops=count.flops,
                              bytes=count.bytes, bound=bound))
    found.sort(key=lambda op: -op.seconds)
    total = sum(op.seconds for op in found)
    memory = sum(op.seconds for op in found if op.bound == "memory")
    return found[:TOP_OPERATORS], (memory / total if total and ridge is not None else None)


def _overhead(torch: Any, profiled: list[Any]) -> float | None:
    """The hooks' own cost per step: what one hooked module call and one timeline event cost here, measured now,
    times how many of each a profiled step made."""
    if not profiled:
        return None
    module = torch.nn.Identity()
    tensor = torch.zeros(1)
    calls = 500

    def timed() -> float:
        began = time.perf_counter()
        for _ in range(calls):
            module(tensor)
        return time.perf_counter() - began

    bare = min(timed() for _ in range(3))
    scratch = Instruments(torch, ProfilePlan(warmup=10 ** 9, steps=None, seconds=None, census=False))
    scratch.install()
    try:
        hooked = min(timed() for _ in range(3))
    finally:
        scratch.uninstall()
    per_call = max(hooked - bare, 0.0) / calls
    module_calls = statistics.median(r.module_calls for r in profiled)
    events = statistics.median(r.events for r in profiled)
    return module_calls * per_call + max(events - module_calls, 0) * per_call / 2
