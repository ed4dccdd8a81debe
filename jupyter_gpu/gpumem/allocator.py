"""What the allocator says each device holds, to reconcile with what the walk named: CUDA's counters, NVML's figure
for this process, and on the CPU the storages Python can see.

Probe ring. CUDA is read only when this kernel already initialised it (`torch.cuda.is_initialized()`): a kernel
that never touched CUDA has no CUDA memory to explain, and initialising it would cost a context and break forked
DataLoader workers. NVML is read through the metrics backend, so `JUPYTER_GPU_BACKEND` is honoured.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from jupyter_gpu.gpumem.result import DeviceLevel, DeviceTotals
from jupyter_gpu.gpumem.walk import NotebookWalk
from jupyter_gpu.kernel_torch import cuda_initialized, find_device, torch_uuid
from jupyter_gpu.metrics.sample import Sample
from jupyter_gpu.probekit.storages import live_storages

ALLOCATED = "allocated (torch.cuda.memory_allocated)"
LIVE_CPU = "in live CPU storages Python can see"


def cuda_indices(torch: Any) -> list[int]:
    """The CUDA devices this kernel has memory on; [] when CUDA was never initialised here."""
    if not cuda_initialized(torch):
        return []
    return [index for index in range(torch.cuda.device_count()) if torch.cuda.memory_reserved(index)]


def device_totals(torch: Any, walk: NotebookWalk, env: Mapping[str, str] | None = None) -> list[DeviceTotals]:
    """Every device with memory to explain, CUDA first, each with the walk's named bytes and the allocator's view."""
    named: dict[str, int] = {}
    for record in walk.storages.values():
        named[record.device] = named.get(record.device, 0) + record.bytes
    unreached = unreached_bytes(torch, walk)
    expandable = expandable_segments_on(torch, os.environ if env is None else env)
    totals: list[DeviceTotals] = []
    processes = _process_memory(torch)
    for index in cuda_indices(torch):
        device = f"cuda:{index}"
        stats = torch.cuda.memory_stats(index)
        totals.append(DeviceTotals(
            device=device, named_bytes=named.get(device, 0), total_bytes=int(torch.cuda.memory_allocated(index)),
            total_source=ALLOCATED, reserved_bytes=int(torch.cuda.memory_reserved(index)),
            inactive_split_bytes=int(stats.get("inactive_split_bytes.all.current", 0)),
            process_bytes=processes.get(index), expandable_segments=expandable,
            unreached_bytes=unreached.get(device, 0)))
    cpu_named, cpu_unreached = named.get("cpu", 0), unreached.get("cpu", 0)
    if cpu_named or cpu_unreached:
        totals.append(DeviceTotals(device="cpu", named_bytes=cpu_named, total_bytes=cpu_named + cpu_unreached,
                                   total_source=LIVE_CPU, unreached_bytes=cpu_unreached))
    return totals


def expandable_segments_on(torch: Any, env: Mapping[str, str]) -> bool:
    """Whether the caching allocator uses expandable segments: what the allocator reports where this torch can
    say (2.13's settings getter also sees a change made at run time), else the variables as torch reads them."""
    getter = getattr(getattr(torch, "_C", None), "_accelerator_getAllocatorSettings", None)
    if callable(getter):
        return _allocator_option(getter(), "expandable_segments") == "true"
    value = None
    # PYTORCH_ALLOC_CONF is the documented name; the old PYTORCH_CUDA_ALLOC_CONF is still read, after it.
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        found = _allocator_option(env.get(name, ""), "expandable_segments")
        value = found if found is not None else value
    return value == "true"


def _allocator_option(settings: str, key: str) -> str | None:
    """One option of an allocator settings string ("expandable_segments:True,max_split_size_mb:128"), lower-case."""
    found = None
    for part in settings.split(","):
        name, sep, value = part.partition(":")
        if sep and name.strip().lower() == key:
            found = value.strip().lower()
    return found


def unreached_bytes(torch: Any, walk: NotebookWalk) -> dict[str, int]:
    """Per device, the bytes of storages the garbage collector sees as tensors that no notebook path reached."""
    found: dict[str, int] = {}
    for storage in live_storages(torch):  # one pass over the collector's objects for every device
        device = str(storage.device)
        if (device, storage.data_ptr()) not in walk.storages:
            found[device] = found.get(device, 0) + storage.nbytes()
    return found


def levels(torch: Any, walk: NotebookWalk, indices: list[int] | None = None) -> list[DeviceLevel]:
    """Each device's memory now: CUDA's allocated and reserved (on `indices`, by default every device this kernel
    has memory on); on the CPU, the named and the unreached storages."""
    indices = cuda_indices(torch) if indices is None else indices
    found = [DeviceLevel(f"cuda:{index}", int(torch.cuda.memory_allocated(index)),
                         int(torch.cuda.memory_reserved(index))) for index in indices]
    cpu = sum(record.bytes for record in walk.storages.values() if record.device == "cpu")
    cpu += unreached_bytes(torch, walk).get("cpu", 0)
    found.append(DeviceLevel("cpu", cpu))
    return found


def _process_memory(torch: Any) -> dict[int, int]:
    """{CUDA index: bytes NVML says this process uses there}; {} when NVML cannot say (no NVML, a container's PIDs)."""
    indices = cuda_indices(torch)
    if not indices:
        return {}
    from jupyter_gpu.metrics.backends.select import select_backend

    try:
        backend = select_backend()
    except ValueError:
        return {}
    try:
        sample = backend.read()
    finally:
        backend.close()
    if sample.simulated:
        return {}  # a simulated GPU's processes are not this kernel
    return process_bytes(torch, indices, sample, os.getpid())


def process_bytes(torch: Any, indices: list[int], sample: Sample, pid: int) -> dict[int, int]:
    """{CUDA index: bytes NVML lists for process `pid` there}, matched by UUID: a whole GPU's, or a MIG slice's."""
    figures: dict[int, int] = {}
    for index in indices:
        found = find_device(sample, torch_uuid(torch, index))
        if found is None:
            continue
        device, mig = found
        # A MIG slice's processes are listed on its parent GPU, each with the GPU instance it runs in.
        for process in device.processes or ():
            if process.pid != pid or process.memory_used is None:
                continue
            if mig is None or None in (process.gpu_instance_id, mig.gpu_instance_id) \
                    or process.gpu_instance_id == mig.gpu_instance_id:
                figures[index] = figures.get(index, 0) + process.memory_used
    return figures
