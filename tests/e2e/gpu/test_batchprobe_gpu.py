"""%batchprobe on a real NVIDIA GPU: the allocator cap, the exact limit, restore, the fake estimate's accuracy.

Not part of the default run (`-m "not gpu"`); scripts/gpu-check.sh runs them and prints the figures the
estimate-accuracy line of docs/batchprobe.md needs.
"""

from __future__ import annotations

import pytest
from cuda_state import warm_up_cuda_libraries

pytestmark = pytest.mark.gpu

BUDGET = 2 << 30  # 2 GiB: an emulated small card on a big one


@pytest.fixture
def cuda_model(cublas_workspace):
    # cublas_workspace: cuBLAS's workspaces are allocated before the model, not by the probe's first step, where
    # they would stay behind as "memory the probe did not give back" (memory_after == memory_before below).
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.BatchNorm1d(4096), nn.GELU(), nn.Linear(4096, 4096), nn.GELU(),
                          nn.Linear(4096, 10)).cuda()
    optimizer = torch.optim.AdamW(model.parameters())

    def step(batch_size: int) -> None:
        x = torch.randn(batch_size, 1024, device="cuda")
        y = torch.randint(0, 10, (batch_size,), device="cuda")
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()

    return model, optimizer, step


def test_the_cap_is_exact_restored_and_memory_returns(cuda_model) -> None:
    import torch

    from jupyter_gpu.batchprobe.runner import ProbeRequest, probe_batch_size

    model, optimizer, step = cuda_model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fraction = torch.cuda.get_per_process_memory_fraction(0)
    result = probe_batch_size(step, ProbeRequest(max_memory=BUDGET), namespace={"model": model, "opt": optimizer})
    print("\n" + str(result))
    assert result.device == "cuda:0" and result.accounting == "CUDA caching allocator"
    assert result.max_batch_size > 0 and result.limited_by == "memory"
    assert torch.cuda.get_per_process_memory_fraction(0) == fraction  # the cap is lifted afterwards
    assert result.memory_after == result.memory_before
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not optimizer.state
    # N+1 really does not fit under the same cap, N does.
    torch.cuda.set_per_process_memory_fraction(BUDGET / torch.cuda.get_device_properties(0).total_memory, 0)
    try:
        for size, fits in ((result.max_batch_size, True), (result.max_batch_size + 1, False)):
            torch.cuda.empty_cache()
            try:
                step(size)
                step(size)
                ran = True
            except torch.OutOfMemoryError:
                ran = False
            optimizer.zero_grad(set_to_none=True)
            optimizer.state.clear()
            assert ran == fits, size
    finally:
        torch.cuda.set_per_process_memory_fraction(fraction, 0)
        torch.cuda.empty_cache()


def test_the_fake_estimate_against_the_real_cuda_peak(cuda_model, cublas_workspace) -> None:
    import torch

    from jupyter_gpu.batchprobe.estimate import estimate_peaks

    model, optimizer, step = cuda_model
    sizes = [64, 256, 1024]
    estimate = estimate_peaks(step, sizes, namespace={"model": model, "opt": optimizer}, memory_sizes=[BUDGET])
    predicted = dict(estimate.points)
    for size in sizes:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(0)
        step(size)
        step(size)
        # The fake run counts tensors; the allocator's peak also holds cuBLAS's workspaces, which have none.
        allocated = torch.cuda.max_memory_allocated(0) - cublas_workspace
        reserved = torch.cuda.max_memory_reserved(0)
        optimizer.zero_grad(set_to_none=True)
        optimizer.state.clear()
        print(f"\nbatch {size}: estimate {predicted[size]} B, CUDA allocated peak {allocated} B without "
              f"{cublas_workspace} B of cuBLAS workspaces (ratio {predicted[size] / allocated:.3f}), reserved peak "
              f"{reserved} B")
        assert 0.8 < predicted[size] / allocated < 1.25


def test_a_cuda_out_of_memory_from_the_real_allocator_is_recovered(cuda_model) -> None:
    import torch

    from jupyter_gpu.batchprobe.runner import ProbeRequest, probe_batch_size

    model, optimizer, step = cuda_model
    allocated = torch.cuda.memory_allocated(0)
    result = probe_batch_size(step, ProbeRequest(max_memory=BUDGET, start=4096),
                              namespace={"model": model, "opt": optimizer})
    assert any(not t.fitted and "CUDA" in (t.failure or "") for t in result.trials)
    # A real out-of-memory makes PyTorch free cuBLAS's workspaces (on the H200, torch 2.11: 84 MiB fewer allocated
    # bytes afterwards than before, no tensor of ours among them); they come back at the next matrix product.
    # Warmed again, what the probe leaves allocated is exactly what was there before it.
    warm_up_cuda_libraries()
    assert torch.cuda.memory_allocated(0) == allocated
