"""Could PyTorch in this kernel use a GPU right now? Answered without initialising CUDA."""

from __future__ import annotations

from typing import Any

from jupyter_gpu.gputime.advice import GpuAvailability
from jupyter_gpu.kernel_torch import cuda_initialized
from jupyter_gpu.metrics.sample import Sample


def gpu_availability(torch: Any | None, sample: Sample | None) -> GpuAvailability:
    """From what is already known: the simulated backend, CUDA the kernel initialised, NVML, MPS.

    NVML sees GPUs without creating a CUDA context; a CUDA or ROCm build of torch (`torch.version`)
    plus an NVML device means the kernel can use it. `torch.cuda.is_available()` is not called: it may
    initialise the driver in this process.
    """
    names = [d.label for d in sample.devices if d.status == "ok"] if sample is not None else []
    if sample is not None and sample.simulated:
        return GpuAvailability(usable=bool(names), devices=names, simulated=True,
                               reason=None if names else sample.message)
    if torch is None:
        return GpuAvailability(usable=False, reason="torch is not imported in this kernel")
    if cuda_initialized(torch):
        count = int(torch.cuda.device_count())
        return GpuAvailability(usable=count > 0, devices=[torch.cuda.get_device_name(i) for i in range(count)])
    version = getattr(torch, "version", None)
    gpu_build = bool(getattr(version, "cuda", None) or getattr(version, "hip", None))
    if sample is not None and sample.status == "ok" and gpu_build and names:
        return GpuAvailability(usable=True, devices=names)
    mps = getattr(getattr(torch, "backends", None), "mps", None)
    if mps is not None and mps.is_available():
        return GpuAvailability(usable=True, devices=["Apple MPS"])
    if sample is not None and sample.status == "ok" and sample.devices and not gpu_build:
        return GpuAvailability(usable=False, reason="this torch is a CPU-only build (see %gpucheck)")
    return GpuAvailability(usable=False, reason=sample.message if sample is not None else None)
