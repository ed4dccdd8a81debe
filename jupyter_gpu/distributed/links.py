"""Nominal link speeds: what a collective's bus bandwidth is compared against (nccl-tests' PERFORMANCE.md).

Bus bandwidth is per GPU and per direction, so the peak here is too: the sum of a GPU's NVLink links in one
direction, or its PCIe link in one direction. Pure data and arithmetic; NVML is read elsewhere.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

GB = 1000**3  # link speeds are quoted in decimal gigabytes per second

# GB/s per NVLink link and direction, by GPU architecture: NVLink 1 (Pascal P100) 20; NVLink 2, 3 and 4
# (Volta V100, Ampere A100, Hopper H100/H200) 25; NVLink 5 (Blackwell B200) 50. Architecture first, because
# NVML's nvmlDeviceGetNvLinkVersion numbering changed between drivers (an enum where 4 means "3.0"), and some
# drivers report 5.0 for Hopper.
NVLINK_GB_PER_LINK_BY_ARCHITECTURE: dict[str, float] = {
    "pascal": 20.0, "volta": 25.0, "ampere": 25.0, "hopper": 25.0, "blackwell": 50.0,
}

# GB/s per lane and direction after line encoding (8b/10b for generations 1-2, 128b/130b for 3-5, FLIT for 6).
PCIE_GB_PER_LANE: dict[int, float] = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


@dataclass(frozen=True)
class LinkPeak:
    """The fastest one GPU can send in one direction over its links: what bus bandwidth approaches."""

    bytes_per_s: float
    kind: str  # "nvlink" or "pcie"
    description: str  # e.g. "12 NVLink links x 25 GB/s (Ampere)" or "PCIe Gen4 x16"
    simulated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def nvlink_peak(active_links: int, architecture: str | None, *, simulated: bool = False) -> LinkPeak | None:
    """The per-direction peak of `active_links` NVLink links; None when the architecture's rate is unknown."""
    rate = NVLINK_GB_PER_LINK_BY_ARCHITECTURE.get((architecture or "").lower())
    if rate is None or active_links <= 0:
        return None
    return LinkPeak(active_links * rate * GB, "nvlink",
                    f"{active_links} NVLink link{'s' if active_links != 1 else ''} x {rate:g} GB/s "
                    f"({architecture.capitalize() if architecture else ''})", simulated)


def pcie_peak(generation: int | None, width: int | None, *, simulated: bool = False) -> LinkPeak | None:
    """The per-direction peak of a PCIe link; None when the generation or width is unknown."""
    rate = PCIE_GB_PER_LANE.get(generation or 0)
    if rate is None or not width or width <= 0:
        return None
    return LinkPeak(rate * width * GB, "pcie", f"PCIe Gen{generation} x{width}", simulated)


def ratio_to_peak(bus_bytes_per_s: float, peak: LinkPeak | None) -> float | None:
    """Bus bandwidth as a share of the link's nominal peak (0.8 = 80 %); None without a peak."""
    if peak is None or peak.bytes_per_s <= 0:
        return None
    return bus_bytes_per_s / peak.bytes_per_s
