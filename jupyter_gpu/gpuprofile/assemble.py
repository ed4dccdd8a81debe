"""What the hooks recorded, turned into a `ProfileResult`: the profiled steps' buckets, syncs and copies, the census
step's FLOPs and operators, the measured ceiling and the datasheet peak, the hooks' own cost, the ready steps (defined
in the notebook) and the plan."""

from __future__ import annotations

import platform
import re
import statistics
from typing import Any

from jupyter_gpu.gpuprofile import lift, plan
from jupyter_gpu.gpuprofile.instrument import Instruments, loaders_seen, measure_hook_costs
from jupyter_gpu.gpuprofile.line_time import other_time_by_line
from jupyter_gpu.gpuprofile.peaks import BF16, FP16, FP32, TF32, find_peak
from jupyter_gpu.gpuprofile.request import ProfileRequest
from jupyter_gpu.gpuprofile.result import (
    BACKWARD,
    BATCHES,
    BUCKETS,
    DATA,
    FORWARD,
    ONE_RUN,
    OPTIMIZER,
    OPTIMIZER_STEPS,
    Bucket,
    Ceiling,
    Copies,
    Operator,
    ProfileResult,
    Sync,
    middle_half,
    typical,
)
from jupyter_gpu.gpuprofile.timeline import StepRecord
from jupyter_gpu.kernel_torch import cuda_initialized
from jupyter_gpu.probekit.training_state import TrainingObjects, compiled_how, value_at
from jupyter_gpu.rendering.units import format_seconds

TOP_OPERATORS = 10
# The measured ceiling takes a tenth of the profiled steps' time, within these bounds: on a loop of 1 ms steps the
# profile stays short, on a slow one the matmul is timed long enough to be steady.
CEILING_SHARE, CEILING_MIN_SECONDS, CEILING_MAX_SECONDS = 0.1, 0.05, 0.35


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


def assemble(torch: Any, instruments: Instruments, request: ProfileRequest, namespace: dict[str, Any], used: Any,
              gpu_phases: dict[tuple[int, str], float], peak_memory: int | None, loop_source: lift.LoopSource | None,
              error: BaseException | None, run_seconds: float, cuda_before: bool, cell: list[Any] | None = None
              ) -> tuple[ProfileResult, list[str], list[str]]:
    """`cell`: the profiled code as functions of the notebook, for the driven steps of a loop the source lifter
    refuses (gpuprofile/drive.py)."""
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
    elif error is None and not instruments.stopped and request.seconds:
        notes.append(f"The cell ended after {len(records)} {instruments.mode}, {format_seconds(run_seconds)} in all, "
                     f"before the {request.seconds:g} s asked for: {len(warm)} warm-up and {len(profiled)} profiled.")
    if instruments.mode == BATCHES:
        notes.append("No optimizer step ran, so each DataLoader batch is a step (an evaluation or inference loop).")
    if isinstance(error, KeyboardInterrupt):
        notes.append(f"Interrupted after {len(records)} steps: what was measured is shown.")
    step_seconds = [r.seconds for r in profiled]
    middle = middle_half(step_seconds)
    step = statistics.fmean(step_seconds[i] for i in middle) if middle else 0.0
    breakdown = []
    # The phases a training step has are shown even at zero (no wait for data is news); an evaluation loop, counted
    # in batches, has no backward or optimizer step to speak of.
    always = (DATA, FORWARD) if instruments.mode == BATCHES else (DATA, FORWARD, BACKWARD, OPTIMIZER)
    for key in BUCKETS:
        values = [r.buckets.get(key, 0.0) for r in profiled]
        if not values or (not any(values) and key not in always):
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
                         kinds=tuple(instruments.sites[site].kinds), per_step=calls / steps, seconds=seconds / steps,
                         function=instruments.site_functions.get(site, ""))
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
        why = ("the cell stopped" if error is not None or instruments.stopped
               else "the cell ended; fewer --steps or --seconds leave it one")
        not_measured.append(f"FLOPs and operators: {why} before the extra step they are counted on.")
    # A cell that stopped before its first step has nothing to compare with a ceiling or to lift.
    ceiling = _ceiling(torch, device, compute, notes, not_measured, sum(step_seconds)) if step_seconds else None
    timeline = instruments.kernel_timeline()
    if timeline is not None and step_seconds:
        timeline = timeline.at_step(typical(step_seconds))  # the traced steps ran with a slowed host
    operators, memory_share, optimizer_share = _operators(totals, ceiling,
                                                          instruments.operator_gpu_seconds if timeline else {})
    if totals is not None and totals.recomputed_flops and totals.flops:
        notes.append(f"The FLOPs include {totals.recomputed_flops / 1e9:.3g} GFLOP "
                     f"({totals.recomputed_flops / totals.flops:.0%}) that activation checkpointing "
                     "(torch.utils.checkpoint) recomputed in the backward: work the device did, so the TFLOP/s and "
                     "the shares of the ceiling and the peak count it, but not the model's own FLOPs.")
    unpriced = _unpriced_compute(totals)
    if unpriced:
        not_measured.append(f"FLOPs of {', '.join(unpriced)} (recurrent layers: LSTM, GRU, RNN): torch.utils."
                            "flop_counter has no formula for them, so the FLOPs, the achieved TFLOP/s and the "
                            "shares of the ceiling and of the datasheet peak leave their matrix products out, and "
                            "they are not classed compute- or memory-bound.")
    if not device.startswith("cuda"):
        not_measured.append("On the CPU: no GPU timeline, no per-phase GPU time and no datasheet MFU; the measured "
                            "matmul ceiling applies instead.")
    elif timeline is None:
        not_measured.append("The GPU timeline (busy %, idle time, kernels per step): "
                            + (instruments.timeline_error or "the cell stopped before its steps ran") + ".")
        if ceiling is not None and ceiling.datasheet_flops is None:
            not_measured.append(f"MFU: {_device_name(torch, device)} has no {compute} peak in the table "
                                "(peak unknown); the measured ceiling applies.")
    overhead = _overhead(torch, profiled, instruments.narrowed)
    other = next((bucket.seconds for bucket in breakdown if bucket.key == "other"), None)
    other_lines, line_notes, line_gaps = other_time_by_line(instruments.line_clock, instruments.line_error, other,
                                                            step or None,
                                                            lambda file, line: instruments.sync_source((file, line)),
                                                            expected=bool(step_seconds) and instruments.mode != ONE_RUN)
    notes.extend(line_notes)
    not_measured.extend(line_gaps)
    # The loop that trains, not an evaluation loop beside it: its sites, its loader first, a batch it trained on.
    trained = instruments.trained_sites
    sites = {site: count for site, count in instruments.loop_sites.items() if site in trained} if trained \
        else instruments.loop_sites
    first = [instruments.site_samplers[site] for site in sites if site in instruments.site_samplers]
    samplers = first + [sampler for sampler in instruments.samplers if not any(sampler is s for s in first)]
    loaders = loaders_seen(namespace, samplers, torch.utils.data.DataLoader)
    if not loaders and samplers:
        # A loader the loop made itself, a local of its function (`loader = DataLoader(...)` inside `fit()`): no
        # name in the notebook reaches it, so it gets one, for %dataprobe to measure.
        local_names = {name: value for site in sites if (scope := instruments.loop_scopes.get(site)) is not None
                       for name, value in scope.local_names.items()}
        made = loaders_seen(local_names, samplers, torch.utils.data.DataLoader)
        if made:
            namespace[lift.LOADER] = value_at(local_names, made[0])
            loaders = [lift.LOADER]
    batch = instruments.trained_batch if trained else instruments.last_batch
    accumulation = _accumulation(instruments, sites, profiled)
    lifted = lift.ready_steps(loop_source, sites, namespace, loaders, accumulation=accumulation, batch=batch,
                              scopes={**instruments.step_scopes, **instruments.loop_scopes},
                              step_sites=instruments.step_sites,
                              samples=_samples_in(samplers[0]) if samplers else None) if step_seconds \
        else lift.Lifted([])
    if cell and step_seconds and not any(step.name for step in lifted.steps):
        from jupyter_gpu.gpuprofile.drive import driven

        lifted = driven(lifted, cell, namespace, loaders, getattr(instruments, "dataset_batches", {}), used.models())
    notes.extend(lifted.notes)
    lift.define(lifted, namespace)
    if lift.BATCH in lifted.defined:
        namespace[lift.BATCH] = batch
    ready, defined = lifted.steps, [*lifted.defined, *([lift.LOADER] if lift.LOADER in loaders else [])]
    models, compiled_models = _models_called(instruments, used)
    result = ProfileResult(
        device=device, device_name=_device_name(torch, device), counted=instruments.mode or ONE_RUN,
        step_seconds=step_seconds, step_buckets=[{key: value for key, value in r.buckets.items() if value}
                                                 for r in profiled],
        warmup_seconds=[r.seconds for r in warm], requested=request.steps or 0,
        breakdown=breakdown, syncs=syncs, copies=copies, flops=flops, compute=compute, ceiling=ceiling,
        operators=operators, memory_bound_share=memory_share, peak_memory=peak_memory,
        optimizer_share=optimizer_share,
        optimizer_fused=totals is not None and any(name.startswith("_fused_") for name in totals.optimizer_operators),
        batch_size=instruments.batch_size, batches_per_step=accumulation, overhead_seconds=overhead,
        not_measured=not_measured, notes=notes,
        interrupted=isinstance(error, KeyboardInterrupt),
        error=None if error is None or isinstance(error, KeyboardInterrupt) else f"{type(error).__name__}: {error}",
        gpu_timeline=timeline, gpu_busy=timeline.busy if timeline else None,
        ready_steps=ready, losses=_losses(instruments, profiled, notes),
        models=models, compiled_models=compiled_models, anomaly_detection=instruments.anomaly_detection,
        other_lines=other_lines)
    total_memory = None
    if device.startswith("cuda") and cuda_initialized(torch):
        total_memory = int(torch.cuda.get_device_properties(torch.device(device).index or 0).total_memory)
    workers = getattr(value_at(namespace, loaders[0]), "num_workers", None) if loaders else None
    result = plan.with_plan(result, loaders=loaders, total_memory=total_memory, workers=workers)
    return result, defined, loaders


def _models_called(instruments: Instruments, used: TrainingObjects) -> tuple[list[str], list[str]]:
    """The notebook's names of the models the loop called, in the order it first called them (those with
    parameters: a loss module has nothing to compile); and those of them already compiled."""
    models = {id(module): module for module in used.models() if id(module) in used.labels}
    called = [models[key] for key in instruments.called_modules if key in models]
    return ([used.labels[id(module)] for module in called],
            [used.labels[id(module)] for module in called if compiled_how(module) is not None])


def _step_batches(record: StepRecord, sites: dict[tuple[str, int], int]) -> int:
    """The batches one step trained on: at each training site, those of the loader that gave the most (two loaders
    zipped at one site give one batch each per step, one batch of training)."""
    most: dict[tuple[str, int], int] = {}
    for (file, line, _), batches in record.loader_batches.items():
        if (file, line) in sites:
            most[(file, line)] = max(most.get((file, line), 0), batches)
    return sum(most.values())


def _accumulation(instruments: Instruments, sites: dict[tuple[str, int], int], profiled: list[StepRecord]) -> int:
    """DataLoader batches per optimizer step (gradient accumulation): the median over the profiled steps of the
    batches the training loop's sites fetched in each (an evaluation loop's batches are not the step's, and a
    GradScaler that skipped early steps while it found its scale does not make one batch look like two)."""
    if instruments.mode != OPTIMIZER_STEPS:
        return 1
    counts = [_step_batches(record, sites) for record in profiled]
    counts = [count for count in counts if count]
    if counts:
        return max(1, round(statistics.median(counts)))
    batches = sum(sites.values())
    if not instruments.optimizer_steps or not batches:
        return 1
    return max(1, round(batches / instruments.optimizer_steps))


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


def _operators(totals: Any, ceiling: Ceiling | None,
               gpu_seconds: dict[tuple[str, bool], float]) -> tuple[list[Operator], float | None, float | None]:
    """The operators ranked by what they cost a step; the share of the model's operator time in memory-bound ones;
    and the share of all operator time in the optimizer step's. On CUDA the cost is each operator's kernel time from
    the kernel timeline (`gpu_seconds`, by name and whether it ran in the optimizer's step): the host's time for an
    operator there is dispatch and launch, and ranked by it an `.item()` or a cast looked like the GPU's work. The
    optimizer's operators are kept apart from the model's: an unfused AdamW's foreach kernels moved more bytes than
    the model's matmuls, and counted with the model they made a step "memory-bound" and offered torch.compile(model)
    where the cure is a fused optimizer."""
    if totals is None:
        return [], None, None
    ridge = ceiling.ridge_point if ceiling else None
    found = []
    for optimizer, operators in ((False, totals.operators), (True, totals.optimizer_operators)):
        for name, count in operators.items():
            if not count.bytes and not count.flops:
                continue  # views and metadata: nothing computed, nothing moved
            intensity = count.flops / count.bytes if count.bytes else None
            bound = None if ridge is None or intensity is None else ("compute" if intensity >= ridge else "memory")
            if ridge is not None and count.bytes and not count.flops:
                # No FLOPs counted: an elementwise operator, a norm or a copy only moves data; a recurrent layer's
                # kernel multiplies matrices torch cannot price, so how it is bound is unknown.
                bound = None if _UNPRICED_COMPUTE.search(name) else "memory"
            found.append(Operator(name=name, calls=count.calls, seconds=count.seconds, flops=count.flops,
                                  bytes=count.bytes, bound=bound, optimizer=optimizer,
                                  gpu_seconds=gpu_seconds.get((name, optimizer), 0.0) if gpu_seconds else None))
    found.sort(key=lambda op: -op.time)
    total = sum(op.time for op in found)
    model = sum(op.time for op in found if not op.optimizer)
    memory = sum(op.time for op in found if op.bound == "memory" and not op.optimizer)
    optimizer_time = total - model
    return (found[:TOP_OPERATORS], (memory / model if model and ridge is not None else None),
            (optimizer_time / total if total and totals.optimizer_operators else None))


# Operators that multiply matrices but have no formula in torch.utils.flop_counter: the recurrent layers' fused
# kernels (mkldnn_rnn_layer on the CPU, _cudnn_rnn on CUDA, miopen_rnn, _thnn_fused_lstm_cell and their backwards).
# Counted as moving bytes only, an LSTM's kernels were called memory-bound fusion candidates.
_UNPRICED_COMPUTE = re.compile(r"rnn|lstm|gru")


def _losses(instruments: Instruments, profiled: list[Any], notes: list[str]) -> list[float]:
    """The loss at each profiled step: the mean of what backward() ran from in it (gradient accumulation's
    micro-batches). Not where several optimizers step (a GAN): the discriminator's and the generator's losses are
    not one quantity, and their mean had been shown as the loop's loss."""
    if len(instruments.stepped_optimizers) > 1:
        if any(record.losses for record in profiled):
            notes.append(f"No loss per step is shown: the loop steps {len(instruments.stepped_optimizers)} "
                         "optimizers, each with its own loss (a GAN's discriminator and generator).")
        return []
    return [statistics.fmean(float(t) for t in record.losses) for record in profiled if record.losses]


def _unpriced_compute(totals: Any) -> list[str]:
    if totals is None:
        return []
    return sorted(name for name, count in totals.operators.items()
                  if not count.flops and _UNPRICED_COMPUTE.search(name))


def _overhead(torch: Any, profiled: list[Any], narrowed: bool) -> float | None:
    """The hooks' own cost per step: what they add to a module call inside a model and to a bucket a hook opens
    and closes, measured now, times how many of each a profiled step made."""
    if not profiled:
        return None
    costs = measure_hook_costs(torch, narrowed)
    module_calls = statistics.median(r.module_calls for r in profiled)
    buckets = statistics.median(r.events for r in profiled)
    return module_calls * costs.module_call + buckets * costs.bucket


def _samples_in(index_sampler: Any) -> int | None:
    """How many samples the loader's dataset gives an epoch (a BatchSampler's sampler's length); None when it
    cannot tell (an IterableDataset, a sampler without a length)."""
    sampler = getattr(index_sampler, "sampler", None)
    if sampler is None or not hasattr(index_sampler, "batch_size"):
        return None
    try:
        return len(sampler)
    except TypeError:
        return None
