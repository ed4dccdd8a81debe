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
