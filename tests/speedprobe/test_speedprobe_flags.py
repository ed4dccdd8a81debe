"""The process-wide switches `%speedprobe` turns are put back exactly, on torch's new fp32_precision settings
(where reading an old flag after the new API was used raises) as on the old ones."""

from __future__ import annotations

import torch

from jupyter_gpu.speedprobe.flags import GlobalFlags, enable_tf32, tf32_enabled


def test_tf32_and_cudnn_switches_are_put_back_exactly() -> None:
    flags = GlobalFlags.take(torch)
    benchmark = torch.backends.cudnn.benchmark
    try:
        enable_tf32(torch)
        torch.backends.cudnn.benchmark = not benchmark
        assert tf32_enabled(torch)
        assert flags.differences(torch)  # the change is seen
    finally:
        flags.restore(torch)
    assert flags.differences(torch) == []
    assert torch.backends.cudnn.benchmark is benchmark
    assert not tf32_enabled(torch)
    assert torch.get_float32_matmul_precision() == "highest"


def test_anomaly_detection_a_cell_turns_on_is_put_back_without_a_warning_when_unchanged(recwarn) -> None:
    flags = GlobalFlags.take(torch)
    try:
        torch.autograd.set_detect_anomaly(True, check_nan=False)
        assert flags.differences(torch) == ["autograd anomaly detection"]
    finally:
        flags.restore(torch)
    assert not torch.is_anomaly_enabled() and torch.is_anomaly_check_nan_enabled()
    # A notebook debugging with it on: every probe's restore of an unchanged flag would warn "Anomaly Detection has
    # been enabled" again, were it set regardless.
    torch.autograd.set_detect_anomaly(True)
    try:
        debugging = GlobalFlags.take(torch)
        recwarn.clear()
        debugging.restore(torch)
        assert not [w for w in recwarn if "Anomaly Detection" in str(w.message)]
    finally:
        torch.autograd.set_detect_anomaly(False)


def test_a_step_that_sets_a_flag_itself_has_it_put_back(tmp_path) -> None:
    from training_steps import mlp_with_adam

    from jupyter_gpu.speedprobe.runner import probe_speed

    training = mlp_with_adam()
    inner = training.step

    def step() -> torch.Tensor:
        torch.backends.cudnn.benchmark = True
        torch.set_float32_matmul_precision("high")
        return inner()

    flags = GlobalFlags.take(torch)
    probe_speed(step, options=("fused-optimizer",), steps=2, namespace=training.namespace())
    assert flags.differences(torch) == []
    assert torch.get_float32_matmul_precision() == "highest"
