"""The NVLink/PCIe topology of each simulated metrics scenario, for tests and demos on machines without a GPU.

The GPUs (count, names, UUIDs) and the `nodriver` message are taken from the metrics scenario of the same name
(jupyter_gpu.metrics.backends.simulated), so the panel and the topology describe the same simulated machine;
this module adds only what NVML would say about links. Every topology is marked simulated.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from jupyter_gpu.distributed.topology import P2P_OK, GpuLinks, NvLink, PairLink, Topology, nvlink_level, unread_topology
from jupyter_gpu.metrics.backends.simulated import SCENARIOS, SimulatedBackend


@dataclass(frozen=True)
class _Layout:
    """How one scenario's GPUs are linked: all alike, joined through NVSwitches or over PCIe only."""

    architecture: str
    pcie: tuple[int, int]  # (generation, width)
    bus_ids: tuple[str, ...]  # one per GPU, in index order
    nvlinks: int = 0  # links per GPU, all active, spread evenly over `switches`
    switches: tuple[str, ...] = ()  # the NVSwitches' bus ids
    pcie_level: str = "PHB"  # the path between two GPUs that have no NVLink
    p2p_copy: str = P2P_OK  # read and write status between every pair
    p2p_atomics: str = P2P_OK


# The NVSwitch bus ids of a DGX A100 (six switches, two links from every GPU to each).
_DGX_A100_SWITCHES = tuple(f"00000000:{bus:02X}:00.0" for bus in (0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9))
_HGX_H200_SWITCHES = tuple(f"00000000:{bus:02X}:00.0" for bus in (0x05, 0x06, 0x07, 0x08))

# The DGX A100: eight A100 SXM4 on PCIe Gen4 x16, each with 12 NVLink 3 links into the NVSwitches, so every
# pair shows NV12 in `nvidia-smi topo -m`.
_DGX_A100 = _Layout("ampere", (4, 16), tuple(f"00000000:{bus:02X}:00.0" for bus in
                                              (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)),
                    nvlinks=12, switches=_DGX_A100_SWITCHES)
# One H200 SXM of an HGX board: 18 NVLink 4 links into the board's NVSwitches, PCIe Gen5 x16.
_H200 = _Layout("hopper", (5, 16), ("00000000:19:00.0",), nvlinks=18, switches=_HGX_H200_SWITCHES)
# Two GeForce RTX 4090 on root ports of one host bridge: no NVLink, and the driver reports no P2P for this
# card family, where P2P copies once silently returned zeros (nvidia-ccl-tests#117).
_PCIE_PAIR = _Layout("ada", (4, 16), ("00000000:01:00.0", "00000000:21:00.0"), pcie_level="PHB",
                     p2p_copy="not_supported", p2p_atomics="not_supported")

_LAYOUTS: dict[str, _Layout] = {
    "a100x8-mig": _DGX_A100,
    "h200": _H200,
    "h200-busy": _H200,
    "h200-hot": _H200,
    "lost": _H200,  # read at the start, before the scenario's GPU falls off the bus
    "pcie-pair": _PCIE_PAIR,
}


def _switch_links(layout: _Layout) -> tuple[NvLink, ...]:
    # In blocks: on a DGX A100, links 0-1 go to the first switch, 2-3 to the second, ...
    per_switch = max(1, layout.nvlinks // len(layout.switches))
    return tuple(NvLink(link, True, layout.switches[(link // per_switch) % len(layout.switches)], "switch")
                 for link in range(layout.nvlinks))


def _pair(layout: _Layout, a: int, b: int) -> PairLink:
    if layout.nvlinks:
        return PairLink(a, b, nvlink_level(layout.nvlinks), layout.nvlinks, P2P_OK, P2P_OK, P2P_OK, layout.p2p_atomics)
    return PairLink(a, b, layout.pcie_level, 0, layout.p2p_copy, layout.p2p_copy, "not_supported",
                    layout.p2p_atomics)


def simulated_topology(scenario: str) -> Topology:
    """The topology of the metrics scenario `scenario`; ValueError for a name that is none."""
    if scenario not in SCENARIOS:
        raise ValueError(f"Unknown simulated scenario {scenario!r}; choose one of {', '.join(SCENARIOS)}.")
    source = f"simulated:{scenario}"
    # One read at the scenario's start, without claims: only the GPUs' identities are used.
    sample = SimulatedBackend(scenario, clock=lambda: 0.0, claims_dir="").read()
    if sample.status != "ok":
        return unread_topology(source, "no_nvml", sample.message or "NVML could not start.", simulated=True)
    layout = _LAYOUTS[scenario]
    gpus = tuple(
        GpuLinks(device.index, device.name, device.uuid, bus_id, layout.architecture, *layout.pcie,
                 _switch_links(layout) if layout.nvlinks else ())
        for device, bus_id in zip(sample.devices, layout.bus_ids, strict=True)
    )
    pairs = tuple(_pair(layout, a.index, b.index) for a, b in combinations(gpus, 2))
    return Topology(source, True, "ok", None, gpus, pairs)
