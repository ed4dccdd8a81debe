"""What the names leave unexplained on a device, labelled with its holder and the advice that fits: the pure
reconciliation on CUDA figures, and the allocator probe reading them from a stand-in for torch.cuda (this machine
has no GPU)."""

from __future__ import annotations

import types

import pytest
import torch
from fake_cuda import FakeCuda, FakeGpu, nvml_uuid

from jupyter_gpu.gpumem.allocator import ALLOCATED, device_totals, expandable_segments_on, process_bytes
from jupyter_gpu.gpumem.reconcile import CACHE, CONTEXT, FRAGMENTATION, UNREACHABLE_CUDA, UNREACHED, remainders
from jupyter_gpu.gpumem.result import DeviceTotals
from jupyter_gpu.gpumem.walk import NotebookWalk
from jupyter_gpu.metrics.sample import DeviceSample, GpuProcess, MigInstance, Sample

MIB = 1024 * 1024
GIB = 1024 * MIB


def cuda(**figures) -> DeviceTotals:
    values = {"device": "cuda:0", "named_bytes": 900 * MIB, "total_bytes": 1000 * MIB, "total_source": ALLOCATED,
              "reserved_bytes": 1000 * MIB, "inactive_split_bytes": 0, "process_bytes": None}
    return DeviceTotals(**{**values, **figures})


def labels(totals: DeviceTotals) -> dict[str, int]:
    return {remainder.label: remainder.bytes for remainder in remainders(totals)}


def test_what_no_path_names_is_not_reachable_from_python_and_the_gc_share_is_apart() -> None:
    found = labels(cuda(unreached_bytes=30 * MIB))
    assert found == {UNREACHED: 30 * MIB, UNREACHABLE_CUDA: 70 * MIB}


def test_reserved_minus_allocated_is_the_cache_with_empty_cache_advice() -> None:
    [cache] = [r for r in remainders(cuda(named_bytes=1000 * MIB, reserved_bytes=3 * GIB)) if r.label == CACHE]
    assert cache.bytes == 3 * GIB - 1000 * MIB and "--free cache" in cache.advice


def test_large_inactive_split_blocks_are_fragmentation_with_the_expandable_segments_advice() -> None:
    totals = cuda(named_bytes=1000 * MIB, reserved_bytes=3 * GIB, inactive_split_bytes=800 * MIB)
    [split] = [r for r in remainders(totals) if r.label == FRAGMENTATION]
    assert split.bytes == 800 * MIB and "expandable_segments:True" in split.advice and "trade-off" in split.advice
    [again] = [r for r in remainders(cuda(named_bytes=1000 * MIB, reserved_bytes=3 * GIB,
                                          inactive_split_bytes=800 * MIB, expandable_segments=True))
               if r.label == FRAGMENTATION]
    assert "already on" in again.advice
    # A small share of the cache is not worth the advice: empty_cache() returns most of it.
    assert FRAGMENTATION not in labels(cuda(named_bytes=1000 * MIB, reserved_bytes=3 * GIB,
                                            inactive_split_bytes=100 * MIB))


def test_nvml_beyond_reserved_is_the_cuda_context_and_libraries() -> None:
    assert labels(cuda(named_bytes=1000 * MIB, process_bytes=1500 * MIB))[CONTEXT] == 500 * MIB


def test_rounding_below_a_mebibyte_is_not_reported() -> None:
    assert remainders(cuda(named_bytes=1000 * MIB - 4096, reserved_bytes=1000 * MIB + 4096)) == []


def one_gpu_with_a_cache() -> FakeCuda:
    """600 MiB allocated on cuda:0 after a 2 GiB peak: the allocator keeps 2 GiB reserved, 300 MiB of it split."""
    cuda = FakeCuda()
    peak = cuda.allocate(2 * GIB - 600 * MIB)
    cuda.allocate(600 * MIB)
    cuda.free(peak)
    cuda.allocators[0].inactive_split = 300 * MIB
    return cuda


def test_the_allocator_probe_reads_each_used_device_and_the_allocator_setting(monkeypatch) -> None:
    monkeypatch.setenv("JUPYTER_GPU_BACKEND", "simulated:h200")  # NVML's processes: a simulated GPU is not ours
    fake_torch = types.SimpleNamespace(Tensor=torch.Tensor, cuda=one_gpu_with_a_cache())
    walk = NotebookWalk(torch)
    [gpu, *rest] = device_totals(fake_torch, walk, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert (gpu.device, gpu.total_bytes, gpu.reserved_bytes, gpu.inactive_split_bytes) == (
        "cuda:0", 600 * MIB, 2 * GIB, 300 * MIB)
    assert gpu.expandable_segments and gpu.process_bytes is None
    assert all(totals.device == "cpu" for totals in rest)


@pytest.mark.parametrize("env", [{"PYTORCH_ALLOC_CONF": "expandable_segments:True"},
                                 {"PYTORCH_ALLOC_CONF": "max_split_size_mb:128, expandable_segments : true"},
                                 {"PYTORCH_ALLOC_CONF": "expandable_segments:False",
                                  "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}])
def test_a_torch_without_a_settings_getter_reads_both_variables(env) -> None:
    # torch 2.11 (the H200 machine's) documents PYTORCH_ALLOC_CONF, keeps the old name, and has no getter.
    assert expandable_segments_on(types.SimpleNamespace(_C=types.SimpleNamespace()), env)
    assert not expandable_segments_on(types.SimpleNamespace(_C=types.SimpleNamespace()), {})


def test_expandable_segments_turned_on_at_run_time_is_never_advised_again(monkeypatch) -> None:
    # This machine's real torch 2.13: the allocator's own settings, changed after start, outrank the variables.
    monkeypatch.setenv("JUPYTER_GPU_BACKEND", "simulated:h200")
    torch._C._accelerator_setAllocatorSettings("expandable_segments:True")
    try:
        assert expandable_segments_on(torch, {})
        cuda = one_gpu_with_a_cache()
        cuda.allocators[0].inactive_split = GIB  # most of the cache is split blocks: fragmentation
        fake_torch = types.SimpleNamespace(Tensor=torch.Tensor, cuda=cuda, _C=torch._C)
        [gpu, *_] = device_totals(fake_torch, NotebookWalk(torch), env={})
        assert gpu.expandable_segments
        [split] = [r for r in remainders(gpu) if r.label == FRAGMENTATION]
        assert "already on" in split.advice and "start the kernel with" not in split.advice
    finally:
        torch._C._accelerator_setAllocatorSettings("expandable_segments:False")
    assert not expandable_segments_on(torch, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})


def test_nvml_memory_of_a_mig_slice_is_found_by_the_slices_uuid() -> None:
    slice_uuid = nvml_uuid(5, "MIG")
    cuda = FakeCuda([FakeGpu("NVIDIA A100-SXM4-80GB MIG 3g.40gb", slice_uuid, (8, 0), 40 * GIB)])
    cuda.allocate(GIB)
    parent = DeviceSample(0, "NVIDIA A100-SXM4-80GB", nvml_uuid(0), mig_enabled=True,
                          mig_instances=(MigInstance(0, nvml_uuid(4, "MIG"), "3g.40gb", gpu_instance_id=1),
                                         MigInstance(1, slice_uuid, "3g.40gb", gpu_instance_id=2)),
                          processes=(GpuProcess(4242, 900 * MIB, gpu_instance_id=1),
                                     GpuProcess(4242, 1500 * MIB, gpu_instance_id=2), GpuProcess(7, GIB)))
    sample = Sample(1.0, "nvml", False, status="ok", devices=(parent,))
    assert process_bytes(types.SimpleNamespace(cuda=cuda), [0], sample, 4242) == {0: 1500 * MIB}
    whole = FakeCuda([FakeGpu(uuid=nvml_uuid(0))])
    whole.allocate(GIB)
    plain = Sample(1.0, "nvml", False, status="ok",
                   devices=(DeviceSample(0, "H200", nvml_uuid(0), processes=(GpuProcess(4242, 2 * GIB),)),))
    assert process_bytes(types.SimpleNamespace(cuda=whole), [0], plain, 4242) == {0: 2 * GIB}
