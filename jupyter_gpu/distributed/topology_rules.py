"""Topology rules: what in the GPU topology slows or breaks collectives, with the exact line to type.

Pure: a function of a `Topology` (jupyter_gpu.distributed.topology), whether NVML or a simulation produced it.
"""

from __future__ import annotations

from jupyter_gpu.distributed.topology import (
    CROSS_SOCKET_LEVEL,
    P2P_STATUS_TEXT,
    GpuLinks,
    PairLink,
    Topology,
)
from jupyter_gpu.models import LAYER_HOST, Finding

REFS_P2P_ZEROS = "https://github.com/NVIDIA/nccl-tests/issues/117"
P2P_FALLBACK_FIX = ("NCCL then copies through host memory (slower, but correct). If an all-reduce hangs or returns "
                    "wrong values, run with `NCCL_P2P_DISABLE=1`")
P2P_CHECK_FIX = "`jupyter-gpu allreduce` checks every pair's copy"


def topology_findings(topology: Topology) -> list[Finding]:
    if topology.status != "ok":
        return [_unread(topology)]
    return [*_p2p_findings(topology), *_nvlink_findings(topology), *_cross_socket_findings(topology)]


def _label(topology: Topology) -> str:
    return " (simulated)" if topology.simulated else ""


def _gpu_label(topology: Topology, index: int) -> str:
    gpu = topology.gpu(index)
    return gpu.label if gpu is not None else f"GPU {index}"


def _unread(topology: Topology) -> Finding:
    fix = {
        "no_nvml": ["`%gpucheck` (or `jupyter-gpu check`) says whether the NVIDIA driver is installed and loaded."],
        "unavailable": ["Unset JUPYTER_GPU_BACKEND to read this machine's GPUs, or try a simulated machine: "
                        "`JUPYTER_GPU_BACKEND=simulated:a100x8-mig`."],
    }.get(topology.status, ["`nvidia-smi topo -m` shows the topology the driver sees."])
    return Finding("DIST_NO_NVML", "info", f"The GPU topology could not be read{_label(topology)}: "
                   f"{topology.message or topology.status}",
                   {"source": topology.source, "status": topology.status}, fix,
                   layer=LAYER_HOST)


# -- peer-to-peer ---------------------------------------------------------------------------------------


def _p2p_text(status: str | None) -> str:
    return P2P_STATUS_TEXT.get(status or "", status or "not read")


def _p2p_findings(topology: Topology) -> list[Finding]:
    broken = [pair for pair in topology.pairs if pair.p2p_copy_broken]
    if not broken:
        return []
    if len(broken) == 1:
        pair = broken[0]
        who = f"{_gpu_label(topology, pair.a)} and {_gpu_label(topology, pair.b)} cannot"
    else:
        who = f"{len(broken)} GPU pairs ({', '.join(f'{p.a}-{p.b}' for p in broken[:6])}" + (
            " ..." if len(broken) > 6 else "") + ") cannot"
    reasons = sorted({status for pair in broken for status in (pair.p2p_read, pair.p2p_write)
                      if status not in (None, "ok")})
    fix = [f"{P2P_FALLBACK_FIX}.", f"{P2P_CHECK_FIX}."]
    if "disabled_by_registry" in reasons:
        fix.append("P2P was switched off on purpose with a driver registry key (NVreg_RegistryDwords in "
                   "/etc/modprobe.d): ask the administrator whether it can be turned back on.")
    if "ioh_topology_not_supported" in reasons:
        fix.append("This path crosses CPU sockets or I/O hubs that do not forward P2P: pin a job's GPUs on one "
                   "NUMA node (`nvidia-smi topo -m` shows each GPU's NUMA affinity).")
    return [Finding(
        "DIST_P2P_UNSUPPORTED", "warn",
        f"{who} copy peer-to-peer: NVML reports P2P {' / '.join(_p2p_text(r) for r in reasons)}{_label(topology)}",
        {"pairs": [_pair_evidence(pair) for pair in broken]}, fix, [REFS_P2P_ZEROS], layer=LAYER_HOST)]


def _pair_evidence(pair: PairLink) -> str:
    return f"GPU{pair.a}-GPU{pair.b} ({pair.level or '?'}): read {pair.p2p_read}, write {pair.p2p_write}"


# -- NVLink ---------------------------------------------------------------------------------------------


def _nvlink_findings(topology: Topology) -> list[Finding]:
    with_links = [gpu for gpu in topology.gpus if gpu.nvlinks]
    found = []
    for gpu in with_links:
        peers = [other.active_nvlinks for other in with_links if other.index != gpu.index]
        best_peer = max(peers, default=0)
        inactive = [link.link for link in gpu.nvlinks if link.active is False]
        fewer_than_peers = gpu.active_nvlinks < best_peer
        # All links inactive on a lone GPU is a card without an NVLink bridge, not a fault.
        partly_down = bool(inactive) and gpu.active_nvlinks > 0
        if fewer_than_peers or partly_down:
            found.append(_nvlink_down(topology, gpu, inactive, best_peer if peers else None))
    return found


def _nvlink_down(topology: Topology, gpu: GpuLinks, inactive: list[int], best_peer: int | None) -> Finding:
    peers = f"; its peers have {best_peer}" if best_peer is not None and best_peer > gpu.active_nvlinks else ""
    return Finding(
        "DIST_NVLINK_DOWN", "warn",
        f"{gpu.label} has {gpu.active_nvlinks} of {len(gpu.nvlinks)} NVLink links active{peers}: collectives "
        f"through it run slower{_label(topology)}",
        {"gpu": gpu.index, "active_links": gpu.active_nvlinks, "links": len(gpu.nvlinks),
         "inactive_links": inactive, "peers_active_links": best_peer},
        [f"`nvidia-smi nvlink --status -i {gpu.index}` shows each link's state and speed.",
         f"A link that went down stays down until the GPU is reset (`sudo nvidia-smi --gpu-reset -i {gpu.index}`, "
         "with no process on it) or the machine reboots; on an NVSwitch system also check "
         "`systemctl status nvidia-fabricmanager`. Without root, ask the administrator."],
        layer=LAYER_HOST)


# -- CPU sockets ----------------------------------------------------------------------------------------


def _cross_socket_findings(topology: Topology) -> list[Finding]:
    crossing = [pair for pair in topology.pairs if pair.level == CROSS_SOCKET_LEVEL]
    if not crossing:
        return []
    group = _one_socket_group(topology)
    shown = ", ".join(f"{p.a}-{p.b}" for p in crossing[:6]) + (" ..." if len(crossing) > 6 else "")
    fix = ["Pin a job's GPUs on one NUMA node"
           + (f", e.g. `CUDA_VISIBLE_DEVICES={','.join(map(str, group))}`" if len(group) >= 2 else "")
           + " (`nvidia-smi topo -m` shows each GPU's NUMA affinity)."]
    return [Finding(
        "DIST_CROSS_SOCKET", "info",
        f"{'GPU pairs' if len(crossing) > 1 else 'The GPU pair'} {shown} "
        f"{'connect' if len(crossing) > 1 else 'connects'} across CPU sockets (SYS): their traffic "
        f"crosses the CPU interconnect, the slowest path in the machine{_label(topology)}",
        {"pairs": [f"GPU{p.a}-GPU{p.b}" for p in crossing]}, fix, layer=LAYER_HOST)]


def _one_socket_group(topology: Topology) -> list[int]:
    """The lowest-numbered GPUs that reach each other without crossing a socket, starting from the first GPU."""
    group: list[int] = []
    for gpu in topology.gpus:
        if all((pair := topology.pair(gpu.index, member)) is None or pair.level != CROSS_SOCKET_LEVEL
               for member in group):
            group.append(gpu.index)
    return group
