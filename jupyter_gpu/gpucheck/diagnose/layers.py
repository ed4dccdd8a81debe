"""The machine's layers, from the hardware up, each with the command that tells more about it (issue 49).

A finding about the machine belongs to one layer. Where the fix gate withholds every fix a finding had (each one's
precondition contradicted by the evidence), the finding keeps its headline and evidence and gains its layer's
command: the question the machine can answer next, never the nearest fix. Pure: no imports from facts or torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layer:
    key: str
    name: str
    tell_more: str  # a command that shows this layer's state, runnable where the user is


HEALTH = Layer("health", "the hardware's health",
               "sudo dmesg | grep -i -e xid -e nvrm; nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER")
PCI = Layer("pci", "the PCI device and the driver it is bound to", "lspci -nnk -d 10de:")
MODULE = Layer("module", "the kernel module", "cat /proc/driver/nvidia/version; lsmod | grep -e nvidia -e nouveau")
ACCESS = Layer("access", "the device nodes and who may open them (cgroup, container, job, pod)",
               "ls -l /dev/nvidia*; cat /proc/self/cgroup; env | grep -i -e visible -e slurm -e pbs -e lsb -e sge "
               "-e condor -e kubernetes -e jupyterhub")
NVML = Layer("nvml", "NVML, the driver's management library", "nvidia-smi -q")
CUDA_DRIVER = Layer("cuda_driver", "the CUDA driver (libcuda, cuInit)",
                    "python -c \"import ctypes; print(ctypes.CDLL('libcuda.so.1').cuInit(0))\"   # 0 is success")
TORCH_BUILD = Layer("torch_build", "the torch build and who installed it", "python -m torch.utils.collect_env")
LIBRARIES = Layer("libraries", "the shared libraries torch loads",
                  "LD_DEBUG=libs python -c 'import torch' 2>&1 | grep -i -e 'not found' -e error | head")

# Hardware outranks software: the order a reader walks them in. A torch that cannot load its libraries is broken
# before its build is read: the import fails first.
LAYERS = (HEALTH, PCI, MODULE, ACCESS, NVML, CUDA_DRIVER, LIBRARIES, TORCH_BUILD)

# Findings that say the check could not look (the kernel's interpreter did not run, the torch probe hung): every
# layer's answer is unknown behind them, so they come first.
BLIND = frozenset({"KERNEL_PROBE_FAILED", "TORCH_PROBE_TIMEOUT"})

# Every machine-level finding code's layer. Notebook and usage findings (the user's code) have none: their fixes
# are edits to the notebook, which no machine fact contradicts.
CODE_LAYER: dict[str, Layer] = {
    **dict.fromkeys(("GPU_LOST_OR_XID", "GPU_FAULT", "GPU_ECC_ERROR", "GPU_XID", "PCIE_LINK_DEGRADED",
                     "PCIE_LINK_DOWN"), HEALTH),
    **dict.fromkeys(("NO_NVIDIA_GPU", "GPU_BOUND_TO_OTHER_DRIVER", "DOCKER_DESKTOP_NO_GPU", "MAC_USE_MPS",
                     "MAC_ROSETTA_PYTHON", "MAC_OS_TOO_OLD", "XPU_AVAILABLE", "NOTEBOOK_PLATFORM_NO_ACCELERATOR",
                     "HPC_LOGIN_NODE"), PCI),
    **dict.fromkeys(("DRIVER_NOT_LOADED", "NVIDIA_UVM_MISSING", "FABRIC_MANAGER_NOT_RUNNING", "ROCM_UNSUPPORTED_GFX",
                     "WSL_NO_WINDOWS_DRIVER_CUDA", "WSL_LINUX_DRIVER_INSTALLED", "WSL_WINDOWS_DRIVER_OLD",
                     "WSL1_NO_GPU", "WSL_WITHOUT_GPU_SUPPORT"), MODULE),
    **dict.fromkeys(("DRIVER_UNREACHABLE", "CONTAINER_NO_GPU", "SLURM_JOB_WITHOUT_GPU", "JOB_WITHOUT_GPU",
                     "KUBERNETES_POD_WITHOUT_GPU", "KUBERNETES_GPU_NOT_INJECTED", "JUPYTERHUB_SERVER_WITHOUT_GPU",
                     "DEVICE_PERMISSION_DENIED", "ROCM_PERMISSION", "CUDA_VISIBLE_DEVICES_HIDES_GPUS",
                     "CUDA_VISIBLE_DEVICES_CHANGED_AFTER_INIT", "MIG_NO_INSTANCES", "MIG_MULTI_DEVICE",
                     "GPU_EXCLUSIVE_BUSY", "GPU_MEMORY_HELD_BY_OTHER_PROCESS"), ACCESS),
    **dict.fromkeys(("NVML_UNKNOWN_ERROR", "DRIVER_LIBRARY_MISMATCH"), NVML),
    **dict.fromkeys(("FORWARD_COMPAT_UNSUPPORTED", "DRIVER_TOO_OLD_FOR_WHEEL", "CUDA_MINOR_VERSION_COMPAT",
                     "CUDA_NOT_AVAILABLE", "CUDA_INIT_ERROR", "CUDA_DRIVER_STUB", "FORWARD_COMPAT_MISMATCH",
                     "CUDA_DRIVER_INIT_FAILED"), CUDA_DRIVER),
    **dict.fromkeys(("TORCH_NOT_INSTALLED", "KERNEL_ENV_MISMATCH", "SHADOWED_TORCH_INSTALL",
                     "STALE_TORCH_IMPORT", "CPU_ONLY_BUILD", "JETSON_NEEDS_JETPACK_TORCH", "JETSON_TORCH_BUILD_UNKNOWN",
                     "GPU_ARCH_TOO_OLD_FOR_WHEEL", "GPU_ARCH_TOO_NEW_FOR_WHEEL", "PTX_TOOLCHAIN_TOO_NEW",
                     "TORCHVISION_MISMATCH"), TORCH_BUILD),
    **dict.fromkeys(("TORCH_IMPORT_BROKEN", "NVIDIA_WHEEL_MISMATCH", "LD_LIBRARY_PATH_SHADOWING",
                     "CUDNN_UNAVAILABLE"), LIBRARIES),
}


def layer_of(code: str) -> Layer | None:
    """The layer of a finding code; None for the notebook's own findings and codes no layer claims."""
    return CODE_LAYER.get(code)
