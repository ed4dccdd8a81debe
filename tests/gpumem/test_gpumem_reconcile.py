"""What the names leave unexplained on a device, labelled with its holder and the advice that fits: the pure
reconciliation on CUDA figures, and the allocator probe reading them from a stand-in for torch.cuda (this machine
has no GPU)."""

from __future__ import annotations

import types

import torch

from jupyter_gpu.gpumem.allocator import ALLOCATED, device_totals
from jupyter_gpu.gpumem.reconcile import CACHE, CONTEXT, FRAGMENTATION, UNREACHABLE_CUDA, UNREACHED, remainders
from jupyter_gpu.gpumem.result import DeviceTotals
from jupyter_gpu.gpumem.walk import NotebookWalk

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


class FakeCuda:
    """torch.cuda on a machine with one GPU that this kernel initialised: the allocator's counters."""

    def __init__(self, allocated: int, reserved: int, inactive_split: int) -> None:
        self.figures = (allocated, reserved, inactive_split)

    def is_initialized(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def memory_allocated(self, index: int = 0) -> int:
        return self.figures[0]

    def memory_reserved(self, index: int = 0) -> int:
        return self.figures[1]

    def memory_stats(self, index: int = 0) -> dict[str, int]:
        return {"inactive_split_bytes.all.current": self.figures[2]}

    def get_device_properties(self, index: int) -> object:
        return types.SimpleNamespace(uuid="00000000-0000-0000-0000-000000000000")


def test_the_allocator_probe_reads_each_used_device_and_the_allocator_setting(monkeypatch) -> None:
    monkeypatch.setenv("JUPYTER_GPU_BACKEND", "simulated:h200")  # NVML's processes: a simulated GPU is not ours
    fake_torch = types.SimpleNamespace(Tensor=torch.Tensor, cuda=FakeCuda(600 * MIB, 2 * GIB, 300 * MIB))
    walk = NotebookWalk(torch)
    [gpu, *rest] = device_totals(fake_torch, walk, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert (gpu.device, gpu.total_bytes, gpu.reserved_bytes, gpu.inactive_split_bytes) == (
        "cuda:0", 600 * MIB, 2 * GIB, 300 * MIB)
    assert gpu.expandable_segments and gpu.process_bytes is None
    assert all(totals.device == "cpu" for totals in rest)
