"""PyTorch's allocator figures joined to NVML devices, and never a CUDA start on the kernel's behalf.

This machine's torch is a CPU build, so CUDA itself is faked: a stand-in for `torch.cuda` that records every
call it gets. The real CPU torch is used where it can be.
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

from fake_cuda import CudaUuid, nvml_uuid

from jupyter_gpu.kernel_torch import torch_memory_by_uuid, with_torch_memory
from jupyter_gpu.metrics.sample import DeviceSample, MigInstance, Sample

GIB = 1024**3


class FakeCuda:
    def __init__(self, initialized: bool, devices: dict[int, tuple[str, int, int]]) -> None:
        self.initialized = initialized
        self.devices = devices  # index -> (NVML's uuid, allocated, reserved)
        self.calls: list[str] = []

    def is_initialized(self) -> bool:
        self.calls.append("is_initialized")
        return self.initialized

    def device_count(self) -> int:
        self.calls.append("device_count")
        return len(self.devices)

    def get_device_properties(self, index: int) -> SimpleNamespace:
        self.calls.append("get_device_properties")
        return SimpleNamespace(uuid=CudaUuid(self.devices[index][0]))  # str() is bare hex, as torch's is

    def memory_allocated(self, index: int) -> int:
        self.calls.append("memory_allocated")
        return self.devices[index][1]

    def memory_reserved(self, index: int) -> int:
        self.calls.append("memory_reserved")
        return self.devices[index][2]


def sample(*devices: DeviceSample, status: str = "ok") -> Sample:
    return Sample(1.0, "nvml", False, status=status, devices=devices)


A, B, C = nvml_uuid(0), nvml_uuid(1), nvml_uuid(2)


def test_before_cuda_starts_only_the_flag_is_read():
    cuda = FakeCuda(False, {0: (A, GIB, 2 * GIB)})
    original = sample(DeviceSample(0, "H200", A))
    assert with_torch_memory(original, SimpleNamespace(cuda=cuda)) is original
    assert cuda.calls == ["is_initialized"], "nothing that could start CUDA is called"


def test_figures_go_to_the_device_with_the_same_uuid():
    cuda = FakeCuda(True, {0: (B, 3 * GIB, 4 * GIB), 1: (A, GIB, 2 * GIB), 2: (C, 0, 0)})
    torch = SimpleNamespace(cuda=cuda)
    assert torch_memory_by_uuid(torch) == {B[4:]: (3 * GIB, 4 * GIB), A[4:]: (GIB, 2 * GIB)}
    result = with_torch_memory(sample(DeviceSample(0, "A", A), DeviceSample(1, "B", B), DeviceSample(2, "C", C)),
                               torch)
    figures = [(d.torch_allocated, d.torch_reserved) for d in result.devices]
    assert figures == [(GIB, 2 * GIB), (3 * GIB, 4 * GIB), (None, None)], "CUDA order is not NVML order"


def test_a_mig_slice_counts_on_its_parent_gpu():
    # Under MIG, torch's props.uuid is the slice's own UUID, which NVML spells MIG-<hex>.
    first, second = nvml_uuid(1, "MIG"), nvml_uuid(2, "MIG")
    cuda = FakeCuda(True, {0: (first, GIB, 2 * GIB)})
    parent = DeviceSample(0, "A100", A, mig_enabled=True,
                          mig_instances=(MigInstance(0, first, "1g.10gb"), MigInstance(1, second, "1g.10gb")))
    [device] = with_torch_memory(sample(parent), SimpleNamespace(cuda=cuda)).devices
    assert (device.torch_allocated, device.torch_reserved) == (GIB, 2 * GIB)


def test_no_driver_sample_is_left_alone():
    cuda = FakeCuda(True, {0: (A, GIB, 2 * GIB)})
    original = sample(status="no_driver")
    assert with_torch_memory(original, SimpleNamespace(cuda=cuda)) is original


def test_with_the_real_cpu_torch_nothing_changes_and_cuda_stays_down():
    code = """
import torch
from jupyter_gpu.metrics.sample import DeviceSample, Sample
from jupyter_gpu.kernel_torch import with_torch_memory
s = Sample(1.0, "nvml", False, devices=(DeviceSample(0, "H200", "GPU-aaaa"),))
assert with_torch_memory(s) is s
print(torch.cuda.is_initialized())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_torch_is_not_imported_by_asking():
    code = """
import sys
from jupyter_gpu.metrics.sample import Sample
from jupyter_gpu.kernel_torch import with_torch_memory
with_torch_memory(Sample(1.0, "nvml", False))
print("torch" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_compiled_checkpointed_block_runs_under_the_probes_dispatch_mode():
    # %speedprobe counts a compiled step's operators under handler_mode; a checkpointed block with dropout, compiled
    # with inductor's fallback_random (how %speedprobe compiles a step with dropout), runs the higher-order operator
    # run_and_save_rng_state, for which torch raised NotImplementedError under a mode that does not declare it
    # supports them: the compile trial was reported as "torch.compile failed".
    import torch
    import torch._inductor.config as inductor_config
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    from jupyter_gpu.kernel_torch import handler_mode

    block = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.1))
    forward = torch.compile(lambda x: checkpoint(block, x, use_reentrant=False).sum())
    x = torch.randn(4, 8)
    seen: list[str] = []

    def count(func, args, kwargs):
        seen.append(func.overloadpacket.__name__)  # an OpOverload's attribute: a higher-order operator has none
        return func(*args, **kwargs)

    with inductor_config.patch(fallback_random=True):
        forward(x).backward()
        with handler_mode(count):
            forward(x).backward()
    assert seen and block[0].weight.grad is not None
