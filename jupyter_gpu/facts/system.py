"""Host facts read from files under the context root: driver, device nodes, PCI, container, WSL, shm.

Most of these are Linux files (/proc, /sys, /dev). On a machine the context says is Windows they are not
read at all (a C:\\proc folder means nothing there): the snapshot keeps its shape with empty values, and
the Windows driver is found by its DLLs instead.
"""

from __future__ import annotations

import os
import platform
import re
from typing import Any

from jupyter_gpu.facts.context import ProbeContext
from jupyter_gpu.facts.health import kernel_log_facts, pcie_link_facts

DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
KERNEL_MODULE_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")
GPU_PCI_CLASSES = ("0x0300", "0x0302", "0x0380")  # VGA, 3D controller, other display controller
VENDORS = {"0x10de": "nvidia", "0x1002": "amd", "0x8086": "intel"}
# Where distributions put the user-space driver libraries; WSL maps the Windows driver's copies.
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                "/usr/local/nvidia/lib64", "/usr/lib/wsl/lib", "/usr/lib/aarch64-linux-gnu/tegra")
# The NVIDIA Windows driver installs these into System32; their presence is the driver's, not a toolkit's.
WINDOWS_DRIVER_LIBRARIES = ("nvcuda.dll", "nvml.dll")
DEVICE_NODE = re.compile(r"^nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset|-nvswitchctl|-nvswitch\d+)$")
# A Jetson's integrated GPU: no PCI device and (before JetPack 6) no NVML; L4T's release file and nvhost nodes.
TEGRA_RELEASE_FILE = "/etc/nv_tegra_release"
TEGRA_RELEASE = re.compile(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)")


def driver_facts(ctx: ProbeContext) -> dict[str, Any]:
    if ctx.windows:
        return windows_driver_facts(ctx)
    text = ctx.read_text(DRIVER_VERSION_FILE)
    match = KERNEL_MODULE_VERSION.search(text or "")
    return {
        "proc_version_text": text.strip() if text else None,
        "kernel_module_version": match.group(1) if match else None,
        "sys_module_nvidia": ctx.exists("/sys/module/nvidia"),
        "sys_module_nvidia_uvm": ctx.exists("/sys/module/nvidia_uvm"),
        "libraries": {name: library_facts(ctx, name) for name in ("libcuda.so.1", "libnvidia-ml.so.1")},
    }


def windows_driver_facts(ctx: ProbeContext) -> dict[str, Any]:
    system32 = ctx.flavour.join(ctx.env.get("SystemRoot") or ctx.env.get("SYSTEMROOT") or "C:\\Windows", "System32")
    found: dict[str, list[dict[str, str | None]]] = {}
    for name in WINDOWS_DRIVER_LIBRARIES:
        path = ctx.flavour.join(system32, name)
        found[name] = [{"path": path, "resolved": path}] if ctx.exists(path) else []
    return {"proc_version_text": None, "kernel_module_version": None, "sys_module_nvidia": False,
            "sys_module_nvidia_uvm": False, "libraries": found}


def library_facts(ctx: ProbeContext, name: str) -> list[dict[str, str | None]]:
    """Every copy of a driver library in the usual directories, with the file it really is."""
    found = []
    for directory in LIBRARY_DIRS:
        path = f"{directory}/{name}"
        if ctx.exists(path):
            found.append({"path": path, "resolved": ctx.resolve(path)})
    return found


def device_node_facts(ctx: ProbeContext) -> list[dict[str, Any]]:
    if ctx.windows:
        return []  # Windows has no device files: the driver is reached through its DLLs
    nodes = []
    for name in ctx.listdir("/dev"):
        if DEVICE_NODE.match(name) or name in ("dxg", "kfd") or name.startswith("nvhost-"):
            path = f"/dev/{name}"
            nodes.append({"path": path, "read_write": ctx.can_read_write(path)})
    for name in ctx.listdir("/dev/dri"):
        if name.startswith("renderD"):
            path = f"/dev/dri/{name}"
            nodes.append({"path": path, "read_write": ctx.can_read_write(path)})
    return nodes


def pci_gpu_facts(ctx: ProbeContext) -> list[dict[str, str]]:
    if ctx.windows:
        return []  # no /sys on Windows; NVML lists the GPUs there
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
    env = ctx.env
    if ctx.windows:
        return windows_hosting_facts(ctx)
    cgroup = ctx.read_text("/proc/1/cgroup") or ""
    osrelease = (ctx.read_text("/proc/sys/kernel/osrelease") or "").strip()
    root = root_mount(ctx)
    dockerenv = ctx.exists("/.dockerenv")
    # /.dockerenv alone is not a container: a VM or machine image made from a Docker image keeps the file, and
    # there the machine booted from its own disk (a Firecracker microVM: ext4 on /dev/vda, seen here).
    booted_from_disk = root is not None and _booted_from_disk(root)
    return {
        "docker": dockerenv and not booted_from_disk,
        "dockerenv_on_booted_disk": dockerenv and booted_from_disk,
        "root_filesystem": f"{root['type']} {root['source']}" if root else None,
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


def root_mount(ctx: ProbeContext) -> dict[str, str] | None:
    """What `/` is mounted from, by /proc/self/mountinfo: the filesystem's own folder mounted there (`root`, "/"
    for a whole filesystem), its type and its source (overlay for Docker's overlay2, /dev/vda for a VM's disk)."""
    found = None
    for line in (ctx.read_text("/proc/self/mountinfo", limit=1 << 20) or "").splitlines():
        mount, separator, filesystem = line.partition(" - ")
        fields, described = mount.split(), filesystem.split()
        if separator and len(fields) >= 5 and len(described) >= 2 and fields[4] == "/":
            found = {"root": fields[3], "type": described[0], "source": described[1]}  # the last mount on / wins
    return found


# Filesystems a machine boots from a disk with; a container's root is an overlay (overlay2, fuse-overlayfs), a
# subvolume (btrfs, zfs) or a folder bind-mounted from its host's disk (vfs).
_DISK_FILESYSTEMS = ("ext2", "ext3", "ext4", "xfs")


def _booted_from_disk(root: dict[str, str]) -> bool:
    """A whole disk filesystem mounted on /: a machine of its own, not a container (Docker's devicemapper driver
    names its devices docker-*)."""
    return (root["root"] == "/" and root["type"] in _DISK_FILESYSTEMS and root["source"].startswith("/dev/")
            and "docker" not in root["source"])


def windows_hosting_facts(ctx: ProbeContext) -> dict[str, Any]:
    """The same questions from the environment alone: Windows kernels are not containerised the Linux way."""
    env = ctx.env
    return {
        "docker": False, "dockerenv_on_booted_disk": False, "root_filesystem": None, "podman": False,
        "cgroup_container": False,
        "kubernetes": "KUBERNETES_SERVICE_HOST" in env,
        "wsl": False,  # WSL is a Linux kernel: a Windows-side Python is never inside it
        "kernel_release": None,
        "colab": "COLAB_RELEASE_TAG" in env,
        "kaggle": "KAGGLE_KERNEL_RUN_TYPE" in env,
        "slurm_job": env.get("SLURM_JOB_ID"),
        "slurm_cluster": False,
        "hostname": env.get("COMPUTERNAME") or None,
    }


def shm_bytes(ctx: ProbeContext) -> int | None:
    """Size of /dev/shm, where DataLoader workers pass batches; Windows has none (workers use pipes there)."""
    statvfs = getattr(os, "statvfs", None)  # absent from Windows' os module, whatever the context says
    if ctx.windows or statvfs is None:
        return None
    try:
        stats = statvfs(ctx.path("/dev/shm"))
    except OSError:
        return None
    return stats.f_frsize * stats.f_blocks


def platform_facts(ctx: ProbeContext) -> dict[str, Any]:
    # machine and release describe the host this code runs on: kept only when the context checks that host.
    same_host = ctx.system == platform.system()
    return {
        "system": ctx.system,
        "machine": platform.machine() if same_host else None,
        "release": platform.release() if same_host else None,
        "cpu_count": os.cpu_count(),
    }


def jetson_facts(ctx: ProbeContext) -> dict[str, Any] | None:
    """L4T's release ("# R35 (release), REVISION: 4.1, ...": L4T 35.4.1) on a Jetson; None elsewhere."""
    if ctx.windows:
        return None
    text = ctx.read_text(TEGRA_RELEASE_FILE)
    if text is None:
        return None
    match = TEGRA_RELEASE.search(text)
    return {"release_text": text.strip().splitlines()[0] if text.strip() else "",
            "l4t": f"{match.group(1)}.{match.group(2)}" if match else None}


def gather_system(ctx: ProbeContext) -> dict[str, Any]:
    driver, pci_gpus = driver_facts(ctx), pci_gpu_facts(ctx)
    return {
        "platform": platform_facts(ctx),
        "driver": driver,
        "device_nodes": device_node_facts(ctx),
        "pci_gpus": pci_gpus,
        # Kept apart from pci_gpus: a link's speed changes with load, and pci_gpus keys the torch-probe cache.
        "pcie_links": pcie_link_facts(ctx, pci_gpus),
        "kernel_log": kernel_log_facts(ctx, pci_gpus, driver.get("proc_version_text")),
        "hosting": hosting_facts(ctx),
        "jetson": jetson_facts(ctx),
        "shm_bytes": shm_bytes(ctx),
    }
