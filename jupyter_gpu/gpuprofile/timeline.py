"""The step's clock: every moment of a step is charged to exactly one bucket, the innermost one active.

Hooks call `enter(bucket)` and `leave(...)` around the work they see (a DataLoader `next()`, a module's forward,
`backward`, the optimizer step, a tensor read, a garbage collection), nested as the calls nest: a `.item()`
inside a forward is a sync, not forward. Time outside every bucket is "other host time". Because each interval
goes to one bucket, the buckets of a step add up to its wall time by construction; what can be wrong is only
which bucket a moment went to, and that is what the known-cost tests check. Pure Python: the clock is given.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from jupyter_gpu.gpuprofile.result import OTHER


@dataclass
class StepRecord:
    """One step: wall seconds, seconds per bucket, and per-site sync counts and seconds."""

    seconds: float = 0.0
    buckets: dict[str, float] = field(default_factory=dict)
    sync_calls: dict[tuple[str, int], int] = field(default_factory=dict)
    sync_seconds: dict[tuple[str, int], float] = field(default_factory=dict)
    copies: int = 0
    copy_bytes: int = 0
    pageable_copies: int = 0
    blocking_copies: int = 0
    events: int = 0  # hook calls made in this step, for the overhead estimate
    module_calls: int = 0
    batches: dict[tuple[str, int], int] = field(default_factory=dict)  # DataLoader batches, by the loop site
    # The same, by the loop site and the loader's dataset: `zip(labelled, cycle(unlabelled))` fetches one batch from
    # each of two loaders per step, which is not gradient accumulation.
    loader_batches: dict[tuple[str, int, int], int] = field(default_factory=dict)
    losses: list = field(default_factory=list)  # the scalars backward() ran from (detached; read after the run)


class Timeline:
    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._stack: list[list] = []  # [bucket, exclusive seconds so far]
        self._last = clock()
        self._step_started = self._last
        self.current = StepRecord()
        # Told each slice of other host time as it is charged (line_time.LineClock: which line it was), else None.
        self.other_sink: Callable[[float], None] | None = None

    def _charge(self, now: float) -> None:
        elapsed = now - self._last
        self._last = now
        if elapsed <= 0:
            return
        if self._stack:
            self._stack[-1][1] += elapsed
        else:
            self.current.buckets[OTHER] = self.current.buckets.get(OTHER, 0.0) + elapsed
            if self.other_sink is not None:
                self.other_sink(elapsed)

    def mark(self) -> None:
        """Charge the time since the last event now (to the open bucket, or to other host time): a line of the
        user's code begins."""
        self._charge(self._clock())

    def enter(self, bucket: str) -> None:
        self._charge(self._clock())
        self._stack.append([bucket, 0.0])
        self.current.events += 1

    def leave(self, bucket: str | None = None, *, merge: bool = False) -> float:
        """Close the innermost bucket; `bucket` re-labels it (a `.to()` turns out to have been a copy, or a sync).
        `merge` gives its time to the bucket around it instead (a `.to()` that copied nothing). Returns its
        exclusive seconds."""
        self._charge(self._clock())
        if not self._stack:
            return 0.0
        label, seconds = self._stack.pop()
        if merge and self._stack:
            self._stack[-1][1] += seconds
            return seconds
        label = OTHER if merge else bucket or label
        self.current.buckets[label] = self.current.buckets.get(label, 0.0) + seconds
        return seconds

    def top(self) -> str | None:
        return self._stack[-1][0] if self._stack else None

    def inside(self, bucket: str) -> bool:
        """Whether `bucket` is open at any depth (a read inside the optimizer's step is still the optimizer's)."""
        return any(entry[0] == bucket for entry in self._stack)

    @property
    def depth(self) -> int:
        return len(self._stack)

    def boundary(self) -> StepRecord:
        """End the current step here and start the next; open buckets carry on into the new step."""
        now = self._clock()
        self._charge(now)
        for entry in self._stack:  # charged so far to the step ending now
            self.current.buckets[entry[0]] = self.current.buckets.get(entry[0], 0.0) + entry[1]
            entry[1] = 0.0
        done = self.current
        done.seconds = now - self._step_started
        self._step_started = now
        self.current = StepRecord()
        return done
