"""Durations, byte counts and counts as every renderer writes them."""

from __future__ import annotations

import pytest

from jupyter_gpu.rendering.units import format_bytes, format_rate, format_seconds


@pytest.mark.parametrize(("seconds", "text"), [
    (0.00123, "1.23 ms"),
    (1.5, "1.50 s"),
    (2.5e-7, "250 ns"),
    (1.5e-5, "15.0 µs"),
    (12.3, "12.3 s"),
    (None, "n/a"),
    (90.0, "1 min 30.0 s"),
    (3725.5, "62 min 5.5 s"),
])
def test_format_seconds(seconds: float | None, text: str) -> None:
    assert format_seconds(seconds) == text


@pytest.mark.parametrize(("seconds", "text"), [
    (0.0009999, "1.00 ms"),      # not "1000 µs"
    (0.9999, "1.00 s"),          # not "1000 ms"
    (119.99, "2 min 0.0 s"),     # not "1 min 60.0 s"
])
def test_format_seconds_rounding_moves_to_the_next_unit(seconds: float, text: str) -> None:
    assert format_seconds(seconds) == text


@pytest.mark.parametrize(("count", "text"), [
    (0, "0 B"),
    (1023, "1023 B"),
    (1536, "1.5 KiB"),
    (3 << 20, "3.0 MiB"),
    (1 << 30, "1.0 GiB"),
    (-1536, "-1.5 KiB"),
    (-(512 << 20), "-512.0 MiB"),
    (None, "n/a"),
])
def test_format_bytes(count: int | None, text: str) -> None:
    assert format_bytes(count) == text


@pytest.mark.parametrize(("rate", "text"), [(52_000_000.4, "52,000,000"), (1234.5, "1,234"), (100.0, "100"),
                                           (12.34, "12.3"), (0.4123, "0.41"), (0.0, "0"), (None, "n/a")])
def test_format_rate_never_shows_a_slow_rate_as_zero(rate: float | None, text: str) -> None:
    assert format_rate(rate) == text
