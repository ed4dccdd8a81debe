"""Summary statistics of repeated timings: median, min, IQR and the spread warning. Pure Python."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

# `%timeit` warns when the slowest run took over 4x the fastest; users know this threshold.
SPREAD_WARNING_RATIO = 4.0


@dataclass(frozen=True)
class TimingStats:
    n: int
    median: float
    minimum: float
    maximum: float
    mean: float
    q1: float
    q3: float

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def spread_ratio(self) -> float | None:
        """Slowest over fastest run, or None when a run took no measurable time."""
        return self.maximum / self.minimum if self.minimum > 0 else None

    @property
    def spread_is_large(self) -> bool:
        ratio = self.spread_ratio
        return self.n >= 2 and ratio is not None and ratio > SPREAD_WARNING_RATIO

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "iqr": self.iqr, "spread_ratio": self.spread_ratio}


def summarize(times: list[float]) -> TimingStats:
    if not times:
        raise ValueError("No timings to summarise.")
    ordered = sorted(times)
    q1, q3 = _quartiles(ordered)
    return TimingStats(n=len(ordered), median=statistics.median(ordered), minimum=ordered[0],
                       maximum=ordered[-1], mean=statistics.fmean(ordered), q1=q1, q3=q3)


def _quartiles(ordered: list[float]) -> tuple[float, float]:
    # Linear interpolation between order statistics (numpy's default), so IQR is 0 for one run
    # and meaningful for the 3-7 repeats users typically ask for.
    if len(ordered) == 1:
        return ordered[0], ordered[0]
    return _percentile(ordered, 0.25), _percentile(ordered, 0.75)


def _percentile(ordered: list[float], fraction: float) -> float:
    position = fraction * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
