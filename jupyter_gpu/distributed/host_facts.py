"""What the host gives NCCL: /dev/shm, network interfaces, InfiniBand, and the launch and NCCL variables.

Probe layer: every file is read through the probe context (its root and environment), so tests lay out a fake
machine. Nothing here imports torch or NVML.
"""

from __future__ import annotations

import concurrent.futures
import os
import socket
import stat
from collections.abc import Mapping
from typing import Any

from jupyter_gpu.facts.context import ProbeContext

# What torchrun sets in every rank (torch.distributed.run), in the order users read them.
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                      "MASTER_PORT", "TORCHELASTIC_RUN_ID")
# Shown beside the NCCL_* variables: they change what a failing collective says or waits for.
DEBUG_VARIABLES = ("TORCH_DISTRIBUTED_DEBUG", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT",
                   "CUDA_VISIBLE_DEVICES", "PYTORCH_NVML_BASED_CUDA_CHECK")
RESOLVE_TIMEOUT_S = 1.0  # a name lookup on a machine without DNS can hang for tens of seconds


def _mount_size(ctx: ProbeContext, mount_point: str) -> int | None:
    """The tmpfs `size=` option of a mount point (what `df` shows for /dev/shm), from /proc/mounts."""
    mounts = ctx.read_text("/proc/mounts", limit=4 * 1024**2)  # a Kubernetes node can mount hundreds of volumes
    if mounts is None:
        return None
    size = None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1] == mount_point:
            for option in fields[3].split(","):
                if option.startswith("size="):
                    size = _size_option(option[5:])  # the last mount of a point wins, as the kernel shows it
    return size


def _size_option(text: str) -> int | None:
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    try:
        if text[-1:].lower() in units:
            return int(text[:-1]) * units[text[-1].lower()]
        return int(text)
    except ValueError:
        return None


def shared_memory_facts(ctx: ProbeContext) -> dict[str, Any]:
    """/dev/shm: NCCL's shared-memory transport and torch's DataLoader both allocate there."""
    path = ctx.path("/dev/shm")
    facts: dict[str, Any] = {"path": "/dev/shm", "exists": path.is_dir(), "size_bytes": None, "free_bytes": None,
                             "mode": None, "writable": None}
    if not facts["exists"]:
        return facts
    try:
        info = path.stat()
        facts["mode"] = oct(stat.S_IMODE(info.st_mode))
        facts["writable"] = os.access(path, os.W_OK | os.X_OK)
        usage = os.statvfs(path)
        facts["size_bytes"] = usage.f_blocks * usage.f_frsize
        facts["free_bytes"] = usage.f_bavail * usage.f_frsize
    except OSError as exc:
        facts["error"] = f"{type(exc).__name__}: {exc}"
    # The mount table's size= is what `docker run --shm-size` set; statvfs is the fallback (tmpfs without size=).
    declared = _mount_size(ctx, "/dev/shm")
    if declared is not None:
        facts["size_bytes"] = declared
        if facts["free_bytes"] is not None:
            facts["free_bytes"] = min(facts["free_bytes"], declared)
    return facts


def interface_facts(ctx: ProbeContext) -> list[dict[str, Any]]:
    """Network interfaces (NCCL_SOCKET_IFNAME must name one of them) with their state."""
    folder = "/sys/class/net"
    return [{"name": name, "state": _read(ctx, f"{folder}/{name}/operstate")} for name in ctx.listdir(folder)]


def infiniband_facts(ctx: ProbeContext) -> list[dict[str, Any]]:
    """InfiniBand/RoCE adapters and their ports' state, as `ibstat` shows them (from /sys/class/infiniband)."""
    devices = []
    for device in ctx.listdir("/sys/class/infiniband"):
        ports_folder = f"/sys/class/infiniband/{device}/ports"
        ports = [{"port": port, **{name: _read(ctx, f"{ports_folder}/{port}/{name}")
                                   for name in ("state", "link_layer", "rate")}}
                 for port in ctx.listdir(ports_folder)]
        devices.append({"name": device, "ports": ports})
    return devices


def _read(ctx: ProbeContext, absolute: str) -> str | None:
    text = ctx.read_text(absolute)
    return text.strip() if text is not None else None


def variable_facts(env: Mapping[str, str]) -> dict[str, Any]:
    """The launch variables, every NCCL_* variable, and the debugging ones, exactly as set."""
    return {
        "torchrun": {name: env[name] for name in TORCHRUN_VARIABLES if name in env},
        "nccl": {name: env[name] for name in sorted(env) if name.startswith("NCCL_")},
        "debug": {name: env[name] for name in DEBUG_VARIABLES if name in env},
    }


def resolves(host: str, timeout_s: float = RESOLVE_TIMEOUT_S) -> bool | None:
    """Whether MASTER_ADDR resolves; None when the lookup did not answer in time."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = pool.submit(socket.getaddrinfo, host, None)
    try:
        future.result(timeout=timeout_s)
        return True
    except socket.gaierror:
        return False
    except concurrent.futures.TimeoutError:
        return None
    finally:
        pool.shutdown(wait=False)  # a hung lookup finishes on its own thread; the check does not wait for it


def gather_host_facts(ctx: ProbeContext) -> dict[str, Any]:
    variables = variable_facts(ctx.env)
    master = variables["torchrun"].get("MASTER_ADDR")
    return {
        "shm": shared_memory_facts(ctx),
        "interfaces": interface_facts(ctx),
        "infiniband": infiniband_facts(ctx),
        "variables": variables,
        "master_addr_resolves": resolves(master) if master else None,
    }
