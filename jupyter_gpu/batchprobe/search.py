"""Which batch size to try next: the pure search behind `%batchprobe` (no torch, no clock).

The search assumes "fits" is monotone (if N fits, every smaller size fits) and finds the exact limit:
N fits and N+1 does not (or N is the user's `--max`). It never tries a size below `--start` (batch size 1
breaks BatchNorm in training mode): when `--start` does not fit, nothing does. It proceeds in these ways:

- **The curve** (when the budget sees every allocation, as the CPU budget does): a trial reports the live
  bytes right after each allocation. Two trials of the same step make the same allocations, so event by event
  the live bytes lie on a line in the batch size, and the peak at any size is the largest of those lines. This
  sees the activations grow even where the peak sits on a plateau (small sizes peak in the optimizer step,
  where the batch barely matters). The second trial doubles the first (one trial cannot tell memory that
  grows with the batch from a fixed allocation, and jumping far past a hidden limit would cost more bisection
  than doubling); the model from the two is **checked** at the size it recommends before the search jumps to
  one past the limit it predicts. A curve that does not grow gives plain doubling.
- **Doubling** from `--start` while nothing has failed and memory says nothing useful yet.
- **Prediction** from the peaks alone (the CUDA allocator only tells peaks): once two fitted trials show peak
  memory growing with the batch size, a straight line through the two largest (peak = a + b·size) says where
  the budget runs out. Until a third size lies on that line the search moves towards it at most 8x at a time;
  once confirmed it jumps there.
- **Correction**: a prediction that fitted is followed by the model's next prediction, but at least +1, +2,
  +4, … (a too-steep line cannot make the search crawl); a prediction that failed is followed by one size
  less, and then **bisection** of the bracket.

A step whose peak does not grow (it raises out-of-memory above a hidden limit, or its allocations are
invisible) never triggers a prediction, so the search is exactly doubling then bisection.

- **Discredit**: a trial that fails where the model predicted a peak well within the budget (more than
  LINE_TOLERANCE of it to spare) shows that something the budget does not see limits the step (another process's
  memory, fragmentation, a cap): the model is dropped for the rest of the search, which goes on by doubling from
  the largest size that fitted, then bisection. Halving down from the failed jump instead would fail on every
  step down to the real limit. So the sizes after the contradicted trial are the ones doubling then bisection
  tries: that one trial is all a wrong model costs. One past the predicted limit failing is the plan, not a
  contradiction.

Before answering, the limit must have run *after* the last failure: a failure can leave the allocator
fragmented, so the answer is re-run when the last trial was a failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# An unconfirmed line (two points) may jump at most this many times the largest fitted size.
UNCONFIRMED_JUMP = 8
# A third point confirms the line when it is this close to it, relative to the peaks' growth.
LINE_TOLERANCE = 0.05
MIN_GROWTH = 0.1


@dataclass(frozen=True)
class Outcome:
    """One trial as the search sees it."""

    batch_size: int
    fitted: bool
    peak_bytes: int | None = None  # measured peak of a fitted trial (None: not measured)
    # Live bytes after each allocation of a fitted trial, in order (None: the budget cannot see allocations).
    curve: tuple[int, ...] | None = None


@dataclass
class BatchSizeSearch:
    start: int = 1
    maximum: int | None = None
    budget_bytes: int | None = None
    margin: float = 0.1  # the recommendation keeps this share of the budget free: the curve is checked there
    outcomes: list[Outcome] = field(default_factory=list)
    _hows: list[str] = field(default_factory=list)  # how each tried size was chosen
    _how: str = "start"
    # (size, the peak the model predicted for it) of the failure that discredited the model; None while trusted.
    contradiction: tuple[int, float] | None = None

    def __post_init__(self) -> None:
        if self.start < 1:
            raise ValueError("start must be at least 1")
        if self.maximum is not None and self.maximum < self.start:
            raise ValueError("maximum must be at least start")

    def record(self, batch_size: int, fitted: bool, peak_bytes: int | None = None,
               curve: tuple[int, ...] | None = None) -> None:
        if not fitted and self.contradiction is None and self.budget_bytes is not None:
            predicted = self._predicted_peak(batch_size)
            if predicted is not None and predicted <= self.budget_bytes * (1 - LINE_TOLERANCE):
                self.contradiction = (batch_size, predicted)
        self.outcomes.append(Outcome(batch_size, fitted, peak_bytes, curve if fitted else None))

    @property
    def discredited(self) -> bool:
        """A trial failed far below the peak the memory model predicted: the model is not used any more."""
        return self.contradiction is not None

    # -- the bracket ---------------------------------------------------------------------------------------
    @property
    def lowest_failure(self) -> int | None:
        failed = [o.batch_size for o in self.outcomes if not o.fitted]
        return min(failed) if failed else None

    @property
    def largest_fit(self) -> int:
        """The largest size that fitted below every failure (0: none yet)."""
        ceiling = self.lowest_failure
        fitted = [o.batch_size for o in self.outcomes if o.fitted and (ceiling is None or o.batch_size < ceiling)]
        return max(fitted, default=0)

    @property
    def upper(self) -> int | None:
        """The smallest size known not to be allowed: a failure, or one past `--max`."""
        bounds = [b for b in (self.lowest_failure, None if self.maximum is None else self.maximum + 1) if b]
        return min(bounds) if bounds else None

    @property
    def bracketed(self) -> bool:
        upper = self.upper
        return upper is not None and upper == self.largest_fit + 1

    @property
    def capped(self) -> bool:
        """The answer is `--max`, not the memory limit."""
        return self.maximum is not None and self.largest_fit == self.maximum

    @property
    def answer(self) -> int:
        return self.largest_fit

    @property
    def start_failed(self) -> bool:
        """`--start` itself did not fit: the search stops there instead of going below it."""
        return any(o.batch_size == self.start and not o.fitted for o in self.outcomes) and self.largest_fit == 0

    @property
    def last_step(self) -> str:
        """How the last size was chosen: start, double, check, approach, predict, gallop, bisect,
        re-run."""
        return self._how

    # -- the next size -------------------------------------------------------------------------------------
    def next_size(self) -> int | None:
        """The next batch size to try, or None when the answer is exact and verified."""
        size, self._how = self._choose()
        if size is not None:
            self._hows.append(self._how)
        return size

    def instead(self, how: str) -> None:
        """The size `next_size` chose is not tried; another one, chosen as `how`, is (or none, when `how` is
        "not tried"): its outcome is recorded next, as usual."""
        self._hows.pop()
        if how != "not tried":
            self._hows.append(how)
        self._how = how

    def _choose(self) -> tuple[int | None, str]:
        if not self.outcomes:
            return self.start, "start"
        lo, upper = self.largest_fit, self.upper
        if self.bracketed:
            if lo == 0 or self._verified(lo):
                return None, "done"
            return lo, "re-run"
        if lo == 0:  # --start failed: nothing at or above it fits, and nothing below it is tried
            return None, "done"
        if self.discredited:  # doubling from the largest size that fitted, then bisection, as with no model
            assert upper is not None
            if lo * 2 < upper:
                return self._clamp(lo * 2), "double"
            return (lo + upper) // 2, "bisect"
        limit = self._predicted_limit()
        if self.lowest_failure is None:
            if (curved := self._curve_step(lo)) is not None:
                return curved
            if limit is None:
                return self._clamp(lo * 2), "double"
            if limit + 1 > lo * UNCONFIRMED_JUMP and not self._line_confirmed():
                # Two points can straddle a bend (small sizes often peak in the optimizer step, where the
                # batch barely matters): approach by at most UNCONFIRMED_JUMP times, measuring on the way.
                return self._clamp(lo * UNCONFIRMED_JUMP), "approach"
            # Try one past the predicted limit first: when it fails, the limit itself runs next, after the
            # failure, so it needs no re-run. Below the limit after a prediction that fitted, the line may be
            # too steep (memory growing slower than linearly), so move at least +1, +2, +4, … (no crawl).
            streak = self._streak("predict", fitted=True)
            least = lo + (1 << (streak - 1)) if streak else lo + 1
            return self._clamp(max(limit + 1, least)), "predict"
        assert upper is not None
        last = self.outcomes[-1]
        if not last.fitted:
            if self._hows[-1] == "predict":
                return upper - 1, "gallop"  # usually the prediction was one too many
            return (lo + upper) // 2, "bisect"
        # A new fitted size moved the line: trust it inside the bracket, but not twice in a row without
        # failing (a crawl), and not when it points past a size that already failed (the line is off).
        if limit is not None and limit < upper and self._streak("predict", fitted=True) < 2:
            return min(max(limit + 1, lo + 1), upper - 1), "predict"  # one past the limit first, as above
        return (lo + upper) // 2, "bisect"

    def _curve_step(self, lo: int) -> tuple[int, str] | None:
        """The next size before any failure when trials report curves; None: use the peaks instead."""
        model = self._curve_model()
        if model is None or self.budget_bytes is None:
            return None
        limit = model.limit(self.budget_bytes)
        if limit is None:
            return None  # flat: no memory signal, so doubling
        if not self._curve_checked():
            check = model.largest_within(self.budget_bytes * (1 - self.margin))
            if check is not None and lo < check < limit:
                return self._clamp(check), "check"
        streak = self._streak("predict", fitted=True)
        least = lo + (1 << (streak - 1)) if streak else lo + 1
        return self._clamp(max(limit + 1, least)), "predict"

    def _curve_model(self) -> CurveModel | None:
        fitted = _fitted_curves(self.outcomes, self.upper)
        return CurveModel.through(fitted[-2], fitted[-1]) if len(fitted) >= 2 else None

    def _curve_checked(self) -> bool:
        """Whether the model through two trials predicted a third, larger one's peak (5% of the growth)."""
        fitted = _fitted_curves(self.outcomes, self.upper)
        if len(fitted) < 3:
            return False
        earlier = CurveModel.through(fitted[-3], fitted[-2])
        largest = fitted[-1]
        if earlier is None or largest.peak_bytes is None or fitted[-2].peak_bytes is None:
            return False
        growth = max(largest.peak_bytes - fitted[-2].peak_bytes, 1)
        return abs(earlier.peak_at(largest.batch_size) - largest.peak_bytes) <= LINE_TOLERANCE * growth

    def _streak(self, how: str, fitted: bool) -> int:
        """How many of the latest trials in a row were chosen as `how` and ended `fitted`."""
        count = 0
        for outcome, chosen in zip(reversed(self.outcomes), reversed(self._hows), strict=False):
            if chosen != how or outcome.fitted != fitted:
                break
            count += 1
        return count

    def _line_confirmed(self) -> bool:
        """Whether a third fitted size backs the line through the two largest.

        It does when the step from the third to the middle size grew at least half as much as the line says
        (so the middle size is on the line, not on a plateau below it) and the third lies on or above the line
        (a plateau, such as an optimizer-step peak at small sizes, sits above it; so does the exact line). And
        the peaks must have grown by MIN_GROWTH of the largest peak at all.
        """
        points = _fitted_peaks(self.outcomes, self.upper)
        if len(points) < 3:
            return False
        (third, third_peak), (small, small_peak), (large, large_peak) = sorted(points.items())[-3:]
        per_sample = (large_peak - small_peak) / (large - small)
        if per_sample <= 0:
            return False
        on_line_at_third = small_peak - per_sample * (small - third)
        growth = large_peak - third_peak
        # Growth is measured against the whole peak on purpose. Small sizes often peak in optimizer.step, where
        # only the batch's inputs grow: three such peaks are collinear too, with a slope that is a fraction of
        # the activations' and a limit far too high. When the model's own memory dwarfs the growth, the line
        # may well be right, but a wrong jump costs a long bisection and an 8x approach only a trial or two.
        return (growth >= MIN_GROWTH * large_peak
                and small_peak - third_peak >= 0.5 * per_sample * (small - third)
                and third_peak >= on_line_at_third - LINE_TOLERANCE * growth)

    def _predicted_peak(self, size: int) -> float | None:
        """The peak the memory model predicts at `size` (None: no model yet)."""
        if (model := self._curve_model()) is not None:
            return model.peak_at(size)
        line = memory_line(self.outcomes, below=self.upper)
        if line is None:
            return None
        intercept, per_sample = line
        return intercept + per_sample * size

    def _predicted_limit(self) -> int | None:
        """The largest size the memory model says fits the budget (None: no model, or no budget)."""
        if self.budget_bytes is None:
            return None
        if (model := self._curve_model()) is not None:
            return model.limit(self.budget_bytes)
        line = memory_line(self.outcomes, below=self.upper)
        if line is None:
            return None
        intercept, per_sample = line
        return int((self.budget_bytes - intercept) // per_sample)

    def _clamp(self, size: int) -> int:
        return size if self.maximum is None else min(size, self.maximum)

    def _verified(self, size: int) -> bool:
        # Verified: the size fitted in a trial after the last failure.
        for outcome in reversed(self.outcomes):
            if outcome.batch_size == size and outcome.fitted:
                return True
            if not outcome.fitted:
                return False
        return False


@dataclass(frozen=True)
class CurveModel:
    """Live bytes at each allocation of the step, each a line in the batch size: event i holds a_i + b_i·size.

    Exact for the usual step, whose every tensor is either batch-independent (weights, optimizer state) or
    proportional to the batch (activations, their gradients); the peak at any size is the largest line there.
    """

    lines: tuple[tuple[float, float], ...]  # (intercept, per_sample) for each allocation event

    @classmethod
    def through(cls, small: Outcome, large: Outcome) -> CurveModel | None:
        """The lines through two trials' curves; None unless both made the same number of allocations."""
        if small.curve is None or large.curve is None or len(small.curve) != len(large.curve) or not small.curve:
            return None
        span = large.batch_size - small.batch_size
        if span <= 0:
            return None
        lines = []
        for at_small, at_large in zip(small.curve, large.curve, strict=True):
            per_sample = (at_large - at_small) / span
            lines.append((at_small - per_sample * small.batch_size, per_sample))
        return cls(tuple(lines))

    def peak_at(self, size: int) -> float:
        return max(intercept + per_sample * size for intercept, per_sample in self.lines)

    def largest_within(self, limit_bytes: float) -> int | None:
        """The largest size whose predicted peak stays within `limit_bytes` (None: no event grows)."""
        growing = [(limit_bytes - intercept) // per_sample for intercept, per_sample in self.lines if per_sample > 0]
        return int(min(growing)) if growing else None

    def limit(self, budget_bytes: int) -> int | None:
        return self.largest_within(budget_bytes)

    def binding_line(self, size: int) -> tuple[float, float]:
        """The event that peaks at `size`: the line the report shows as the memory model."""
        return max(self.lines, key=lambda line: line[0] + line[1] * size)


def _fitted_curves(outcomes: list[Outcome], below: int | None) -> list[Outcome]:
    """Fitted trials with curves below `below`, one per size (the latest), by size."""
    latest: dict[int, Outcome] = {}
    for o in outcomes:
        if o.fitted and o.curve and o.peak_bytes is not None and (below is None or o.batch_size < below):
            latest[o.batch_size] = o
    return [latest[size] for size in sorted(latest)]


def memory_line(outcomes: list[Outcome], below: int | None = None) -> tuple[float, float] | None:
    """Peak = intercept + per_sample·size through the two largest fitted, measured sizes (None: no growth).

    The two *largest* sizes are used because small sizes can peak somewhere else (in the optimizer step,
    which does not depend on the batch), which would flatten the line.
    """
    points = _fitted_peaks(outcomes, below)
    if len(points) < 2:
        return None
    (small, small_peak), (large, large_peak) = sorted(points.items())[-2:]
    per_sample = (large_peak - small_peak) / (large - small)
    if per_sample <= 0:
        return None
    return large_peak - per_sample * large, per_sample


def _fitted_peaks(outcomes: list[Outcome], below: int | None) -> dict[int, int]:
    points: dict[int, int] = {}
    for o in outcomes:
        if o.fitted and o.peak_bytes is not None and (below is None or o.batch_size < below):
            points[o.batch_size] = o.peak_bytes  # the latest measurement of a size wins
    return points


def recommended_size(outcomes: list[Outcome], answer: int, budget_bytes: int | None, margin: float) -> int:
    """The largest size whose predicted peak leaves `margin` of the budget free (never above the answer).

    Without a memory signal the margin is applied to the size itself, as Lightning does.
    """
    if answer <= 0:
        return 0
    fitted = _fitted_curves(outcomes, answer + 1)
    model = CurveModel.through(fitted[-2], fitted[-1]) if len(fitted) >= 2 else None
    if model is not None and budget_bytes is not None:
        within = model.largest_within(budget_bytes * (1 - margin))
        if within is not None:
            return max(1, min(answer, within))
    line = memory_line(outcomes, below=answer + 1)
    if line is None or budget_bytes is None:
        return max(1, int(answer * (1 - margin)))
    intercept, per_sample = line
    size = int((budget_bytes * (1 - margin) - intercept) // per_sample)
    return max(1, min(answer, size))


# A step "ignores batch_size" when, over the top FLAT_SIZE_RANGE of the sizes it ran (the last four doublings), its
# peak grew by less than one byte per added sample: real work makes at least one tensor that grows with the batch
# (an activation of four bytes or more per sample, even when the inputs are views of data already on the device).
# The top, not the whole range: a step that draws min(batch_size, 64) samples grows up to 64 and not after, and over
# 2..4096 that early growth outweighs a byte per sample, while over 2..65536 it does not; the verdict must not depend
# on --max. Step time is no witness: on a busy 2-core machine the same millisecond step measured 0.5 to 28 ms from
# one trial to the next.
FLAT_SIZE_RANGE = 16
FLAT_BYTES_PER_SAMPLE = 1
# The growth "slowed" when, from the top's base to the largest size, the peak grew by less than this share of what
# the per-sample growth between the two smallest sizes would give: then it may have stopped inside the top.
SLOWED_SHARE = 0.5


def top_of_range(points: list[tuple[int, int]]) -> list[tuple[int, int]] | None:
    """The fitted (size, peak) from the largest size at most 1/FLAT_SIZE_RANGE of the largest, up to the largest,
    by size (None: no size that small, so no range wide enough to judge)."""
    points = sorted(points)
    if len(points) < 2:
        return None
    large = points[-1][0]
    below = [index for index, (size, _) in enumerate(points) if size * FLAT_SIZE_RANGE <= large]
    return points[below[-1]:] if below else None


def flat_in_batch_size(points: list[tuple[int, int]]) -> bool:
    """Whether (size, peak bytes) of fitted trials say the step does not depend on the batch size at the top of
    the range it ran.

    A step that draws from a 64-sample dataset (`data[:batch_size]`) or uses a fixed input makes the same tensors
    at every size past some point, so its "largest batch size" is only the --max cap.
    """
    top = top_of_range(points)
    if top is None:
        return False
    (small, small_peak), (large, large_peak) = top[0], top[-1]
    return max(peak for _, peak in top) - min(small_peak, large_peak) < FLAT_BYTES_PER_SAMPLE * (large - small)


def flat_check_size(points: list[tuple[int, int]], start: int) -> int | None:
    """The size to run so that the top of the range can be judged flat or not; None when no trial is needed.

    Needed when the sizes jumped past the top's base (the memory model went from 4 straight to --max), the top
    is not already flat from the size below it, and the growth from there to the largest size fell short of the
    growth per sample the smallest sizes showed: it may have stopped inside the top, or before it.
    """
    points = sorted(points)
    if len(points) < 2 or flat_in_batch_size(points):
        return None
    large, large_peak = points[-1]
    target = large // FLAT_SIZE_RANGE
    below = [(size, peak) for size, peak in points if size <= target]
    if target < start or not below or below[-1][0] * 2 > target:
        return None  # the top's base already ran, within a doubling of it
    base, base_peak = below[-1]
    (first, first_peak), (second, second_peak) = points[0], points[1]
    per_sample = (second_peak - first_peak) / (second - first)
    if large_peak - base_peak >= SLOWED_SHARE * per_sample * (large - base):
        return None  # still growing as at the smallest sizes: the top is not flat
    return target


def throughput_knee(points: list[tuple[int, float]], within: float = 0.95) -> int | None:
    """The smallest batch size reaching `within` of the best samples/s: beyond it, bigger buys little. None when
    that is the largest size measured: nothing bigger was seen to level off (2, 4 and 256 tried, 256 fastest)."""
    if len(points) < 2:
        return None
    best = max(rate for _, rate in points)
    if best <= 0:
        return None
    knee = min(size for size, rate in points if rate >= within * best)
    return knee if knee < max(size for size, _ in points) else None
