"""The one seam to the torch already loaded in this kernel: is it loaded, is CUDA initialised, the allocator's
figures (joined to NVML devices by UUID), and the dispatch mode that sees every operator.

Probe layer: reads `torch` only if the kernel already imported it (it never imports torch on its own), and
CUDA only if the kernel already initialised it (a monitor that creates a CUDA context breaks forked DataLoader
workers with "Cannot re-initialize CUDA in forked subprocess").
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from jupyter_gpu.device_uuid import canonical_uuid
from jupyter_gpu.metrics.sample import DeviceSample, MigInstance, Sample


def loaded_torch() -> Any | None:
    """torch if this process has imported it; never imports it."""
    return sys.modules.get("torch")


def cuda_initialized(torch: Any | None) -> bool:
    """Whether this torch has a CUDA context already; False for no torch or a build without CUDA."""
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except (AttributeError, RuntimeError):
        return False


@dataclass(frozen=True)
class AllocatorCounters:
    """PyTorch's caching-allocator counters for one CUDA device, in bytes."""

    allocated: int
    reserved: int
    peak_allocated: int
    peak_reserved: int


def allocator_counters(torch: Any, index: int) -> AllocatorCounters:
    """The four counters of CUDA device `index` in one read of the allocator's statistics.

    `torch.cuda.memory_allocated()`, `memory_reserved()` and the `max_` ones each build the whole flattened and
    sorted `memory_stats()` (a hundred-odd keys) to return one number; the cell meter made seven such reads per
    cell, and `%gpucells` cost 1.4 ms a cell on the H200 test machine with CUDA initialised. The nested statistics
    come straight from the allocator, unflattened. All zero before CUDA starts (torch returns {} then).
    """
    stats = torch.cuda.memory_stats_as_nested_dict(index)

    def counter(kind: str, which: str) -> int:
        return int(stats.get(kind, {}).get("all", {}).get(which, 0))

    return AllocatorCounters(allocated=counter("allocated_bytes", "current"),
                             reserved=counter("reserved_bytes", "current"),
                             peak_allocated=counter("allocated_bytes", "peak"),
                             peak_reserved=counter("reserved_bytes", "peak"))


def context_devices(torch: Any | None) -> tuple[int, ...]:
    """The CUDA devices this kernel has a context on: the current one and those with memory reserved; () before
    CUDA starts.

    Only these may be synchronised or timed: `torch.cuda.synchronize(i)` switches to device i, which creates a
    context there (hundreds of MiB, and an error on a GPU another process holds in exclusive mode).
    The allocator's counters and `current_device` (which asks the runtime) create none.
    """
    if not cuda_initialized(torch):
        return ()
    found = {int(torch.cuda.current_device())}
    found.update(index for index in range(torch.cuda.device_count()) if allocator_counters(torch, index).reserved)
    return tuple(sorted(found))


def torch_uuid(torch: Any, index: int) -> str | None:
    """CUDA device `index`'s UUID as bare lower-case hex; CUDA must already be initialised.

    torch's `props.uuid` is an object whose `str()` has no prefix; for a MIG slice it is the slice's own UUID,
    which NVML spells `MIG-<hex>`, for a whole GPU NVML's `GPU-<hex>`.
    """
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    return None if uuid is None else canonical_uuid(str(uuid))


def find_device(sample: Sample, uuid: str | None) -> tuple[DeviceSample, MigInstance | None] | None:
    """The NVML device, and the MIG slice of it, that a torch UUID (any spelling) names; None when none does."""
    wanted = canonical_uuid(uuid)
    if wanted is None:
        return None
    for device in sample.devices:
        if canonical_uuid(device.uuid) == wanted:
            return device, None
        for mig in device.mig_instances:
            if canonical_uuid(mig.uuid) == wanted:
                return device, mig
    return None


def uses_device(device: DeviceSample, uuids: set[str]) -> bool:
    """Whether an NVML device, or one of its MIG slices, is among these bare UUIDs (`torch_uuid`'s spelling)."""
    return any(canonical_uuid(u) in uuids for u in (device.uuid, *(m.uuid for m in device.mig_instances)) if u)


def torch_memory_by_uuid(torch: Any | None = None) -> dict[str, tuple[int, int]]:
    """{bare UUID: (allocated, reserved)} for every CUDA device this kernel uses; {} before CUDA starts."""
    torch = loaded_torch() if torch is None else torch
    if not cuda_initialized(torch):
        return {}
    figures: dict[str, tuple[int, int]] = {}
    for index in range(torch.cuda.device_count()):
        reserved = int(torch.cuda.memory_reserved(index))
        if not reserved:
            continue  # a device this kernel never allocated on: nothing of ours to show there
        uuid = torch_uuid(torch, index)
        if uuid is not None:
            figures[uuid] = (int(torch.cuda.memory_allocated(index)), reserved)
    return figures


def with_torch_memory(sample: Sample, torch: Any | None = None) -> Sample:
    """The sample with `torch_allocated`/`torch_reserved` filled in on the devices this kernel uses.

    A MIG slice's figures go to its parent GPU (the panel shows GPUs, and the slice is listed under it).
    """
    figures = torch_memory_by_uuid(torch)
    if not figures or sample.status != "ok":
        return sample
    by_device: dict[int, list[tuple[int, int]]] = {}
    for uuid, figure in figures.items():
        found = find_device(sample, uuid)
        if found is not None:
            by_device.setdefault(found[0].index, []).append(figure)
    devices = []
    for device in sample.devices:
        mine = by_device.get(device.index)
        if mine:
            device = replace(device, torch_allocated=sum(a for a, _ in mine), torch_reserved=sum(r for _, r in mine))
        devices.append(device)
    return replace(sample, devices=tuple(devices))


# handler(func, args, kwargs) runs the operator (func(*args, **kwargs)) and returns its result.
Handler = Callable[[Any, tuple, dict], Any]


def handler_mode(handler: Handler) -> Any:
    """A fresh dispatch mode (a context manager) that calls `handler` for every operator below autograd.

    It declares `ignore_compile_internals`: without it, Dynamo skips, for good, a function first called
    under the mode, so `torch.compile` would silently stop compiling the user's code. Higher-order operators (a
    compiled graph's `run_and_save_rng_state` for a checkpointed block with dropout under inductor's
    fallback_random, `torch.cond`) run whole, without the handler: a mode that does not declare it supports them
    makes torch raise NotImplementedError, and `%speedprobe` had reported a checkpointed model's compile trial as
    "torch.compile failed". Their inner operators are not seen.
    """
    from torch._ops import HigherOrderOperator
    from torch.utils._python_dispatch import TorchDispatchMode

    class HandlerMode(TorchDispatchMode):
        supports_higher_order_operators = True

        @classmethod
        def ignore_compile_internals(cls) -> bool:
            return True

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            if isinstance(func, HigherOrderOperator):
                return func(*args, **(kwargs or {}))  # torch has popped this mode: it runs as without it
            return handler(func, args, kwargs or {})

    return HandlerMode()
