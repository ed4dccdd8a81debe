"""The pure batch-size search: exact answers, a verified final trial, few trials, and its helpers."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from jupyter_gpu.batchprobe.search import (
    BatchSizeSearch,
    Outcome,
    flat_check_size,
    flat_in_batch_size,
    memory_line,
    recommended_size,
    throughput_knee,
)

# A step: batch size -> (fitted, measured peak bytes or None).
Step = Callable[[int], tuple[bool, int | None]]
# A step that also reports its curve: batch size -> live bytes after each allocation, as the CPU budget does.
CurveStep = Callable[[int], list[int]]
Trial = tuple[int, bool, str]

MIB = 1 << 20


def run_search(start: int, maximum: int | None, budget: int | None, step: Step) -> tuple[BatchSizeSearch, list[Trial]]:
    search = BatchSizeSearch(start, maximum, budget)
    trials: list[Trial] = []
    while (size := search.next_size()) is not None:
        assert size >= start, f"went below --start: {size}"
        assert maximum is None or size <= maximum
        fitted, peak = step(size)
        search.record(size, fitted, peak if fitted else None)
        trials.append((size, fitted, search.last_step))
        assert len(trials) <= 80, f"the search does not end: {trials[-10:]}"
    return search, trials


def run_curve_search(start: int, maximum: int | None, budget: int,
                     curve: CurveStep) -> tuple[BatchSizeSearch, list[Trial]]:
    """The search fed as the CPU budget feeds it: each fitted trial's curve."""
    search = BatchSizeSearch(start, maximum, budget)
    trials: list[Trial] = []
    while (size := search.next_size()) is not None:
        assert size >= start and (maximum is None or size <= maximum)
        live = curve(size)
        fitted = max(live) <= budget
        search.record(size, fitted, max(live) if fitted else None, curve=tuple(live))
        trials.append((size, fitted, search.last_step))
        assert len(trials) <= 80, f"the search does not end: {trials[-10:]}"
    return search, trials


def brute_force_limit(step: Step, maximum: int | None, start: int = 1) -> int:
    """The largest fitting size of a monotone step, checked by its definition: it fits and one more does not.

    0 when `start` itself does not fit: the search never goes below it.
    """
    if not step(start)[0]:
        return 0
    low, high = 0, 1
    while step(high)[0]:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if step(middle)[0] else (low, middle)
    assert low == 0 or step(low)[0]
    assert not step(low + 1)[0]
    return low if maximum is None else min(low, maximum)


def linear(intercept: int, per_sample: int, budget: int) -> Step:
    return lambda n: (intercept + per_sample * n <= budget, intercept + per_sample * n)


def hidden_limit(limit: int, peak: int | None) -> Step:
    """Out of memory above a hidden size, with a peak that says nothing (flat or unmeasured)."""
    return lambda n: (n <= limit, peak)


def optimizer_bend(intercept: int, per_sample: int, budget: int) -> Step:
    """Small sizes peak in the optimizer step (batch independent), large ones in the activations."""
    optimizer_peak = (budget + intercept) // 2

    def step(n: int) -> tuple[bool, int | None]:
        peak = max(optimizer_peak, intercept + per_sample * n)
        return peak <= budget, peak

    return step


def sublinear(intercept: int, per_sample: int, budget: int) -> Step:
    def step(n: int) -> tuple[bool, int | None]:
        peak = intercept + int(per_sample * 40 * math.sqrt(n))
        return peak <= budget, peak

    return step


def superlinear(intercept: int, per_sample: int, budget: int) -> Step:
    def step(n: int) -> tuple[bool, int | None]:
        peak = intercept + per_sample * n * n // 64
        return peak <= budget, peak

    return step


def noisy_tiny_slope(intercept: int, per_sample: int, budget: int) -> Step:
    """3 bytes per sample, rounded up to the allocator's 512-byte blocks: a staircase, mostly flat."""
    del per_sample

    def step(n: int) -> tuple[bool, int | None]:
        peak = -(-(intercept + 3 * n) // 512) * 512
        return peak <= budget, peak

    return step


def jittery(intercept: int, per_sample: int, budget: int) -> Step:
    """Fits by a linear model, but each measured peak carries up to 50 samples' worth of noise."""

    def step(n: int) -> tuple[bool, int | None]:
        peak = intercept + per_sample * n
        return peak <= budget, peak + (n * 7919) % (50 * per_sample)

    return step


def contradicted(intercept: int, per_sample: int, budget: int) -> Step:
    """Peaks grow as the line says, but out of memory comes far below where the line meets the budget: something the
    budget does not see (another process's memory, fragmentation, a cap) limits the step at a fifth of it."""
    hidden = (budget - intercept) // per_sample // 5

    def step(n: int) -> tuple[bool, int | None]:
        peak = intercept + per_sample * n
        return peak <= budget and n <= hidden, peak

    return step


MODELS: dict[str, Callable[[int, int, int], Step]] = {
    "linear": linear,
    "flat-peak": lambda a, b, budget: hidden_limit(max(0, (budget - a) // b), 5 * MIB),
    "unmeasured": lambda a, b, budget: hidden_limit(max(0, (budget - a) // b), None),
    "optimizer-bend": optimizer_bend,
    "sqrt": sublinear,
    "square": superlinear,
    "noisy-tiny-slope": noisy_tiny_slope,
    "jittery": jittery,
    "contradicted": contradicted,
}


def assert_answer_verified(trials: list[Trial], answer: int) -> None:
    """The answer ran, and fitted, after the last failure (a failure can leave the allocator fragmented)."""
    last_failure = max((i for i, (_, fitted, _) in enumerate(trials) if not fitted), default=-1)
    last_answer_fit = max((i for i, (n, fitted, _) in enumerate(trials) if fitted and n == answer), default=-1)
    assert last_answer_fit > last_failure, trials


def assert_exact(start: int, maximum: int | None, budget: int, step: Step) -> list[Trial]:
    search, trials = run_search(start, maximum, budget, step)
    expected = brute_force_limit(step, maximum, start)
    assert search.answer == expected, trials
    assert search.capped == (maximum is not None and expected == maximum)
    if expected:
        assert_answer_verified(trials, expected)
    else:
        assert not any(fitted for _, fitted, _ in trials)
    return trials


# -- exactness ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("start", [1, 2, 3, 7, 32, 100])
@pytest.mark.parametrize("limit", [1, 2, 5, 31, 32, 33, 100, 257, 1000, 4097, 65_535, 300_001])
def test_answer_is_the_largest_size_that_fits(model: str, start: int, limit: int) -> None:
    intercept, per_sample = 3 * MIB, 4096
    budget = intercept + per_sample * limit + per_sample // 3
    assert_exact(start, None, budget, MODELS[model](intercept, per_sample, budget))


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize(("start", "maximum"), [(1, 1), (4, 4), (1, 50), (2, 64), (3, 1000), (8, 9), (16, 100_000)])
@pytest.mark.parametrize("limit", [0, 3, 9, 50, 63, 64, 65, 999, 5000])
def test_maximum_caps_the_answer_and_is_reported(model: str, start: int, maximum: int, limit: int) -> None:
    intercept, per_sample = 3 * MIB, 4096
    budget = intercept + per_sample * limit + 1
    assert_exact(start, maximum, budget, MODELS[model](intercept, per_sample, budget))


def test_randomised_steps_starts_and_maximums_all_get_the_exact_answer() -> None:
    rng = random.Random(20240611)
    for _ in range(1500):
        model = rng.choice(sorted(MODELS))
        intercept = rng.choice([0, 1, rng.randint(0, 10**6), rng.randint(10**8, 10**9)])
        per_sample = rng.choice([1, 7, 4096, rng.randint(1, 10**6)])
        budget = intercept + per_sample * rng.randint(0, 20_000) + rng.randint(0, per_sample - 1)
        start = rng.choice([1, 2, 3, 5, 8, 64, 1000])
        maximum = rng.choice([None, None, start, start + rng.randint(0, 30_000)])
        assert_exact(start, maximum, budget, MODELS[model](intercept, per_sample, budget))


@pytest.mark.parametrize("start", [1, 2, 5, 64, 1024])
@pytest.mark.parametrize("maximum", [None, 2048])
def test_nothing_fits_gives_zero_after_trying_only_the_start(start: int, maximum: int | None) -> None:
    search, trials = run_search(start, maximum, 10 * MIB, lambda n: (False, None))
    assert search.answer == 0
    assert not search.capped
    assert trials == [(start, False, "start")]
    assert search.start_failed


@pytest.mark.parametrize(
    ("start", "limit"), [(2, 1), (5, 1), (5, 2), (5, 3), (5, 4), (64, 1), (64, 17), (64, 63), (1000, 2), (1000, 999)]
)
def test_a_start_that_fails_is_never_gone_below(start: int, limit: int) -> None:
    # Batch size 1 crashes BatchNorm in training mode: a size below --start is the user's to choose, not ours.
    search, trials = run_search(start, None, None, hidden_limit(limit, None))
    assert trials == [(start, False, "start")]
    assert search.answer == 0 and search.start_failed


def test_the_peers_start_of_500_is_our_maximum_and_gives_exactly_100() -> None:
    # accelerate's `find_executable_batch_size(starting_batch_size=500)` with out-of-memory above 100: its
    # start is the largest size it tries, which is our --max; the answer must be exactly 100.
    search, _ = run_search(2, 500, None, hidden_limit(100, None))
    assert search.answer == 100 and not search.capped


def test_an_out_of_memory_above_8_gives_exactly_8() -> None:
    # accelerate's test_memory_explicit: every size above 8 raises out of memory.
    search, trials = run_search(2, 128, None, hidden_limit(8, None))
    assert search.answer == 8
    assert_answer_verified(trials, 8)


def test_a_limit_at_the_start_with_the_maximum_there_too_is_one_trial() -> None:
    search, trials = run_search(8, 8, 10 * MIB, linear(0, 1, 10 * MIB))
    assert trials == [(8, True, "start")]
    assert search.answer == 8
    assert search.capped


def test_capped_only_when_the_maximum_is_the_answer() -> None:
    search, _ = run_search(1, 100, 1000, linear(0, 10, 1000))
    assert search.answer == 100
    assert search.capped
    search, _ = run_search(1, 101, 1000, linear(0, 10, 1000))
    assert search.answer == 100
    assert not search.capped


# -- verification ------------------------------------------------------------------------------------------


def test_a_failure_after_the_answer_makes_the_answer_run_again() -> None:
    # Doubling to 8 fails, bisection finds 6, then 7 fails: 6 last ran before a failure, so it runs once more.
    search, trials = run_search(2, None, None, hidden_limit(6, None))
    assert search.answer == 6
    assert [(n, fitted) for n, fitted, _ in trials] == [(2, True), (4, True), (8, False), (6, True), (7, False),
                                                         (6, True)]
    assert trials[-1][2] == "re-run"
    assert search.last_step == "done"


def test_a_predicted_limit_is_approached_from_one_above_so_it_needs_no_re_run() -> None:
    # 2 and 4 fit and the line points exactly at 20: 21 is tried first, fails, and 20 then runs after it.
    search, trials = run_search(2, None, 1000 + 10 * 20, linear(1000, 10, 1000 + 10 * 20))
    assert search.answer == 20
    assert [(n, fitted) for n, fitted, _ in trials] == [(2, True), (4, True), (21, False), (20, True)]
    assert search.last_step == "done"


def test_a_bisection_that_ends_on_a_fit_is_not_re_run() -> None:
    search, trials = run_search(2, None, None, hidden_limit(3, None))
    assert [n for n, _, _ in trials] == [2, 4, 3]
    assert search.answer == 3
    assert search.last_step == "done"


# -- trial counts ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("intercept", [0, 1000, 50 * MIB, 1 << 30])
@pytest.mark.parametrize("per_sample", [1, 37, 4096, 3 * MIB])
def test_linear_memory_from_two_takes_at_most_six_trials(intercept: int, per_sample: int) -> None:
    # The intercept is the memory that does not depend on the batch (the model, the optimizer state): the
    # budget counts absolute bytes. When the first sizes' growth is under 10% of the peak, the search cannot
    # tell a dominant model from an optimizer-step peak (where only the inputs grow, see the flat-start test)
    # and approaches 8x at a time instead of jumping: one more trial per factor of 8 above 32, by design.
    rng = random.Random(intercept * 31 + per_sample)
    limits = [*range(3, 200), *(rng.randint(200, 100_000) for _ in range(300)), 100_000]
    growth = per_sample * 30 / (intercept + per_sample * 32)
    for limit in limits:
        budget = intercept + per_sample * limit + rng.randint(0, per_sample - 1)
        search, trials = run_search(2, None, budget, linear(intercept, per_sample, budget))
        assert search.answer == limit
        approach_steps = 0 if growth >= 0.1 else math.ceil(math.log(max(limit / 32, 1), 8))
        assert len(trials) <= 6 + approach_steps, (limit, trials)


def test_an_optimizer_step_peak_at_small_sizes_does_not_send_the_search_to_the_maximum() -> None:
    # Small sizes peak in optimizer.step (flat, only the inputs grow, 264 B per sample here); activations
    # (4.3 KiB per sample) take over later. The inputs' tiny slope must not be taken for the memory line.
    def peak(size: int) -> int:
        return max(1_800_000 + 264 * size, 1_006_000 + 4_400 * size)

    budget = 32 * MIB
    search, trials = run_search(2, 65536, budget, lambda size: (peak(size) <= budget, peak(size)))
    assert search.answer == (budget - 1_006_000) // 4_400
    assert max(n for n, _, _ in trials) < 4 * search.answer, trials
    assert len(trials) <= 10, trials


def doubling_then_bisection(start: int, limit: int) -> int:
    """Trials of Lightning's binsearch mode (scale_batch_size): double until a failure, then halve the bracket."""
    low, high, size, trials = 0, None, start, 0
    while True:
        trials += 1
        if size <= limit:
            low = size
            if high is None:
                size *= 2
                continue
        else:
            high = size
        if high - low <= 1:
            return trials
        size = (low + high) // 2


@pytest.mark.parametrize("start", [1, 2, 3, 5, 16, 100])
@pytest.mark.parametrize("peak", [None, 5 * MIB])
def test_a_flat_peak_searches_no_more_than_doubling_then_bisection(start: int, peak: int | None) -> None:
    for limit in [*range(start, start + 600), 4095, 4096, 65_537, 1_000_003]:
        search, trials = run_search(start, None, 10 * MIB, hidden_limit(limit, peak))
        assert search.answer == limit
        reference = doubling_then_bisection(start, limit)
        searching = len(trials) - (1 if trials[-1][2] == "re-run" else 0)
        assert searching <= reference, (limit, trials, reference)
        assert len(trials) <= reference + 1


def run_contradicted(start: int, maximum: int | None, budget: int, limit: int, per_sample: int,
                     curves: bool) -> tuple[BatchSizeSearch, list[Trial]]:
    """A step whose own memory grows by `per_sample` (so the model predicts a limit near budget / per_sample) but
    that runs out of memory above `limit`, far below: fed with curves (the CPU budget) or with peaks alone (CUDA)."""
    search = BatchSizeSearch(start, maximum, budget)
    trials: list[Trial] = []
    while (size := search.next_size()) is not None:
        live = (8 * MIB + per_sample * size // 2, 8 * MIB + per_sample * size, 9 * MIB)
        fitted = size <= limit and max(live) <= budget
        search.record(size, fitted, max(live) if fitted else None, curve=live if curves else None)
        trials.append((size, fitted, search.last_step))
        assert len(trials) <= 80, f"the search does not end: {trials[-10:]}"
    return search, trials


def test_an_out_of_memory_far_below_the_prediction_does_not_walk_down_from_the_top() -> None:
    # Issue 29: the peak at 48 is 192 KiB of a 23 GiB budget, and 49 runs out of memory. The check at 65536 fails
    # far below its predicted peak: the curve is discredited, and the search doubles on from 4, then bisects,
    # instead of halving down from 65536 (11 failures, 19 trials).
    search, trials = run_contradicted(2, 65536, 23 << 30, 48, 4096, curves=True)
    assert search.answer == 48
    assert [n for n, _, _ in trials] == [2, 4, 65536, 8, 16, 32, 64, 48, 56, 52, 50, 49, 48]
    assert trials[-1][2] == "re-run"
    assert search.discredited


@pytest.mark.parametrize("curves", [True, False], ids=["curves", "peaks"])
@pytest.mark.parametrize("start", [1, 2, 5, 16])
@pytest.mark.parametrize("maximum", [None, 65536])
def test_failures_the_model_did_not_predict_search_no_more_than_doubling_then_bisection(
        curves: bool, start: int, maximum: int | None) -> None:
    # The trials after the prediction the step contradicted are doubling from the largest size that fitted, then
    # bisection: with it, never more search trials than doubling then bisection from --start, plus that one.
    budget = 23 << 30
    for limit in [*range(start, start + 300), 1000, 4095, 4096, 30_001]:
        search, trials = run_contradicted(start, maximum, budget, limit, 4096, curves)
        assert search.answer == limit, trials
        assert_answer_verified(trials, limit)
        reference = doubling_then_bisection(start, limit)
        searching = len(trials) - (1 if trials[-1][2] == "re-run" else 0)
        contradicted = sum(1 for n, fitted, how in trials if not fitted and how in ("check", "approach", "predict")
                           and n > 2 * limit)
        assert contradicted <= 1, trials
        assert searching <= reference + contradicted, (limit, trials, reference)


def test_a_near_miss_of_the_prediction_keeps_the_model() -> None:
    # One past the predicted limit fails, as planned: that confirms the model, it does not discredit it.
    search, trials = run_search(2, None, 1000 + 10 * 20, linear(1000, 10, 1000 + 10 * 20))
    assert search.answer == 20 and not search.discredited
    assert len(trials) == 4


def test_the_reference_search_counts_its_trials() -> None:
    # 2 fits, 4 fits, 8 fails, 6 fits, 7 fails: five trials, as Lightning would run them.
    assert doubling_then_bisection(2, 6) == 5
    assert doubling_then_bisection(1, 1) == 2  # 1 fits, 2 fails


# -- memory_line -------------------------------------------------------------------------------------------


def test_memory_line_goes_through_the_two_largest_fitted_points() -> None:
    outcomes = [
        Outcome(2, True, 900),  # the optimizer step's peak: off the line
        Outcome(8, True, 1000 + 8 * 10),
        Outcome(16, True, 1000 + 16 * 10),
        Outcome(64, False),
    ]
    assert memory_line(outcomes) == (1000, 10)


def test_memory_line_ignores_sizes_at_or_above_below() -> None:
    outcomes = [Outcome(4, True, 140), Outcome(8, True, 180), Outcome(16, True, 100_000)]
    assert memory_line(outcomes, below=16) == (100, 10)


def test_memory_line_takes_the_latest_measurement_of_a_size() -> None:
    outcomes = [Outcome(4, True, 140), Outcome(8, True, 999), Outcome(8, True, 180)]
    assert memory_line(outcomes) == (100, 10)


@pytest.mark.parametrize(
    "outcomes",
    [
        [Outcome(4, True, 500), Outcome(8, True, 500)],
        [Outcome(4, True, 500), Outcome(8, True, 400)],
        [Outcome(4, True, 500)],
        [Outcome(4, True, 500), Outcome(8, True, None)],
        [Outcome(4, True, 500), Outcome(8, False, None)],
        [],
    ],
    ids=["flat", "decreasing", "one-point", "unmeasured", "failed", "empty"],
)
def test_memory_line_is_none_without_growth(outcomes: list[Outcome]) -> None:
    assert memory_line(outcomes) is None


# -- recommended_size --------------------------------------------------------------------------------------


@pytest.mark.parametrize("margin", [0.05, 0.1, 0.2, 0.5])
@pytest.mark.parametrize(("intercept", "per_sample"), [(0, 1000), (300 * MIB, 2 * MIB), (7, 3)])
def test_recommended_size_leaves_the_margin_free(margin: float, intercept: int, per_sample: int) -> None:
    budget = intercept + per_sample * 1000
    step = linear(intercept, per_sample, budget)
    search, _ = run_search(2, None, budget, step)
    assert search.answer == 1000
    recommended = recommended_size(search.outcomes, search.answer, budget, margin)
    assert 1 <= recommended < search.answer
    assert intercept + per_sample * recommended <= (1 - margin) * budget
    assert intercept + per_sample * (recommended + 1) > (1 - margin) * budget


def test_recommended_size_falls_back_to_the_margin_of_the_size() -> None:
    search, _ = run_search(1, None, 10 * MIB, hidden_limit(200, 5 * MIB))
    assert recommended_size(search.outcomes, search.answer, 10 * MIB, 0.1) == 180
    assert recommended_size(search.outcomes, search.answer, None, 0.25) == 150
    assert recommended_size([], 1, None, 0.5) == 1  # never below one sample


def test_recommended_size_never_exceeds_the_answer() -> None:
    # A capped search: the line says far more would fit than --max allows.
    search, _ = run_search(1, 64, 10**9, linear(0, 10, 10**9))
    assert search.capped
    assert recommended_size(search.outcomes, search.answer, 10**9, 0.1) == 64


def test_recommended_size_of_nothing_is_zero() -> None:
    assert recommended_size([Outcome(1, False)], 0, 1000, 0.1) == 0


# -- throughput_knee ---------------------------------------------------------------------------------------


def test_throughput_knee_is_the_smallest_size_near_the_best_rate() -> None:
    points = [(8, 500.0), (16, 900.0), (32, 960.0), (64, 1000.0), (128, 990.0)]
    assert throughput_knee(points) == 32  # 960 >= 0.95 · 1000, 900 is not
    assert throughput_knee(points, within=0.9) == 16
    assert throughput_knee(points, within=1.0) == 64


def test_throughput_knee_does_not_depend_on_order() -> None:
    points = [(128, 990.0), (8, 500.0), (64, 1000.0), (32, 960.0), (16, 900.0)]
    assert throughput_knee(points) == 32


@pytest.mark.parametrize("points", [[], [(32, 100.0)], [(8, 0.0), (16, 0.0)]])
def test_throughput_knee_needs_two_points_with_a_rate(points: list[tuple[int, float]]) -> None:
    assert throughput_knee(points) is None


def test_no_knee_where_the_fastest_is_the_largest_size_tried() -> None:
    # %batchprobe --max 256 on a transformer tried 2, 4 and 256: 256 was fastest by far, so nothing was seen to
    # level off; "throughput levels off at 256" would be a claim the trials do not make.
    assert throughput_knee([(2, 115.0), (4, 143.0), (256, 842.0)]) is None
    assert throughput_knee([(2, 115.0), (4, 143.0), (128, 830.0), (256, 842.0)]) == 128


# -- construction ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("start", "maximum"), [(0, None), (-3, None), (0, 10), (8, 4), (2, 1)])
def test_bad_construction_raises(start: int, maximum: int | None) -> None:
    with pytest.raises(ValueError):
        BatchSizeSearch(start, maximum)


def test_maximum_equal_to_start_is_allowed() -> None:
    assert BatchSizeSearch(4, 4).next_size() == 4


# -- curves: the live bytes at each allocation -----------------------------------------------------------


def training_curve(model_bytes: int, activations: list[int], optimizer_temporary: int,
                   rounding: int = 1) -> CurveStep:
    """The curve of a real step, event by event: inputs, each layer's activation (kept for backward), the
    gradients while the activations go, then the optimizer step's temporaries (batch-independent). Small sizes
    peak in the optimizer step, large ones at the end of forward; `rounding` rounds each allocation up to
    blocks, as an allocator would (a staircase, not a line)."""
    def allocation(size: int) -> int:
        return -(-size // rounding) * rounding

    def curve(n: int) -> list[int]:
        live = model_bytes
        points = []
        for per_sample in activations:
            live += allocation(per_sample * n)
            points.append(live)
        for per_sample in reversed(activations):  # backward: a gradient of the weights, an activation freed
            live += allocation(model_bytes // len(activations))
            points.append(live)
            live -= allocation(per_sample * n)
        live += optimizer_temporary
        points.append(live)
        return points

    return curve


CURVES = {
    "mlp-adam": (30 * MIB, [2_048, 16_384, 16_384, 40], 60 * MIB),
    "cnn-bn": (2 * MIB, [12_288, 65_536, 65_536, 65_536, 65_536, 16_384, 40], 4 * MIB),
    "transformer": (8 * MIB, [65_536, 196_608, 262_144, 65_536, 262_144, 65_536, 25_600], 16 * MIB),
    "huge-model": (900 * MIB, [4_096, 4_096], 1800 * MIB),
}


@pytest.mark.parametrize("shape", sorted(CURVES))
@pytest.mark.parametrize("rounding", [1, 512])
def test_curves_give_the_exact_answer_in_at_most_six_trials(shape: str, rounding: int) -> None:
    model_bytes, activations, temporary = CURVES[shape]
    curve = training_curve(model_bytes, activations, temporary, rounding)
    per_sample = sum(activations)
    reachable = []
    for target in [40, 333, 1_000, 4_581, 19_510, 65_000]:
        budget = max(curve(target)) + per_sample // 3
        search, trials = run_curve_search(2, None, budget, curve)
        expected = brute_force_limit(lambda n, b=budget: (max(curve(n)) <= b, None), None, 2)
        assert search.answer == expected, trials
        assert_answer_verified(trials, expected)
        assert len(trials) <= 6, (target, trials)
        assert len(trials) <= doubling_then_bisection(2, expected) + 1, (target, trials)
        reachable.append(target)
    assert reachable


def test_a_curve_sees_the_activations_grow_under_the_optimizer_plateau() -> None:
    # At 2 and at 4 the peak is the optimizer step's (flat): peaks alone would say "no growth"
    # and double; the curve's forward events grow, and the second trial already predicts the limit.
    model_bytes, activations, temporary = CURVES["mlp-adam"]
    curve = training_curve(model_bytes, activations, temporary)
    budget = 512 * MIB
    search, trials = run_curve_search(2, None, budget, curve)
    assert search.answer == brute_force_limit(lambda n: (max(curve(n)) <= budget, None), None, 2)
    first, second = trials[0][0], trials[1][0]
    assert max(curve(first)) == max(curve(second)), "both sizes peak on the plateau"
    assert [how for _, _, how in trials[:3]] == ["start", "double", "check"], trials
    assert len(trials) <= 5, trials


def test_a_curve_that_does_not_grow_doubles_and_never_predicts() -> None:
    flat = [5 * MIB, 7 * MIB, 6 * MIB]
    search, trials = run_curve_search(2, 4096, 64 * MIB, lambda n: flat)
    assert search.answer == 4096 and search.capped
    assert all(how in ("start", "double") for _, _, how in trials), trials


@pytest.mark.parametrize("start", [1, 2, 5, 16])
def test_a_fixed_allocation_with_a_hidden_limit_searches_no_more_than_doubling_then_bisection(start: int) -> None:
    # The first trial shows growth (a fixed buffer the step allocates), but nothing grows with the batch, and the
    # step raises out of memory above a hidden size: no jump may overshoot far past it.
    fixed = [3 * MIB, 5 * MIB, 3 * MIB]
    for limit in [*range(start, start + 300), 1000, 4095, 65_535]:
        search = BatchSizeSearch(start, None, 64 * MIB)
        trials = 0
        while (size := search.next_size()) is not None:
            trials += 1
            fitted = size <= limit
            search.record(size, fitted, max(fixed) if fitted else None, curve=tuple(fixed))
        assert search.answer == limit
        assert trials <= doubling_then_bisection(start, limit) + 1, (limit, trials)


def test_curves_of_different_lengths_fall_back_to_the_peaks() -> None:
    # A step whose allocations change with the size (another kernel past a threshold) has no event-by-event
    # line; the search must still be exact.
    def curve(n: int) -> list[int]:
        events = [MIB + 1000 * n, MIB + 3000 * n]
        return [*events, MIB] if n > 64 else events

    budget = MIB + 3000 * 777 + 5
    search, trials = run_curve_search(2, None, budget, curve)
    assert search.answer == 777
    assert_answer_verified(trials, 777)


def test_flat_in_batch_size_needs_less_than_a_byte_per_added_sample_over_a_wide_range() -> None:
    flat = [(2, 10 * MIB), (64, 10 * MIB), (65_536, 10 * MIB + 244)]  # data[:batch_size] of a 64-sample dataset
    assert flat_in_batch_size(flat)
    assert flat_in_batch_size([flat[0], flat[-1]])
    assert not flat_in_batch_size([(2, 10 * MIB), (16, 10 * MIB)])  # too narrow a range to tell
    assert not flat_in_batch_size([(2, 10 * MIB), (65_536, 10 * MIB + 4 * 65_534)])  # a 4-byte activation grew
    assert not flat_in_batch_size([(4, 10 * MIB), (1024, 10 * MIB + 1020)])  # one byte per sample: real work


def test_flat_is_judged_at_the_top_of_the_range_so_max_does_not_decide() -> None:
    # min(batch_size, 64) samples of 128 bytes: growth up to 64, then none (issue 29).
    def peak(size: int) -> int:
        return 4_232 + 128 * min(size, 64)

    for maximum in (1024, 4096, 65_536, 100_000):
        jumped = [(2, peak(2)), (4, peak(4)), (maximum, peak(maximum))]  # the memory model went straight to --max
        check = flat_check_size(jumped, start=2)
        if check is not None:
            assert check == maximum // 16
            jumped.append((check, peak(check)))
        assert flat_in_batch_size(jumped), maximum
        doubled = [(size, peak(size)) for size in (2 ** k for k in range(1, 30)) if size <= maximum]
        assert flat_in_batch_size([*doubled, (maximum, peak(maximum))]), maximum


def test_a_step_still_growing_at_the_top_is_not_flat_and_needs_no_extra_trial() -> None:
    def peak(size: int) -> int:
        return 4_232 + 128 * size

    points = [(2, peak(2)), (4, peak(4)), (4096, peak(4096))]
    assert flat_check_size(points, start=2) is None
    assert not flat_in_batch_size([*points, (256, peak(256))])
    assert flat_check_size([(2, 10), (4096, 10)], start=512) is None  # the top's base would be below --start


def test_a_memory_line_that_misses_the_smallest_batch_is_left_out_and_said_why() -> None:
    # The H200's ResNet probe: the line through the two largest trials read "118.0 GiB + 334.1 KiB per sample".
    from jupyter_gpu.batchprobe.runner import off_the_line

    gib, mib = 1 << 30, 1 << 20
    peaks = {2: 128 * mib, 4: 132 * mib, 32: 216 * mib, 22116: int(117.2 * gib), 47393: int(126.5 * gib),
             65536: int(138.9 * gib)}
    outcomes = [Outcome(size, True, peak) for size, peak in peaks.items()]
    why = off_the_line((118.0 * gib, 334.1 * 1024), outcomes)
    assert why is not None and why.startswith("No memory model: the peaks do not grow along a line with the batch")
    assert "128.0 MiB at 2" in why and "138.9 GiB at 65,536" in why
    # A line that holds at the smallest trial stays.
    linear = [Outcome(size, True, 100 * mib + size * mib) for size in (2, 8, 32, 128)]
    assert off_the_line((100 * mib, mib), linear) is None
