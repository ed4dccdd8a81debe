"""The whole stack at a glance: what a bug report needs, read from the facts snapshot (healthy or not).

torch and its build, cuDNN and NCCL when built in, torchvision and torchaudio, Python and the OS, the driver and
the CUDA version it supports, and each GPU. Values nobody could read are None, never a guess.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from jupyter_gpu.gpucheck.diagnose.view import FactsView
from jupyter_gpu.gpucheck.diagnose.wheels import COMPANIONS, cuda_int_to_str


@dataclass(frozen=True)
class GpuLine:
    index: int
    name: str | None
    memory_total: int | None = None
    memory_free: int | None = None
    capability: str | None = None  # "9.0"
    mig_enabled: bool | None = None  # None: no MIG on this GPU, or NVML could not say
    mig_instances: int | None = None
    uuid: str | None = None


@dataclass(frozen=True)
class LastCell:
    """How busy the kernel's GPUs were during the last long cell (from the shared sampler's readings)."""

    execution_count: int | None
    seconds: float
    utilization_percent: float
    samples: int
    devices: list[str]
    held_gpu: bool  # this kernel had a CUDA context (or NVML listed its process) during the cell
    simulated: bool = False  # the readings came from a simulated backend


@dataclass(frozen=True)
class Stack:
    torch: str | None  # the version, "2.13.0+cpu"
    build: str | None  # "CUDA 12.8", "ROCm 6.4", "CPU", "MPS"
    cudnn: str | None
    nccl: str | None
    companions: dict[str, str] = field(default_factory=dict)
    python: str | None = None
    platform: str | None = None
    driver: str | None = None
    driver_cuda: str | None = None
    gpus: list[GpuLine] = field(default_factory=list)
    last_cell: LastCell | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cudnn_text(version: int | None) -> str | None:
    """torch.backends.cudnn.version(): 91002 -> "9.10.2" (cuDNN 9 counts minors in hundreds), 8902 -> "8.9.2"."""
    if not version:
        return None
    major, rest = (version // 10000, version % 10000) if version >= 90000 else (version // 1000, version % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def _build(view: FactsView) -> str | None:
    if not view.torch_installed or not view.build_known:
        return None
    if view.torch_cuda:
        return f"CUDA {view.torch_cuda}"
    if view.torch_hip:
        return "ROCm " + ".".join(view.torch_hip.split(".")[:2])
    if ((view.torch or {}).get("mps") or {}).get("built"):
        return "MPS"
    return "CPU"


def _gpus(view: FactsView) -> list[GpuLine]:
    if view.nvml_ok and view.nvml_devices:
        lines = []
        for device in view.nvml_devices:
            free = device.memory_free  # snapshots from before NVML's free memory was read: total less used
            if free is None and device.memory_total is not None and device.memory_used is not None:
                free = device.memory_total - device.memory_used
            lines.append(GpuLine(
                index=device.index, name=device.name, memory_total=device.memory_total, memory_free=free,
                capability=f"{device.capability[0]}.{device.capability[1]}" if device.capability else None,
                mig_enabled=device.mig_enabled,
                mig_instances=len(device.mig_instances) if device.mig_instances is not None else None,
                uuid=device.uuid))
        return lines
    # No NVML (ROCm, WSL without it, nvidia-ml-py missing): what torch itself listed in the probe.
    return [GpuLine(index=int(d.get("index", i)), name=d.get("name"), memory_total=d.get("memory_total"),
                    capability=".".join(str(c) for c in d["capability"]) if d.get("capability") else None,
                    uuid=d.get("uuid"))
            for i, d in enumerate(view.torch_devices)]


def _platform(view: FactsView) -> str | None:
    parts = [view.platform.get("system"), view.platform.get("machine")]
    return " ".join(p for p in parts if p) or None


def build_stack(view: FactsView, last_cell: LastCell | None = None) -> Stack:
    torch = view.torch if view.probe_ran else {}
    companions = {name: version for name in COMPANIONS if (version := view.install.get(name))}
    driver_cuda = view.cuda_driver_version
    return Stack(
        torch=view.torch_version if view.torch_installed else None,
        build=_build(view),
        cudnn=cudnn_text((torch or {}).get("cudnn_version")),
        nccl=(torch or {}).get("nccl_version"),
        companions=companions,
        python=view.python.get("version"),
        platform=_platform(view),
        driver=view.driver_version,
        driver_cuda=cuda_int_to_str(driver_cuda) if driver_cuda else None,
        gpus=_gpus(view),
        last_cell=last_cell,
    )
