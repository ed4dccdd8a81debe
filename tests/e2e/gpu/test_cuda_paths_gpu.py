"""On a real GPU, what the CPU suite checks against fake_cuda.py: torch's UUID spelling against NVML's, events on
the step's device and stream, side streams seen by the operator counter, and the allocator's settings."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_torchs_uuid_is_nvmls_without_its_prefix():
    import pynvml

    from jupyter_gpu.device_uuid import canonical_uuid
    from jupyter_gpu.kernel_torch import torch_uuid

    torch.ones(1, device="cuda")
    text = str(torch.cuda.get_device_properties(0).uuid)
    assert canonical_uuid(text) == text, f"torch's uuid is bare lower-case hex: {text!r}"
    pynvml.nvmlInit()
    try:
        nvml = [canonical_uuid(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)))
                for i in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()
    assert torch_uuid(torch, 0) in nvml


def test_the_clock_times_work_on_the_current_stream_and_counts_side_streams():
    from jupyter_gpu.gputime.opcount import OpCounter
    from jupyter_gpu.probekit.clock import DeviceClock

    x = torch.randn(4096, 4096, device="cuda")
    clock = DeviceClock(torch)
    _, gpu = clock.time(lambda: [x @ x for _ in range(10)])
    assert gpu is not None and gpu > 0
    side = torch.cuda.Stream()
    counter = OpCounter(torch)
    with counter:
        y = x @ x
        with torch.cuda.stream(side):
            z = x @ x
    torch.cuda.synchronize()
    counts = counter.result()
    assert counts.cuda_devices == (torch.cuda.current_device(),)
    assert counts.side_stream_ops >= 1, counts
    del y, z


def test_a_cell_that_calls_set_device_is_timed_in_a_fresh_process():
    # Fresh process: the first CUDA use happens inside the timed cell, and set_device switches mid-cell.
    code = textwrap.dedent("""
        import torch
        from jupyter_gpu.probekit.clock import DeviceClock
        torch.ones(1, device="cuda")
        def cell():
            torch.cuda.set_device(torch.cuda.device_count() - 1)
            a = torch.randn(2048, 2048, device="cuda")
            (a @ a).sum()
        wall, gpu = DeviceClock(torch).time(cell)
        print(wall > 0, gpu is not None and gpu >= 0)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "True"]


def test_the_allocator_setting_is_read_from_either_variable_in_a_fresh_process():
    code = ("import torch; torch.ones(1, device='cuda');"
            "from jupyter_gpu.gpumem.allocator import expandable_segments_on; import os;"
            "print(expandable_segments_on(torch, os.environ))")
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        env = {k: v for k, v in os.environ.items() if "ALLOC_CONF" not in k}
        env.update({name: "expandable_segments:True", "PYTHONPATH": os.pathsep.join(sys.path)})
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == "True", (name, done.stdout, done.stderr[-500:])
