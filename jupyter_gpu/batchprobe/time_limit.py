"""`%batchprobe --max-seconds`: how long a trial at a batch size will take, from the trials that ran, and the
largest size that still fits in the time left. Pure Python.

A trial is its steps plus a fixed cost (restoring the state, collecting garbage, the first step's warm-up). A
step's time is taken as proportional to the batch, from the steady step time of the largest size that ran. A step
has a fixed part too (Python, kernel launches), so this overestimates, and a search stops early rather than late;
a line through the two largest sizes would not: at the small sizes a search starts from, the fixed part is nearly
all of the step and the slope between two of them is noise. On a small language model on the CPU (batches 2 and 4
taking about the same time) such a line let a trial start that was predicted at seconds and took minutes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jupyter_gpu.batchprobe.result import Trial

# The share of the time left a trial chosen to fit it may be predicted to take (a step can grow a little worse
# than in proportion at large sizes, as caches overflow).
AFFORDABLE_SHARE = 0.8
# A size chosen for the time left is tried only when it is this much larger than the largest that ran.
WORTH_TRYING = 1.25


@dataclass(frozen=True)
class TimeLimit:
    """The search stopped before a trial predicted to end past `--max-seconds`."""

    seconds: float            # the limit
    next_size: int            # the size the search would have tried next
    predicted_seconds: float  # how long that trial would have taken
    fails_at: int | None = None  # the smallest size that did not fit by then (None: none failed)

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "next_size": self.next_size, "predicted_seconds": self.predicted_seconds,
                "fails_at": self.fails_at}


def _timed(trials: Sequence[Trial]) -> list[Trial]:
    """The fitted trials with a steady step time, the largest size last (its latest trial)."""
    latest = {t.batch_size: t for t in trials if t.fitted and t.step_seconds and t.batch_size > 0}
    return [latest[size] for size in sorted(latest)]


def _per_sample(largest: Trial) -> float:
    """Seconds per sample of one step at the largest size that ran (an upper bound for larger sizes)."""
    assert largest.step_seconds is not None
    return largest.step_seconds / largest.batch_size


def _fixed_cost(largest: Trial) -> float:
    """What the largest trial took beyond its steady steps: the restore, the collection, the first step's warm-up."""
    assert largest.step_seconds is not None
    return max(0.0, largest.seconds - largest.steps_run * largest.step_seconds)


def predicted_seconds(trials: Sequence[Trial], size: int, steps: int) -> float | None:
    """How long a trial of `steps` steps at `size` will take; None before any trial ran."""
    timed = _timed(trials)
    if not timed:
        return None
    return _fixed_cost(timed[-1]) + steps * _per_sample(timed[-1]) * size


def affordable_size(trials: Sequence[Trial], seconds_left: float, steps: int) -> int | None:
    """The largest size whose trial is predicted to take at most AFFORDABLE_SHARE of `seconds_left`; None when
    none is (or nothing ran to predict from)."""
    timed = _timed(trials)
    if not timed:
        return None
    per_step = (AFFORDABLE_SHARE * seconds_left - _fixed_cost(timed[-1])) / steps
    size = int(per_step / _per_sample(timed[-1]))
    return size if size >= 1 else None


def worth_trying(size: int | None, largest_fit: int, next_size: int) -> bool:
    """A size for the time left says more than the largest that ran (and less than the search's next)."""
    return size is not None and size >= WORTH_TRYING * largest_fit and size < next_size
