"""The GPU's kernel timeline over a few steps: how busy it was, why it was idle, how many kernels a step launches and
how long they run. Pure Python: the events come in as plain numbers (seconds on one clock).

Idle time is split as Holistic Trace Analysis splits it (`_analyze_idle_time_for_stream`), per stream: the gap before
a kernel is **host wait** when the CPU had not yet started launching it when the stream's previous kernel ended (the
host could not keep up), else **kernel wait** when the gap is under 30 µs (launch overhead between consecutive
kernels: CUDA graphs remove it), else **other** (waits between streams, events). Busy time is the union of every
kernel on the device, so two streams running at once count once.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
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

    @property
    def launch_bound(self) -> bool:
        """Many short kernels and the GPU mostly idle, waiting for the host or between launches."""
        return self.busy < 0.5 and self.median_kernel < 20e-6 and self.kernels_per_step >= 100

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
