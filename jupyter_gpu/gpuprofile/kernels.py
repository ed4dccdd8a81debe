"""The GPU's kernel timeline over a few steps: how busy it was, why it was idle, how many kernels a step launches and
how long they run. Pure Python: the events come in as plain numbers (seconds on one clock).

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
