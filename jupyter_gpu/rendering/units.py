"""Human-readable durations, byte counts and counts, shared by every renderer."""

from __future__ import annotations

_TIME_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"))
_BYTE_UNITS = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def format_seconds(seconds: float | None, digits: int = 3) -> str:
    """`0.00123` -> `1.23 ms`: three significant digits, like `%timeit`."""
    if seconds is None:
        return "n/a"
    if seconds == 0:
        return "0 s"
    if abs(seconds) >= 59.95:
        minutes, rest = divmod(round(seconds, 1), 60)
        return f"{int(minutes)} min {rest:.1f} s"
    magnitude = abs(seconds)
    for index, (scale, unit) in enumerate(_TIME_UNITS):
        if magnitude >= scale or index == len(_TIME_UNITS) - 1:
            text = _significant(seconds / scale, digits)
            # 0.9999 s rounds to "1000 ms": say "1.00 s" instead.
            if index > 0 and abs(float(text)) >= 1000:
                bigger_scale, bigger_unit = _TIME_UNITS[index - 1]
                return f"{_significant(seconds / bigger_scale, digits)} {bigger_unit}"
            return f"{text} {unit}"
    raise AssertionError("unreachable: the last unit always matches")


def format_bytes(count: int | float | None) -> str:
    if count is None:
        return "n/a"
    sign = "-" if count < 0 else ""
    magnitude = abs(count)
    for scale, unit in _BYTE_UNITS:
        if magnitude >= scale:
            return f"{sign}{magnitude / scale:.1f} {unit}"
    return f"{sign}{int(magnitude)} B"


def format_growth(count: int) -> str:
    """`+12.0 MiB`, `-3.0 MiB`, `0 B`: growth reads as growth."""
    return "+" + format_bytes(count) if count > 0 else format_bytes(count)


_SIZE_SUFFIXES = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
                  "t": 1000**4, "tb": 1000**4, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(text: str) -> int:
    """`6GiB` -> 6·2**30, `24GB` -> 24·10**9 (SI, as written), `512MiB`, `1.5TiB`, or plain bytes."""
    cleaned = text.strip().replace("_", "")
    number = cleaned.rstrip("bBkKmMgGtTiI ")
    suffix = cleaned[len(number):].strip().lower()
    if suffix not in _SIZE_SUFFIXES or not number:
        raise ValueError(f"{text!r} is not a memory size; write it like 6GiB, 512MiB or 24GB")
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{text!r} is not a memory size; write it like 6GiB, 512MiB or 24GB") from None
    if not value > 0:
        raise ValueError(f"a memory size must be positive, not {text!r}")
    return int(value * _SIZE_SUFFIXES[suffix])


def format_count(count: int) -> str:
    return f"{count:,}"


def format_rate(rate: float | None) -> str:
    """Samples per second: `52,000,000`, `1,234`, `12.3`, `0.412`; a slow rate never shows as "0"."""
    if rate is None:
        return "n/a"
    if rate == 0 or abs(rate) >= 100:
        return f"{rate:,.0f}"
    return _significant(rate, 3)


def _significant(value: float, digits: int) -> str:
    # 123 -> "123", 12.3 -> "12.3", 1.23 -> "1.23": the same precision whatever the unit.
    whole = len(str(int(abs(value)))) if abs(value) >= 1 else 1
    return f"{value:.{max(digits - whole, 0)}f}"


def format_duration(seconds: float | None) -> str:
    """`10800` -> `3 h`: how long something has been idle or busy, rounded the way people say it."""
    if seconds is None:
        return "n/a"
    seconds = seconds if seconds > 0 else 0.0  # clock skew is 0 s; so is -0.0, which max() would keep
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    hours = seconds / 3600
    if hours < 48:
        return f"{hours:.1f} h".replace(".0 h", " h") if hours < 10 else f"{hours:.0f} h"
    return f"{hours / 24:.0f} d"
