"""The server's long history of each GPU's utilisation and memory, and its downsampled series for long chart windows.

Pure. The full samples the panel polls stay a few minutes (`JupyterGpu.history` readings, as JSON); this keeps two
figures per GPU per reading for `JupyterGpu.history_seconds` (an hour by default) in flat `array('d')` rings: 8 bytes
a figure, no Python object per reading (so the garbage collector has nothing to walk), memory fixed at start-up. A
chart of an hour asks for `points` buckets and gets the minimum, mean and maximum of each, not 3,600 readings.
"""

from __future__ import annotations

import math
from array import array
from typing import Any

from jupyter_gpu.metrics.sample import DeviceSample, Sample

METRICS = ("utilization", "memory")  # the panel's two charts: GPU utilisation %, memory used as % of the total
MAX_POINTS = 1000
MIN_POINTS = 2


def _value(device: DeviceSample, metric: str) -> float:
    """The chart's figure, 0-100, or NaN when the GPU did not report it (a MIG board's utilisation)."""
    if device.status != "ok":
        return math.nan
    if metric == "utilization":
        return math.nan if device.utilization_gpu is None else float(device.utilization_gpu)
    if device.memory_used is None or not device.memory_total:
        return math.nan
    return 100.0 * device.memory_used / device.memory_total


class SeriesStore:
    """The last `capacity` readings' timestamps and, per GPU and metric, values; oldest overwritten first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"the series keeps at least 1 reading, not {capacity}")
        self.capacity = capacity
        self._times = array("d", [math.nan]) * capacity
        self._values: dict[tuple[int, str], array[float]] = {}
        self._next = 0  # where the next reading goes
        self._count = 0

    def add(self, sample: Sample) -> None:
        """Record one reading (a failed reading records no figure, only that time passed)."""
        slot = self._next
        self._times[slot] = sample.timestamp
        seen = set()
        for device in sample.devices if sample.status == "ok" else ():
            for metric in METRICS:
                key = (device.index, metric)
                ring = self._values.get(key)
                if ring is None:
                    ring = self._values[key] = array("d", [math.nan]) * self.capacity
                ring[slot] = _value(device, metric)
                seen.add(key)
        for key, ring in self._values.items():
            if key not in seen:
                ring[slot] = math.nan  # a GPU that was not in this reading
        self._next = (slot + 1) % self.capacity
        self._count = min(self._count + 1, self.capacity)

    def copy(self) -> SeriesStore:
        """A snapshot, so that a reply can be bucketed without holding up the sampler thread's next `add`: copying
        the rings is one memcpy each (an hour of 8 GPUs: 17 rings of 28 KiB)."""
        twin = SeriesStore(self.capacity)
        twin._times = array("d", self._times)
        twin._values = {key: array("d", ring) for key, ring in self._values.items()}
        twin._next, twin._count = self._next, self._count
        return twin

    def _slots(self) -> range:
        """Slot positions oldest first, as offsets from the oldest."""
        return range(self._count)

    def span(self) -> float:
        """Seconds from the oldest kept reading to the newest; 0 with fewer than two."""
        if self._count < 2:
            return 0.0
        oldest = (self._next - self._count) % self.capacity
        newest = (self._next - 1) % self.capacity
        return self._times[newest] - self._times[oldest]

    def downsample(self, window: float, points: int, now: float) -> dict[str, Any]:
        """The readings of the last `window` seconds before `now`, in `points` equal buckets: each bucket's start
        time, and per GPU and metric the min, mean and max of its readings (None for a bucket without one)."""
        points = max(MIN_POINTS, min(int(points), MAX_POINTS))
        start = now - window
        width = window / points
        sums: dict[tuple[int, str], list[float]] = {key: [0.0] * points for key in self._values}
        counts: dict[tuple[int, str], list[int]] = {key: [0] * points for key in self._values}
        lows: dict[tuple[int, str], list[float]] = {key: [math.inf] * points for key in self._values}
        highs: dict[tuple[int, str], list[float]] = {key: [-math.inf] * points for key in self._values}
        oldest = (self._next - self._count) % self.capacity
        readings = 0
        for offset in self._slots():
            slot = (oldest + offset) % self.capacity
            stamp = self._times[slot]
            if not start <= stamp <= now:
                continue
            bucket = min(int((stamp - start) / width), points - 1)
            readings += 1
            for key, ring in self._values.items():
                value = ring[slot]
                if value != value:  # NaN: not reported
                    continue
                sums[key][bucket] += value
                counts[key][bucket] += 1
                lows[key][bucket] = min(lows[key][bucket], value)
                highs[key][bucket] = max(highs[key][bucket], value)
        devices: dict[int, dict[str, Any]] = {}
        for (index, metric), total in sorted(sums.items()):
            n = counts[(index, metric)]
            devices.setdefault(index, {"index": index})[metric] = {
                "min": [round(lows[(index, metric)][b], 2) if n[b] else None for b in range(points)],
                "mean": [round(total[b] / n[b], 2) if n[b] else None for b in range(points)],
                "max": [round(highs[(index, metric)][b], 2) if n[b] else None for b in range(points)],
            }
        return {"window": window, "points": points, "start": start, "end": now, "bucket_seconds": width,
                "readings": readings, "t": [round(start + b * width, 3) for b in range(points)],
                "devices": list(devices.values())}
