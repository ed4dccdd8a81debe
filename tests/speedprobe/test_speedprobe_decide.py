"""The agreement rules of `%speedprobe` (decide.py), pure: tolerances that do not swing with the seed, and the real
failures still failures."""

from __future__ import annotations

import math

import pytest

from jupyter_gpu.speedprobe import decide

LOSSES = [2.30, 2.28, 2.27, 2.25]


def test_the_floor_of_a_reduced_format_is_eight_square_roots_of_its_roundoff() -> None:
    assert decide.tolerance("float16", None, None) == pytest.approx(8 * math.sqrt(2 ** -11))  # 0.18
    assert decide.tolerance("bfloat16", None, None) == pytest.approx(0.5)
    assert decide.tolerance("tf32", None, None) == pytest.approx(8 * math.sqrt(2 ** -11))
    assert decide.tolerance("float32", None, None) == decide.FP32_REORDER_TOLERANCE
    # A tiny rounding sensitivity (no ReLU flipped when the weights were rounded) no longer shrinks the tolerance.
    assert decide.tolerance("float16", 1.8e-4, 0.0) == decide.tolerance("float16", None, None)
    assert decide.tolerance("float16", 0.06, None) == pytest.approx(0.24)  # four times a larger one


def test_an_update_of_the_wrong_size_is_wrong_even_where_its_direction_is_not_compared() -> None:
    # Clipping gradients still multiplied by 65536: the update shrinks to nothing, in a step whose update is too
    # sensitive to rounding for its direction to be compared, and over few steps the loss hardly notices.
    verdict = decide.judge("float16", 1.0, 0.9, LOSSES, LOSSES, update_scale=1.5e-5)
    assert verdict.agrees is False and "1.5e-05 times the baseline's along its direction" in verdict.failure
    assert decide.judge("float16", 0.3, 0.9, LOSSES, LOSSES, update_scale=0.97).agrees is True
    stepped_on_scaled = decide.judge("float16", 65535.0, 0.088, LOSSES, LOSSES, update_scale=65536.0)
    assert stepped_on_scaled.agrees is False


def test_the_loss_may_drift_as_far_as_training_carries_rounding() -> None:
    drifted = [value * 1.03 for value in LOSSES]
    assert decide.loss_limit(None) == decide.LOSS_DRIFT_LIMIT
    assert decide.loss_limit(0.001) == decide.LOSS_DRIFT_LIMIT
    assert decide.loss_limit(0.02) == pytest.approx(0.08)
    # A loss computed in bf16 is itself rounded: four units of bf16's roundoff (1.6%); fp16's four (0.2%) stay under 1%.
    assert decide.loss_limit(None, "bfloat16") == pytest.approx(4 * 2.0 ** -8)
    assert decide.loss_limit(0.001, "float16") == decide.LOSS_DRIFT_LIMIT
    assert decide.judge("bfloat16", 0.2, 0.6, drifted, LOSSES, update_scale=0.98, drift_limit=0.08).agrees is True
    wrong = decide.judge("bfloat16", 0.2, 0.6, drifted, LOSSES, update_scale=0.98)
    assert wrong.agrees is False and "limit 1%" in wrong.failure


def test_non_finite_numbers_are_failures_whatever_the_tolerance() -> None:
    nan_loss = decide.judge("float16", 0.01, 0.5, [2.3, math.nan], LOSSES[:2], update_scale=1.0,
                            drift_limit=1.0)
    assert nan_loss.agrees is False and "NaN at step 2" in nan_loss.failure
    inf_update = decide.judge("float16", math.inf, 0.5, LOSSES, LOSSES, update_scale=math.inf)
    assert inf_update.agrees is False and "NaN or inf" in inf_update.failure


def test_a_skipped_first_step_leaves_the_loss_to_decide() -> None:
    note = decide.first_step_skipped_note(65536.0)
    verdict = decide.judge("float16", None, 0.088, LOSSES, LOSSES, update_note=note)
    assert verdict.agrees is True and verdict.note == note and "65536" in note
