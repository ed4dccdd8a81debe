"""How the GPUs of one machine are linked, as `nvidia-smi topo -m` shows it: NVLink links per GPU, the PCIe link,
and for every pair of GPUs the path between them and whether they can copy peer-to-peer.

Pure data: NVML is read in jupyter_gpu.distributed.nvml_topology, simulated machines are built in
simulated_topology, and both produce these objects, which travel inside the readiness snapshot as JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from itertools import combinations
from typing import Any, Literal

from jupyter_gpu.distributed.links import LinkPeak, nvlink_peak, pcie_peak

TopologyStatus = Literal["ok", "no_nvml", "error", "unavailable"]

P2P_OK = "ok"
# NVML_P2P_STATUS_* (nvml.h) -> the names a snapshot keeps: readable, and stable if NVML renumbers.
P2P_STATUS_BY_NVML_CODE: dict[int, str] = {
    0: P2P_OK,
    1: "chipset_not_supported",
    2: "gpu_not_supported",
    3: "ioh_topology_not_supported",
    4: "disabled_by_registry",
    5: "not_supported",
    6: "unknown",
}
P2P_STATUS_TEXT: dict[str, str] = {
    P2P_OK: "supported",
    "chipset_not_supported": "not supported by this chipset",
    "gpu_not_supported": "not supported by this GPU model",
    "ioh_topology_not_supported": "not supported across this I/O hub topology (for example between CPU sockets)",
    "disabled_by_registry": "disabled by a driver registry key",
    "not_supported": "not supported",
    "unknown": "unknown to NVML",
}

# NVML_TOPOLOGY_* (nvml.h, nvmlGpuTopologyLevel_t) -> the code `nvidia-smi topo -m` prints for a path without
# NVLink. INTERNAL is two GPUs on one board behind the board's own bridge (a Tesla K80): nvidia-smi prints PIX.
LEVEL_BY_NVML_TOPOLOGY: dict[int, str] = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
CROSS_SOCKET_LEVEL = "SYS"


def nvlink_level(links: int) -> str:
    """What nvidia-smi prints for a pair joined by `links` NVLink links: NV12."""
    return f"NV{links}"


@dataclass(frozen=True)
class NvLink:
    """One NVLink link of a GPU. `active` None: NVML could not say. `remote_kind`: "gpu", "switch" (NVSwitch)
    or "ibmnpu" (a POWER9 CPU), None when unknown."""

    link: int
    active: bool | None
    remote_bus_id: str | None
    remote_kind: str | None = None


@dataclass(frozen=True)
class GpuLinks:
    """One GPU's identity and links. PCIe generation and width are the most the GPU and this system allow
    (the current values drop while the GPU idles)."""

    index: int
    name: str | None
    uuid: str | None
    bus_id: str | None
    architecture: str | None  # "ampere", "hopper", ...
    pcie_generation: int | None
    pcie_width: int | None
    nvlinks: tuple[NvLink, ...] = ()

    @property
    def active_nvlinks(self) -> int:
        return sum(1 for link in self.nvlinks if link.active)

    @property
    def label(self) -> str:
        """How headlines name a GPU: "GPU 3 (NVIDIA A100-SXM4-80GB)"."""
        return f"GPU {self.index}" + (f" ({self.name})" if self.name else "")


@dataclass(frozen=True)
class PairLink:
    """The path between GPUs `a` < `b`: `level` as nvidia-smi prints it ("NV12", "PIX", "PXB", "PHB", "NODE",
    "SYS"; None when unread), the NVLink links joining them (through NVSwitches too), and each P2P capability's
    status (a P2P_STATUS_BY_NVML_CODE value; None when unread)."""

    a: int
    b: int
    level: str | None
    nvlinks: int
    p2p_read: str | None
    p2p_write: str | None
    p2p_nvlink: str | None
    p2p_atomics: str | None

    @property
    def p2p_copy_broken(self) -> bool:
        """True when NVML says a peer-to-peer read or write between the two is not possible."""
        return any(status not in (None, P2P_OK) for status in (self.p2p_read, self.p2p_write))


@dataclass(frozen=True)
class Topology:
    """Every GPU and every pair of one machine. `status` other than "ok" means nothing could be read;
    `message` then says why. `source`: "nvml" or "simulated:NAME"."""

    source: str
    simulated: bool
    status: TopologyStatus
    message: str | None
    gpus: tuple[GpuLinks, ...] = ()
    pairs: tuple[PairLink, ...] = ()

    def gpu(self, index: int) -> GpuLinks | None:
        return next((gpu for gpu in self.gpus if gpu.index == index), None)

    def pair(self, a: int, b: int) -> PairLink | None:
        low, high = min(a, b), max(a, b)
        return next((pair for pair in self.pairs if (pair.a, pair.b) == (low, high)), None)

    def link_peak(self) -> LinkPeak | None:
        """The link that bounds an all-reduce over every GPU, per GPU and direction; None with fewer than two
        GPUs (an all-reduce over one GPU uses no link) or when a rate is unknown.

        NVLink when every pair is joined by NVLink (directly or through NVSwitches): the GPU with the fewest
        active links sets the pace. Otherwise traffic crosses PCIe somewhere, and the slowest PCIe link does.
        """
        if self.status != "ok" or len(self.gpus) < 2:
            return None
        pairs = [self.pair(a.index, b.index) for a, b in combinations(self.gpus, 2)]
        if all(pair is not None and pair.nvlinks > 0 for pair in pairs):
            slowest = min(self.gpus, key=lambda gpu: gpu.active_nvlinks)
            # An unknown NVLink rate is no reason to quote PCIe: that would understate the link tenfold.
            return nvlink_peak(slowest.active_nvlinks, slowest.architecture, simulated=self.simulated)
        peaks = [pcie_peak(gpu.pcie_generation, gpu.pcie_width, simulated=self.simulated) for gpu in self.gpus]
        if any(peak is None for peak in peaks):
            return None  # the unread link may be the slowest one
        return min((peak for peak in peaks if peak is not None), key=lambda peak: peak.bytes_per_s)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Topology:
        return cls(
            source=str(data["source"]),
            simulated=bool(data["simulated"]),
            status=data["status"],
            message=data.get("message"),
            gpus=tuple(
                GpuLinks(**{**gpu, "nvlinks": tuple(NvLink(**link) for link in gpu.get("nvlinks") or ())})
                for gpu in data.get("gpus") or ()
            ),
            pairs=tuple(PairLink(**pair) for pair in data.get("pairs") or ()),
        )


def unread_topology(source: str, status: TopologyStatus, message: str, *, simulated: bool = False) -> Topology:
    """A topology that could not be read, and the one sentence saying why."""
    return Topology(source, simulated, status, message)
