"""`%dataprobe` with a real CUDA step: GPU idle gaps from CUDA events, pinned memory with non_blocking copies.

Needs an NVIDIA GPU; scripts/gpu-check.sh runs it (`-m gpu`)."""

from __future__ import annotations

import pytest
import torch
from cuda_state import warm_up_cuda_libraries
from sleepy_data import SleepyDataset
from torch import nn
from torch.utils.data import DataLoader

from jupyter_gpu.dataprobe.runner import DataProbeRequest, run_dataprobe

pytestmark = pytest.mark.gpu  # tests/conftest.py skips it, with the reason, where CUDA is not available


def test_a_cuda_step_gets_gpu_idle_gaps_pinned_settings_and_its_state_back():
    model = nn.Sequential(nn.Linear(8, 4096), nn.ReLU(), nn.Linear(4096, 10)).cuda()
    opt = torch.optim.Adam(model.parameters())
    weights = [p.detach().clone() for p in model.parameters()]

    def step(batch):
        x, y = batch
        x, y = x.cuda(non_blocking=True), torch.as_tensor(y).cuda(non_blocking=True)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    warm_up_cuda_libraries()  # cuBLAS's workspaces (no tensor behind them) are not the probe's to give back
    allocated = torch.cuda.memory_allocated()
    loader = DataLoader(SleepyDataset(4096, 0.002), batch_size=16)  # 32 ms a batch: input-bound on any GPU
    result = run_dataprobe(loader, step, DataProbeRequest((0, 1, 2, 4), 20.0), loader_name="loader",
                           step_name="step", namespace={"model": model, "opt": opt})
    print(result)
    assert result.device.startswith("cuda")
    assert result.together.gpu_idle_fraction is not None and result.together.gpu_idle_fraction > 0.5
    assert result.verdict == "input-bound"
    assert any(trial.settings.pin_memory for trial in result.trials)
    assert result.recommended_settings.num_workers >= 2
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), weights, strict=True))
    assert torch.cuda.memory_allocated() <= allocated


def test_a_dataset_that_returns_cuda_tensors_blocks_forked_workers_before_they_start():
    class OnTheGpu(torch.utils.data.Dataset):
        def __len__(self):
            return 256

        def __getitem__(self, index):
            return torch.zeros(4, device="cuda")  # touches CUDA in __getitem__, holds no CUDA tensor

    torch.ones(1, device="cuda")  # the kernel has started CUDA, as a training notebook has
    loader = DataLoader(OnTheGpu(), batch_size=8, multiprocessing_context="fork", num_workers=1)
    result = run_dataprobe(loader, None, DataProbeRequest((0, 1), 3.0), loader_name="loader")
    (finding,) = [finding for finding in result.pitfalls if finding.code == "CUDA_IN_FORKED_WORKER"]
    assert "a batch it yields, on cuda" in finding.headline
    assert {trial.settings.num_workers for trial in result.trials} == {0}
