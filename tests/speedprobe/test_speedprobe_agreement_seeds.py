"""Correct AMP agrees on every seed (issue 29, point 5), and broken AMP is still wrong: `probe_speed` for real on the
CPU, bf16 and fp16 autocast, on the issue's MLP and the three bench models, ten seeds each, with few steps."""

from __future__ import annotations

import gc

import pytest
import torch
from training_steps import (
    BENCH_MODEL_NAMES,
    Training,
    bench_model,
    cancelling_in_half_precision,
    mlp_with_momentum,
    overflowing_once_in_fp16,
)

from jupyter_gpu.speedprobe import measure
from jupyter_gpu.speedprobe.runner import probe_speed

SEEDS = range(10)
AMP = ("amp-bf16", "amp-fp16")


@pytest.fixture
def quick_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    # Agreement is under test, not timing: no configuration needs its 0.2 s, or five, of timed steps here.
    monkeypatch.setattr(measure, "MIN_TIMED_SECONDS", 0.0)
    monkeypatch.setattr(measure, "MIN_TIMED_STEPS", 1)


@pytest.fixture(scope="module", autouse=True)
def _imports_out_of_the_collections():
    # Each probe ends with gc.collect(), which walks every object torch and pytest imported: 0.3-0.5 s a probe here,
    # forty probes. Frozen, those objects are skipped; what the probes create is still collected.
    gc.freeze()
    yield
    gc.unfreeze()


def verdicts(training: Training, steps: int = 4) -> dict[str, object]:
    result = probe_speed(training.step, options=AMP, steps=steps, namespace=training.namespace())
    return {trial.name: trial.agreement for trial in result.options}


@pytest.mark.parametrize("model", ["issue-mlp", *BENCH_MODEL_NAMES])
def test_correct_amp_agrees_on_every_seed(quick_timing: None, model: str) -> None:
    torch.set_num_threads(1)  # this machine's second thread only adds waiting (bench/bench_speedprobe.py)
    wrong = {}
    for seed in SEEDS:
        training = mlp_with_momentum(seed) if model == "issue-mlp" else bench_model(model, seed)
        for name, agreement in verdicts(training).items():
            if agreement is None or agreement.agrees is not True:
                wrong[(seed, name)] = agreement
    assert not wrong, wrong


def test_amp_that_loses_the_signal_is_still_wrong(quick_timing: None) -> None:
    # The tolerances are wide enough for every seed above, and still far from what a real failure does.
    bf16 = verdicts(cancelling_in_half_precision(), steps=3)["amp-bf16"]
    assert bf16.agrees is False and "times the baseline's along its direction" in bf16.failure, bf16
    assert bf16.update_scale is not None and bf16.update_scale > 10


def test_fp16_whose_scaler_skips_its_first_step_is_measured_from_the_scale_it_found(quick_timing: None) -> None:
    # Skipping the first step is the GradScaler finding its scale, not wrong numbers; from 65536 the run would lag
    # the baseline by a step and have no first update to compare.
    training = overflowing_once_in_fp16()
    result = probe_speed(training.step, options=("amp-fp16",), steps=4, namespace=training.namespace())
    fp16 = result.option("amp-fp16").agreement
    assert fp16.agrees is True, fp16
    assert fp16.update_rel_l2 is not None and fp16.update_rel_l2 < 0.01
    settled = [note for note in result.notes if "settled at 32768" in note and "measured again from 32768" in note]
    assert settled, result.notes
