"""The one seam to the torch already loaded in this kernel: is it loaded, is CUDA initialised, the allocator's
figures (joined to NVML devices by UUID), and the dispatch mode that sees every operator.

Probe layer: reads `torch` only if the kernel already imported it (it never imports torch on its own), and
CUDA only if the kernel already initialised it (a monitor that creates a CUDA context breaks forked DataLoader
workers with "Cannot re-initialize CUDA in forked subprocess").
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from jupyter_gpu.metrics.sample import Sample


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


def nvml_uuid(torch: Any, index: int) -> str | None:
    """The NVML UUID (`GPU-...`) of CUDA device `index`; CUDA must already be initialised."""
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    return None if uuid is None else f"GPU-{uuid}"


def torch_memory_by_uuid(torch: Any | None = None) -> dict[str, tuple[int, int]]:
    """{NVML uuid: (allocated, reserved)} for every CUDA device this kernel uses; {} before CUDA starts."""
    torch = loaded_torch() if torch is None else torch
    if not cuda_initialized(torch):
        return {}
    figures: dict[str, tuple[int, int]] = {}
    for index in range(torch.cuda.device_count()):
        uuid = nvml_uuid(torch, index)
        reserved = int(torch.cuda.memory_reserved(index))
        if uuid is None or not reserved:
            continue  # a device this kernel never allocated on: nothing of ours to show there
        figures[uuid] = (int(torch.cuda.memory_allocated(index)), reserved)
    return figures


def with_torch_memory(sample: Sample, torch: Any | None = None) -> Sample:
    """The sample with `torch_allocated`/`torch_reserved` filled in on the devices this kernel uses.

    A MIG slice's figures go to its parent GPU (the panel shows GPUs, and the slice is listed under it).
    """
    figures = torch_memory_by_uuid(torch)
    if not figures or sample.status != "ok":
        return sample
    devices = []
    for device in sample.devices:
        uuids = [device.uuid, *(m.uuid for m in device.mig_instances)]
        # torch may report a MIG slice's UUID with either prefix.
        keys = {u for u in uuids if u} | {f"GPU-{u[4:]}" for u in uuids if u and u.startswith("MIG-")}
        mine = [figures[k] for k in keys if k in figures]
        if mine:
            device = replace(device, torch_allocated=sum(a for a, _ in mine), torch_reserved=sum(r for _, r in mine))
        devices.append(device)
    return replace(sample, devices=tuple(devices))


# handler(func, args, kwargs) runs the operator (func(*args, **kwargs)) and returns its result.
Handler = Callable[[Any, tuple, dict], Any]


def handler_mode(handler: Handler) -> Any:
    """A fresh dispatch mode (a context manager) that calls `handler` for every operator below autograd.

    It declares `ignore_compile_internals`: without it, Dynamo skips, for good, a function first called
    under the mode, so `torch.compile` would silently stop compiling the user's code.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    class HandlerMode(TorchDispatchMode):
        @classmethod
        def ignore_compile_internals(cls) -> bool:
            return True

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            return handler(func, args, kwargs or {})

    return HandlerMode()
