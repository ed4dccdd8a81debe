"""This kernel's PyTorch allocator figures, joined to NVML devices by UUID, without ever starting CUDA.

Probe layer: reads `torch` only if the kernel already imported it, and CUDA only if the kernel already
initialised it (a monitor that creates a CUDA context breaks forked DataLoader workers).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

from jupyter_gpu.gputime.clock import cuda_initialized
from jupyter_gpu.metrics.sample import Sample


def loaded_torch() -> Any | None:
    """torch if this process has imported it; never imports it."""
    return sys.modules.get("torch")


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
