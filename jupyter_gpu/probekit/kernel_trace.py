"""The GPU's kernel timeline over a few steps: how busy it was, why it was idle, how many kernels a step launches and
how long they run, and each operator's kernel time; read from a torch.profiler trace (`gpu_events`,
`operator_device_seconds`, `trace_kernels`) and analysed in plain Python (the events as seconds on one clock).
`%%gpuprofile` traces a few steps of the loop; `%speedprobe` one call of its step, to tell a launch-bound step.

Idle time is split as Holistic Trace Analysis splits it (`_analyze_idle_time_for_stream`), per stream: the gap before
a kernel is **host wait** when the CPU had not yet started launching it when the stream's previous kernel ended (the
host could not keep up), else **kernel wait** when the gap is under 30 µs (launch overhead between consecutive
kernels: CUDA graphs remove it), else **other** (waits between streams, events). Busy time is the union of every
kernel on the device, so two streams running at once count once.

The trace is taken under torch.profiler, which records every operator on the host and so slows the host, not the
kernels: on the H200 a ResNet step of 12.3 ms took about 40 ms traced, and the GPU waited 30 ms of it. So the
timeline the report shows is the trace's kernels set against a typical unprofiled step (`at_step`): busy is the
kernels' time per step over that step, and the rest of the step is idle, split as the trace split its idle time.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

KERNEL_WAIT_SECONDS = 30e-6  # HTA's consecutive_kernel_delay (30, in its trace's microseconds)


@dataclass(frozen=True)
class GpuEvent:
    start: float
    end: float
    stream: int
    launched: float | None  # when the CPU started the runtime call that queued it; None when not linked


@dataclass(frozen=True)
class GpuTimeline:
    steps: int
    window: float           # seconds the timeline covers
    busy: float             # share of the window with at least one kernel running
    host_wait: float        # seconds per step, summed over streams
    kernel_wait: float
    other_wait: float
    kernels_per_step: float
    median_kernel: float    # seconds
    traced_step: float | None = None  # seconds per step under torch.profiler, once set against an unprofiled step

    @property
    def kernel_seconds(self) -> float:
        """Seconds per step with at least one kernel running."""
        return self.busy * self.window / self.steps

    @property
    def launch_bound(self) -> bool:
        """Many short kernels and the GPU mostly idle, waiting for the host or between launches."""
        return self.busy < 0.5 and self.median_kernel < 20e-6 and self.kernels_per_step >= 100

    def at_step(self, step: float) -> GpuTimeline:
        """This timeline as an unprofiled step of `step` seconds sees it: the same kernels, the rest of the step
        idle in the trace's proportions (all of it "other" when the trace had no gap)."""
        if step <= 0:
            return self
        kernels = min(self.kernel_seconds, step)
        idle = step - kernels
        waits = self.host_wait + self.kernel_wait + self.other_wait
        share = (lambda wait: idle * wait / waits) if waits > 0 else (lambda wait: 0.0)
        return replace(self, window=step * self.steps, busy=kernels / step, host_wait=share(self.host_wait),
                       kernel_wait=share(self.kernel_wait),
                       other_wait=share(self.other_wait) if waits > 0 else idle,
                       traced_step=self.window / self.steps)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "launch_bound": self.launch_bound}


def analyse(events: list[GpuEvent], steps: int, window: tuple[float, float]) -> GpuTimeline | None:
    if not events or steps < 1 or window[1] <= window[0]:
        return None
    ordered = sorted(events, key=lambda e: e.start)
    busy, covered = 0.0, window[0]
    for event in ordered:
        start, end = max(event.start, covered), min(event.end, window[1])
        if end > start:
            busy += end - start
        covered = max(covered, event.end)
    waits = {"host": 0.0, "kernel": 0.0, "other": 0.0}
    for stream in {e.stream for e in events}:
        previous_end = None
        for event in (e for e in ordered if e.stream == stream):
            if previous_end is not None and event.start > previous_end:
                gap = event.start - previous_end
                if event.launched is not None and event.launched > previous_end:
                    waits["host"] += gap
                elif gap < KERNEL_WAIT_SECONDS:
                    waits["kernel"] += gap
                else:
                    waits["other"] += gap
            previous_end = event.end if previous_end is None else max(previous_end, event.end)
    length = window[1] - window[0]
    return GpuTimeline(steps=steps, window=length, busy=busy / length, host_wait=waits["host"] / steps,
                       kernel_wait=waits["kernel"] / steps, other_wait=waits["other"] / steps,
                       kernels_per_step=len(events) / steps,
                       median_kernel=statistics.median(e.end - e.start for e in events))


def gpu_events(torch: Any, profiler: Any) -> tuple[list[GpuEvent], tuple[float, float]]:
    """The GPU events of a finished torch.profiler run, each with when the CPU started the runtime call that queued
    it (linked by correlation id), in seconds; and the window the trace covers."""
    events = profiler.profiler.kineto_results.events()
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    launches = {e.correlation_id(): e.start_ns() for e in events
                if e.device_type() == cpu and e.correlation_id() and e.name().startswith(("cuda", "cu"))}
    found = []
    for event in events:
        if event.device_type() != cuda or "Sync" in event.name():
            continue
        launched = launches.get(event.correlation_id()) or launches.get(event.linked_correlation_id())
        found.append(GpuEvent(start=event.start_ns() / 1e9, end=event.end_ns() / 1e9,
                              stream=int(event.device_resource_id()),
                              launched=launched / 1e9 if launched else None))
    starts = [e.start_ns() for e in events]
    ends = [e.end_ns() for e in events]
    return found, ((min(starts) / 1e9, max(ends) / 1e9) if events else (0.0, 0.0))


def operator_device_seconds(profiler: Any, steps: int) -> dict[str, float]:
    """Each aten operator's kernel time per step in a finished torch.profiler run, by the name the operator census
    uses ("mm", "convolution_backward"). The census sees the outermost operators below autograd, so each gets its
    inclusive time: `convolution`'s kernels are launched by `cudnn_convolution`, called inside it."""
    if steps < 1:
        return {}
    found: dict[str, float] = {}
    for average in profiler.key_averages():
        name = str(average.key)
        if name.startswith("aten::"):
            micros = getattr(average, "device_time_total", None)
            if micros is None:  # torch before 2.4 named it for CUDA
                micros = getattr(average, "cuda_time_total", 0.0)
            found[name.removeprefix("aten::")] = float(micros) / 1e6 / steps
    return found


def trace_kernels(torch: Any, run: Callable[[], Any], steps: int = 1) -> GpuTimeline | None:
    """`run()` called `steps` times under torch.profiler (CPU and CUDA activity): its kernel timeline. CUDA must be
    initialised already; the caller puts back what `run` changed."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as traced:
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
    events, window = gpu_events(torch, traced)
    return analyse(events, steps, window)
