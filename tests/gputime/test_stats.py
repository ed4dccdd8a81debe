"""`%%gputime`'s statistics: median, quartiles, spread."""

from __future__ import annotations

import pytest

from jupyter_gpu.gputime.stats import summarize


def test_summary_of_known_data() -> None:
    stats = summarize([4.0, 1.0, 3.0, 2.0])
    assert (stats.n, stats.median, stats.minimum, stats.maximum, stats.mean) == (4, 2.5, 1.0, 4.0, 2.5)


@pytest.mark.parametrize(("times", "q1", "q3"), [
    ([1.0, 2.0, 3.0, 4.0], 1.75, 3.25),
    ([1.0, 2.0, 3.0, 4.0, 5.0], 2.0, 4.0),
    ([10.0, 20.0], 12.5, 17.5),
])
def test_quartiles_interpolate_linearly(times: list[float], q1: float, q3: float) -> None:
    stats = summarize(times)
    assert (stats.q1, stats.q3, stats.iqr) == pytest.approx((q1, q3, q3 - q1))


def test_single_run_has_zero_iqr() -> None:
    stats = summarize([0.7])
    assert (stats.q1, stats.q3, stats.iqr) == (0.7, 0.7, 0.0)


@pytest.mark.parametrize(("times", "large"), [
    ([1.0, 4.1], True),
    ([1.0, 4.0], False),      # exactly 4x is the limit, not over it
    ([1.0, 1.1, 1.2], False),
    ([5.0], False),           # one run has no spread
    ([0.0, 1.0], False),      # an unmeasurably short run gives no ratio
])
def test_spread_is_large_only_over_four_times(times: list[float], large: bool) -> None:
    assert summarize(times).spread_is_large is large


def test_empty_timings_raise() -> None:
    with pytest.raises(ValueError, match="No timings"):
        summarize([])


def test_stats_to_dict_has_derived_values() -> None:
    data = summarize([1.0, 2.0, 3.0, 4.0]).to_dict()
    assert data["iqr"] == pytest.approx(1.5)
    assert data["spread_ratio"] == pytest.approx(4.0)
    assert data["median"] == 2.5
