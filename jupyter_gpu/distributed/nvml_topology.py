"""The GPU topology from NVML, as `nvidia-smi topo -m` shows it, or the simulated one JUPYTER_GPU_BACKEND names.

Read only: NVML is started, asked, and shut down again. Every value is read on its own, so one call a GPU or
driver does not support leaves that one field None and never hides the rest. pynvml (nvidia-ml-py) is imported
on the first read, never at import.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from itertools import combinations
from typing import Any, TypeVar

from jupyter_gpu.distributed.simulated_topology import simulated_topology
from jupyter_gpu.distributed.topology import (
    LEVEL_BY_NVML_TOPOLOGY,
    P2P_STATUS_BY_NVML_CODE,
    GpuLinks,
    NvLink,
    PairLink,
    Topology,
    nvlink_level,
    unread_topology,
)
from jupyter_gpu.metrics.backends.base import BACKEND_ENV
from jupyter_gpu.metrics.backends.nvml import init_failure_message

SOURCE = "nvml"

# NVML_P2P_CAPS_INDEX_* (nvml.h). Our own numbers, because pynvml 13.615 defines NVML_P2P_CAPS_INDEX_READ as
# the tuple (0,) (a trailing comma), which ctypes refuses with ArgumentError.
P2P_CAPS_INDEX = {"p2p_read": 0, "p2p_write": 1, "p2p_nvlink": 2, "p2p_atomics": 3}
# NVML_DEVICE_ARCH_* (nvml.h) -> the names jupyter_gpu.distributed.links rates NVLink by.
ARCHITECTURE_BY_NVML_CODE = {2: "kepler", 3: "maxwell", 4: "pascal", 5: "volta", 6: "turing", 7: "ampere",
                             8: "ada", 9: "hopper", 10: "blackwell", 13: "rubin"}
# NVML_NVLINK_DEVICE_TYPE_* (nvml.h): what is at the far end of a link.
REMOTE_KIND_BY_NVML_CODE = {0: "gpu", 1: "ibmnpu", 2: "switch"}
# The most links NVML numbers when the binding does not say (NVML_NVLINK_MAX_LINKS was 18 before Blackwell).
DEFAULT_MAX_LINKS = 18

T = TypeVar("T")


def _text(value: Any) -> str:
    # Older pynvml releases return bytes for names, UUIDs and bus ids.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def bus_key(bus_id: str | None) -> tuple[int, int, int, int] | None:
    """A PCI address as numbers, so "00000000:07:00.0" and "0000:07:00.0" (NVML's legacy form) match."""
    if not bus_id:
        return None
    try:
        domain, bus, rest = bus_id.strip().split(":")
        device, function = rest.split(".")
        return int(domain, 16), int(bus, 16), int(device, 16), int(function, 16)
    except ValueError:
        return None


class _Reader:
    """One read of every device and pair through a pynvml-like module."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.errors: tuple[type[BaseException], ...] = (
            nvml.NVMLError, getattr(nvml, "NVMLLibraryMismatchError", nvml.NVMLError))
        # The ends of a link list: no NVLink at all, past the GPU's last link, or a driver without the call.
        self.no_more_links = tuple(getattr(nvml, name) for name in (
            "NVMLError_NotSupported", "NVMLError_InvalidArgument", "NVMLError_FunctionNotFound") if hasattr(nvml, name))

    def field(self, getter: Callable[[], T]) -> T | None:
        try:
            return getter()
        except self.errors:
            return None

    def read(self) -> Topology:
        nvml = self.nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except self.errors as exc:
            return unread_topology(SOURCE, "error", f"NVML started but could not count the GPUs: {exc}.")
        handles = [self.field(lambda index=index: nvml.nvmlDeviceGetHandleByIndex(index)) for index in range(count)]
        gpus = tuple(self.gpu(index, handle) for index, handle in enumerate(handles))
        pairs = tuple(self.pair(gpus, handles, a, b) for a, b in combinations(range(count), 2)
                      if handles[a] is not None and handles[b] is not None)
        return Topology(SOURCE, False, "ok", None, gpus, pairs)

    def gpu(self, index: int, handle: Any) -> GpuLinks:
        if handle is None:
            return GpuLinks(index, None, None, None, None, None, None)
        nvml = self.nvml
        architecture = self.field(lambda: int(nvml.nvmlDeviceGetArchitecture(handle)))
        return GpuLinks(
            index=index,
            name=self.field(lambda: _text(nvml.nvmlDeviceGetName(handle))),
            uuid=self.field(lambda: _text(nvml.nvmlDeviceGetUUID(handle))),
            bus_id=self.field(lambda: _text(nvml.nvmlDeviceGetPciInfo(handle).busId)),
            architecture=None if architecture is None else ARCHITECTURE_BY_NVML_CODE.get(architecture),
            # The most the GPU and this system allow: the current generation drops while the GPU idles.
            pcie_generation=self.field(lambda: int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle))),
            pcie_width=self.field(lambda: int(nvml.nvmlDeviceGetMaxPcieLinkWidth(handle))),
            nvlinks=self.nvlinks(handle),
        )

    def nvlinks(self, handle: Any) -> tuple[NvLink, ...]:
        nvml = self.nvml
        links = []
        for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", DEFAULT_MAX_LINKS))):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(handle, link)
            except self.no_more_links:
                break  # not every GPU has NVML_NVLINK_MAX_LINKS links; a PCIe card has none
            except self.errors:
                links.append(NvLink(link, None, None))
                continue
            active = int(state) == 1  # NVML_FEATURE_ENABLED
            remote = kind = None
            if active:
                remote = self.field(lambda link=link: _text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
                code = self.field(lambda link=link: int(nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)))
                kind = None if code is None else REMOTE_KIND_BY_NVML_CODE.get(code)
            links.append(NvLink(link, active, remote, kind))
        return tuple(links)

    def pair(self, gpus: tuple[GpuLinks, ...], handles: list[Any], a: int, b: int) -> PairLink:
        nvml = self.nvml
        statuses = {
            name: self.field(lambda index=index: P2P_STATUS_BY_NVML_CODE.get(
                int(nvml.nvmlDeviceGetP2PStatus(handles[a], handles[b], index)), "unknown"))
            for name, index in P2P_CAPS_INDEX.items()
        }
        ancestor = self.field(lambda: int(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b])))
        links = links_between(gpus, a, b)
        level = nvlink_level(links) if links else (None if ancestor is None else LEVEL_BY_NVML_TOPOLOGY.get(ancestor))
        return PairLink(a, b, level, links, **statuses)


def links_between(gpus: tuple[GpuLinks, ...], a: int, b: int) -> int:
    """The NVLink links joining GPUs a and b, as nvidia-smi counts them: a's links that end at b, plus, when both
    reach NVSwitches, the fewer of their switch links (every switch joins every GPU: a DGX A100 shows NV12)."""
    gpu_a, gpu_b = gpus[a], gpus[b]
    gpu_buses = {bus_key(gpu.bus_id) for gpu in gpus} - {None}
    target = bus_key(gpu_b.bus_id)
    direct = sum(1 for link in gpu_a.nvlinks if link.active and target is not None
                 and bus_key(link.remote_bus_id) == target)
    return direct + min(_switch_links(gpu_a, gpu_buses), _switch_links(gpu_b, gpu_buses))


def _switch_links(gpu: GpuLinks, gpu_buses: set[Any]) -> int:
    def to_switch(link: NvLink) -> bool:
        if link.remote_kind is not None:
            return link.remote_kind == "switch"
        # A driver without the device-type call: a far end that is no GPU of this machine is an NVSwitch.
        key = bus_key(link.remote_bus_id)
        return key is not None and key not in gpu_buses

    return sum(1 for link in gpu.nvlinks if link.active and to_switch(link))


def read_nvml_topology(nvml: Any | None = None) -> Topology:
    """Every GPU's links and every pair's path from NVML (`nvml`: a pynvml-like module, for tests)."""
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError as exc:
            return unread_topology(SOURCE, "no_nvml", f"nvidia-ml-py is not installed in this environment ({exc}), "
                                   "so the GPU topology cannot be read; install it with `pip install nvidia-ml-py`.")
    reader = _Reader(nvml)
    try:
        nvml.nvmlInit()
    except reader.errors as exc:
        return unread_topology(SOURCE, "no_nvml", init_failure_message(str(exc), getattr(exc, "value", None)))
    try:
        return reader.read()
    finally:
        # NVML counts inits: this shutdown leaves a metrics sampler that started NVML in this process running.
        reader.field(nvml.nvmlShutdown)


def topology_for_backend(env: Mapping[str, str] | None = None) -> Topology:
    """The topology of the backend JUPYTER_GPU_BACKEND names: NVML (unset or "nvml"), the simulated scenario
    (`simulated:NAME`); a recording (`replay:FILE`) holds none. A bad spec is a status, never an exception."""
    spec = (os.environ if env is None else env).get(BACKEND_ENV, "").strip()
    kind, _, argument = spec.partition(":")
    kind, argument = kind.strip().lower(), argument.strip()
    if kind in ("", "nvml"):
        return read_nvml_topology()
    if kind == "simulated":
        try:
            return simulated_topology(argument)
        except ValueError as exc:
            return unread_topology(spec, "error", f"{BACKEND_ENV}={spec}: {exc}", simulated=True)
    if kind == "replay":
        return unread_topology(spec, "unavailable", f"{BACKEND_ENV}={spec} replays a recording of GPU metrics, which "
                               "holds no topology; unset it to read this machine's GPUs through NVML.")
    return unread_topology(spec, "error", f"{BACKEND_ENV}={spec} names no GPU backend; use 'nvml' (the default), "
                           "simulated:NAME or replay:FILE.")
