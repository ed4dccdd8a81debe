"""Host facts read from files under the context root: driver, device nodes, PCI, container, WSL, shm."""

from __future__ import annotations

import os
import platform
import re
from typing import Any

from jupyter_gpu.gpucheck.facts.context import ProbeContext

DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
KERNEL_MODULE_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")
GPU_PCI_CLASSES = ("0x0300", "0x0302", "0x0380")  # VGA, 3D controller, other display controller
VENDORS = {"0x10de": "nvidia", "0x1002": "amd", "0x8086": "intel"}
# Where distributions put the user-space driver libraries; WSL maps the Windows driver's copies.
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                "/usr/local/nvidia/lib64", "/usr/lib/wsl/lib")
DEVICE_NODE = re.compile(r"^nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset|-nvswitchctl|-nvswitch\d+)$")


def driver_facts(ctx: ProbeContext) -> dict[str, Any]:
    text = ctx.read_text(DRIVER_VERSION_FILE)
    match = KERNEL_MODULE_VERSION.search(text or "")
    return {
        "proc_version_text": text.strip() if text else None,
        "kernel_module_version": match.group(1) if match else None,
        "sys_module_nvidia": ctx.exists("/sys/module/nvidia"),
        "sys_module_nvidia_uvm": ctx.exists("/sys/module/nvidia_uvm"),
        "libraries": {name: library_facts(ctx, name) for name in ("libcuda.so.1", "libnvidia-ml.so.1")},
    }


def library_facts(ctx: ProbeContext, name: str) -> list[dict[str, str | None]]:
    """Every copy of a driver library in the usual directories, with the file it really is."""
    found = []
    for directory in LIBRARY_DIRS:
        path = f"{directory}/{name}"
        if ctx.exists(path):
            found.append({"path": path, "resolved": ctx.resolve(path)})
    return found


def device_node_facts(ctx: ProbeContext) -> list[dict[str, Any]]:
    nodes = []
    for name in ctx.listdir("/dev"):
        if DEVICE_NODE.match(name) or name in ("dxg", "kfd"):
            path = f"/dev/{name}"
            nodes.append({"path": path, "read_write": ctx.can_read_write(path)})
    for name in ctx.listdir("/dev/dri"):
        if name.startswith("renderD"):
            path = f"/dev/dri/{name}"
            nodes.append({"path": path, "read_write": ctx.can_read_write(path)})
    return nodes


def pci_gpu_facts(ctx: ProbeContext) -> list[dict[str, str]]:
    gpus = []
    for address in ctx.listdir("/sys/bus/pci/devices"):
        base = f"/sys/bus/pci/devices/{address}"
        device_class = (ctx.read_text(f"{base}/class") or "").strip()
        if not device_class.startswith(GPU_PCI_CLASSES):
            continue
        vendor = (ctx.read_text(f"{base}/vendor") or "").strip()
        driver = ctx.resolve(f"{base}/driver")
        gpus.append({
            "address": address,
            "vendor_id": vendor,
            "vendor": VENDORS.get(vendor, "other"),
            "device_id": (ctx.read_text(f"{base}/device") or "").strip(),
            "class": device_class,
            "bound_driver": os.path.basename(driver) if driver else None,
        })
    return gpus


def hosting_facts(ctx: ProbeContext) -> dict[str, Any]:
    cgroup = ctx.read_text("/proc/1/cgroup") or ""
    osrelease = (ctx.read_text("/proc/sys/kernel/osrelease") or "").strip()
    env = ctx.env
    return {
        "docker": ctx.exists("/.dockerenv"),
        "podman": ctx.exists("/run/.containerenv"),
        "cgroup_container": bool(re.search(r"docker|kubepods|containerd|libpod", cgroup)),
        "kubernetes": "KUBERNETES_SERVICE_HOST" in env
        or ctx.exists("/var/run/secrets/kubernetes.io/serviceaccount"),
        "wsl": "microsoft" in osrelease.lower() or "WSL_DISTRO_NAME" in env,
        "kernel_release": osrelease or None,
        "colab": "COLAB_RELEASE_TAG" in env,
        "kaggle": "KAGGLE_KERNEL_RUN_TYPE" in env,
        "slurm_job": env.get("SLURM_JOB_ID"),
        "slurm_cluster": ctx.exists("/etc/slurm/slurm.conf") or ctx.exists("/etc/slurm-llnl/slurm.conf"),
        "hostname": (ctx.read_text("/etc/hostname") or "").strip() or None,
    }


def shm_bytes(ctx: ProbeContext) -> int | None:
    try:
        stats = os.statvfs(ctx.path("/dev/shm"))
    except OSError:
        return None
    return stats.f_frsize * stats.f_blocks


def platform_facts() -> dict[str, Any]:
    return {
        "system": platform.system(),
        "machine": platform.machine(),
        "release": platform.release(),
        "cpu_count": os.cpu_count(),
    }


def gather_system(ctx: ProbeContext) -> dict[str, Any]:
    return {
        "platform": platform_facts(),
        "driver": driver_facts(ctx),
        "device_nodes": device_node_facts(ctx),
        "pci_gpus": pci_gpu_facts(ctx),
        "hosting": hosting_facts(ctx),
        "shm_bytes": shm_bytes(ctx),
    }
