"""%gpupanel against the real NVML and CUDA. Not part of the default run; scripts/gpu-check.sh runs it."""

from __future__ import annotations

import os
import time

import pytest

from jupyter_gpu.metrics.backends.nvml import NvmlBackend
from jupyter_gpu.metrics.hub import SamplerHub

pytestmark = pytest.mark.gpu


def test_nvml_backend_read_is_fast_enough_for_the_sampler():
    backend = NvmlBackend()
    backend.read()  # NVML start-up and the first PCIe read
    started = time.perf_counter()
    reads = 20
    for _ in range(reads):
        sample = backend.read()
    per_read = (time.perf_counter() - started) / reads
    backend.close()
    print(f"NvmlBackend.read(): {per_read * 1e3:.2f} ms for {len(sample.devices)} GPU(s)")
    assert sample.status == "ok" and sample.devices
    assert per_read < 0.1, "the 0.1 s sampler of %%gputime must keep its rate"


def test_panel_shows_real_values_and_this_kernels_pytorch_memory():
    import torch

    from jupyter_gpu.widgets.panel import GpuPanel

    held = torch.empty(256 * 1024**2, dtype=torch.uint8, device="cuda")  # 256 MiB in this process
    torch.cuda.synchronize()
    hub = SamplerHub(NvmlBackend)
    panel = GpuPanel(hub, interval=0.2)
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            sample = panel.latest
            mine = [d for d in sample.devices if d.torch_reserved]
            if mine:
                break
            time.sleep(0.1)
        print(sample.to_dict())
        assert mine, "PyTorch's allocator figures reach the device this kernel uses"
        device = mine[0]
        assert device.torch_reserved >= 256 * 1024**2 and device.torch_allocated >= 256 * 1024**2
        assert device.memory_total and device.memory_used and device.temperature_c is not None
        pids = {p.pid for p in device.processes or ()}
        # Inside a container NVML lists host PIDs; then the kernel is found through PyTorch's figures instead.
        print("NVML processes:", device.processes, "this pid:", os.getpid(), "listed:", os.getpid() in pids)
        row = panel.rows[device.index]
        assert "this kernel" in row.memory_line.value and "PyTorch" in row.memory_line.value
    finally:
        panel.close()
        del held
