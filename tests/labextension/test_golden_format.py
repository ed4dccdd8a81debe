"""The golden byte and duration text, which the TypeScript tests check formatBytes/formatDuration against, is
what jupyter_gpu.rendering.units writes now."""

from __future__ import annotations

import json
from decimal import ROUND_HALF_UP, Decimal

from golden_format import GOLDEN, build_golden, render

from jupyter_gpu.rendering.units import format_bytes, format_duration


def test_the_committed_golden_is_what_the_python_formatters_write() -> None:
    # On a deliberate change of rendering/units.py: python tests/fixtures/golden_format.py --write (the TS tests
    # follow).
    committed = GOLDEN.read_text()
    assert json.loads(committed) == build_golden(), "regenerate: python tests/fixtures/golden_format.py --write"
    assert committed == render(build_golden()), "regenerate: python tests/fixtures/golden_format.py --write"


def test_every_case_is_the_formatters_output_and_valid_json() -> None:
    golden = json.loads(GOLDEN.read_text(), parse_constant=_refuse)  # NaN and Infinity are not JSON
    for case in golden["bytes"]:
        assert format_bytes(case["input"]) == case["text"], case
    for case in golden["duration"]:
        assert format_duration(case["input"]) == case["text"], case


def _refuse(name: str) -> None:
    raise AssertionError(f"{name} is not JSON: JSON.parse in the TypeScript test would fail")


def _half_up(value: float, digits: int) -> str:
    # What JavaScript's toFixed writes: the exact binary value rounded, an exact tie away from zero.
    return str(Decimal(value).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def test_the_golden_covers_every_unit_the_missing_reading_and_the_ties() -> None:
    golden = json.loads(GOLDEN.read_text())
    byte_texts = [case["text"] for case in golden["bytes"]]
    duration_texts = [case["text"] for case in golden["duration"]]
    assert {None} <= {case["input"] for case in golden["bytes"]} and "n/a" in byte_texts
    assert {None} <= {case["input"] for case in golden["duration"]} and "n/a" in duration_texts
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        assert any(text.endswith(f" {unit}") for text in byte_texts), unit
        assert any(text.startswith("-") and text.endswith(f" {unit}") for text in byte_texts), f"negative {unit}"
    for unit in ("s", "min", "h", "d"):
        assert any(text.endswith(f" {unit}") for text in duration_texts), unit
    assert any("." in text and text.endswith(" h") for text in duration_texts)  # one decimal under 10 h

    # Cases where round-half-even (Python) and round-half-up (toFixed) disagree: what pyFixed exists for.
    byte_ties = 0
    for case in golden["bytes"]:
        value = case["input"]
        for scale in (1 << 40, 1 << 30, 1 << 20, 1 << 10):
            if value is not None and abs(value) >= scale:
                byte_ties += case["text"].split()[0].lstrip("-") != _half_up(abs(value) / scale, 1)
                break
    assert byte_ties >= 4
    duration_ties = 0
    for case in golden["duration"]:
        number = case["text"].split()[0]
        value = case["input"]
        if value is not None and value > 0 and case["text"].endswith(" s"):
            duration_ties += number != _half_up(value, 0)
        elif value is not None and case["text"].endswith(" min"):
            duration_ties += number != _half_up(value / 60, 0)
        elif value is not None and case["text"].endswith(" d"):
            duration_ties += number != _half_up(value / 86400, 0)
    assert duration_ties >= 4

    # The thresholds of format_duration are each met from just below.
    inputs = {case["input"]: case["text"] for case in golden["duration"]}
    assert inputs[89.5] == "90 s" and inputs[90] == "2 min"
    assert inputs[5399] == "90 min" and inputs[5400] == "1.5 h"
    assert inputs[35999] == "10 h" and inputs[36000] == "10 h"
    assert inputs[172799] == "48 h" and inputs[172800] == "2 d"
