"""Metrics from the real NVIDIA driver through NVML (`pynvml` from the nvidia-ml-py package).

This is the only module that calls NVML for metrics. Every driver problem becomes a status in the Sample:
no library or driver -> `no_driver`, a GPU that fell off the bus -> that device `lost`, a field the GPU does
not support -> `None`. A monitoring panel must never take the kernel or the server down with it.
"""

from __future__ import annotations

import importlib
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from jupyter_gpu.metrics.sample import DeviceSample, GpuProcess, MigInstance, Sample, throttle_reason_names

logger = logging.getLogger(__name__)

# NVML error codes (nvml.h); stable across drivers. Used for hints so the simulated backend needs no pynvml.
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18

_INIT_HINTS: dict[int, str] = {
    NVML_ERROR_LIBRARY_NOT_FOUND: "the NVIDIA driver is not installed here, or this machine has no NVIDIA GPU",
    NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "the driver was upgraded without a reboot; reboot the machine",
    NVML_ERROR_NO_PERMISSION: "this user may not open the GPU device files",
}

# How long a failed nvmlInit is remembered: a driver rarely appears within seconds, and a failing init
# can take a while, so a 1 s sampler must not pay for it on every read.
INIT_RETRY_SECONDS = 30.0
PCIE_REFRESH_S = 2.0


def init_failure_message(error: str, code: int | None = None) -> str:
    """One sentence saying why NVML could not start, quoting NVML's own words."""
    hint = _INIT_HINTS.get(code) if code is not None else None
    return f"NVML could not start: {error}" + (f" ({hint})." if hint else ".")


# nvmlComputeMode_t (nvml.h): 1, exclusive to a thread, was removed from the driver but can still be read back.
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}

def lost_message(index: int, error: object) -> str:
    """The one sentence a GPU that fell off the bus is reported with (the simulated `lost` scenario reuses it)."""
    return f"NVML reports GPU {index} is lost ({error}): it fell off the bus and needs a reset or a reboot."


# NVML's "not available" / "not applicable" sentinels: all ones in an unsigned int or unsigned long long.
_UINT_NOT_AVAILABLE = 0xFFFFFFFF
_ULONGLONG_NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF
_MIG_PROFILE = re.compile(r"\d+g\.\d+gb\S*$")


def mig_profile(name: str | None) -> str | None:
    """The MIG profile at the end of a MIG device's name: "NVIDIA A100-SXM4-80GB MIG 1g.10gb" -> "1g.10gb"."""
    if not name:
        return None
    _, sep, tail = name.rpartition("MIG ")
    if sep and tail.strip():
        return tail.strip()
    match = _MIG_PROFILE.search(name.strip())
    return match.group(0) if match else None


def _text(value: Any) -> str:
    # Older pynvml releases return bytes for names and UUIDs.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# field(label, getter): one NVML value read on its own (see NvmlBackend._read_fields).
_Field = Callable[[str, Callable[[], Any]], Any]


def _process(entry: Any) -> GpuProcess:
    """One pynvml process entry; NVML's "not available" values become None."""
    memory = getattr(entry, "usedGpuMemory", None)
    instance = getattr(entry, "gpuInstanceId", None)  # absent from the v1 struct
    return GpuProcess(
        pid=int(entry.pid),
        memory_used=None if memory is None or int(memory) == _ULONGLONG_NOT_AVAILABLE else int(memory),
        gpu_instance_id=None if instance is None or int(instance) == _UINT_NOT_AVAILABLE else int(instance),
    )


def _memory_key(process: GpuProcess) -> int:
    # Unknown memory sorts below a known 0 B.
    return -1 if process.memory_used is None else process.memory_used


class _GpuLost(Exception):
    """Raised inside one device read to abandon the remaining fields of a GPU that fell off the bus."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))


class NvmlBackend:
    """Reads every NVML device; safe to call `read()` from a background thread."""

    name = "nvml"
    simulated = False

    def __init__(
        self,
        nvml_module: Any | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        retry_seconds: float = INIT_RETRY_SECONDS,
    ) -> None:
        # pynvml is imported on the first read, never here: constructing a backend must cost nothing.
        self._nvml: Any | None = nvml_module
        self._clock = clock
        self._retry_seconds = retry_seconds
        self._lock = threading.Lock()
        self._initialised = False
        self._init_failure: str | None = None
        self._retry_at = 0.0
        self._event_reasons_missing = False
        self._pcie: dict[int, tuple[float, float | None, float | None]] = {}  # index -> (read at, tx, rx)
        self._processes_v2: set[str] = set()  # "Compute"/"Graphics" when the driver lacks the _v3 process call
        # Last name/UUID seen per index, so a lost GPU is still named in the panel.
        self._identity: dict[int, tuple[str | None, str | None]] = {}
        self._logged: set[tuple[int, str, str]] = set()

    def read(self) -> Sample:
        with self._lock:
            timestamp = time.time()
            failure = self._ensure_initialised()
            if failure is not None:
                return Sample(timestamp, self.name, False, status="no_driver", message=failure)
            nvml = self._nvml
            try:
                count = int(nvml.nvmlDeviceGetCount())
            except self._errors() as exc:
                message = f"NVML started but could not count the GPUs: {exc}."
                return Sample(timestamp, self.name, False, status="error", message=message)
            devices = tuple(self._read_device(nvml, index) for index in range(count))
            return Sample(timestamp, self.name, False, devices=devices)

    def close(self) -> None:
        with self._lock:
            if self._initialised and self._nvml is not None:
                try:
                    self._nvml.nvmlShutdown()
                except self._errors() as exc:
                    logger.debug("nvmlShutdown failed: %s", exc)
            self._initialised = False
            self._init_failure = None  # a later read() starts afresh

    # -- initialisation ------------------------------------------------------------------------------

    def _ensure_initialised(self) -> str | None:
        """None when NVML is ready, else the one-sentence reason (retried at most every retry_seconds)."""
        if self._initialised:
            return None
        if self._init_failure is not None and self._clock() < self._retry_at:
            return self._init_failure
        self._init_failure = self._try_init()
        if self._init_failure is None:
            self._initialised = True
        else:
            self._retry_at = self._clock() + self._retry_seconds
        return self._init_failure

    def _try_init(self) -> str | None:
        if self._nvml is None:
            try:
                self._nvml = importlib.import_module("pynvml")
            except ImportError as exc:
                return (f"nvidia-ml-py is not installed in this environment ({exc}), so GPU metrics cannot be "
                        "read; install it with `pip install nvidia-ml-py`.")
        try:
            self._nvml.nvmlInit()
        except self._errors() as exc:
            return init_failure_message(str(exc), getattr(exc, "value", None))
        return None

    def _errors(self) -> tuple[type[BaseException], ...]:
        nvml = self._nvml
        # NVMLLibraryMismatchError: pynvml's wrapper for "this binding is newer than the driver".
        return (nvml.NVMLError, getattr(nvml, "NVMLLibraryMismatchError", nvml.NVMLError))

    # -- one device ----------------------------------------------------------------------------------

    def _read_device(self, nvml: Any, index: int) -> DeviceSample:
        name, uuid = self._identity.get(index, (None, None))
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError_GpuIsLost as exc:
            return self._lost(index, name, uuid, exc)
        except self._errors() as exc:
            return DeviceSample(index, name, uuid, status="error", error=f"NVML could not open GPU {index}: {exc}.")
        try:
            return self._read_fields(nvml, index, handle)
        except _GpuLost as lost:
            name, uuid = self._identity.get(index, (name, uuid))
            return self._lost(index, name, uuid, lost)

    def _read_fields(self, nvml: Any, index: int, handle: Any) -> DeviceSample:
        def field(label: str, getter: Callable[[], Any]) -> Any:
            # Each field on its own: one unsupported or failing value must not hide the others.
            try:
                return getter()
            except nvml.NVMLError_GpuIsLost as exc:
                raise _GpuLost(exc) from exc
            except nvml.NVMLError_NotSupported:
                return None
            except self._errors() as exc:
                self._log_once(index, label, exc)
                return None

        name = field("name", lambda: _text(nvml.nvmlDeviceGetName(handle)))
        uuid = field("uuid", lambda: _text(nvml.nvmlDeviceGetUUID(handle)))
        self._identity[index] = (name, uuid)
        utilization = field("utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        memory = field("memory", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        mask = field("throttle_reasons", lambda: self._throttle_mask(nvml, handle))
        mig_mode = field("mig_mode", lambda: nvml.nvmlDeviceGetMigMode(handle))
        mig_enabled = None if mig_mode is None else int(mig_mode[0]) == nvml.NVML_DEVICE_MIG_ENABLE
        pcie = self._pcie_throughput(nvml, index, handle, field)
        return DeviceSample(
            index=index,
            name=name,
            uuid=uuid,
            utilization_gpu=None if utilization is None else float(utilization.gpu),
            utilization_memory=None if utilization is None else float(utilization.memory),
            memory_used=None if memory is None else int(memory.used),
            memory_total=None if memory is None else int(memory.total),
            temperature_c=field(
                "temperature", lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
            ),
            power_w=field("power", lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),
            power_limit_w=field("power_limit", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0),
            sm_clock_mhz=field("sm_clock", lambda: float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))),
            throttle_reasons=None if mask is None else throttle_reason_names(int(mask)),
            pcie_tx_bytes_per_s=pcie[0],
            pcie_rx_bytes_per_s=pcie[1],
            mig_enabled=mig_enabled,
            mig_instances=self._mig_instances(nvml, handle, field) if mig_enabled else (),
            processes=self._processes(nvml, handle, field),
            compute_mode=COMPUTE_MODES.get(field("compute_mode", lambda: int(nvml.nvmlDeviceGetComputeMode(handle)))),
        )

    def _pcie_throughput(self, nvml: Any, index: int, handle: Any, field: _Field) -> tuple[float | None, float | None]:
        """(tx, rx) in bytes/s, re-read at most every PCIE_REFRESH_S.

        NVML counts PCIe throughput over a 20 ms window and the call may wait that long, twice per GPU: at the
        0.1 s rate `%%gputime` samples eight GPUs, reading it every time would stall the sampler.
        """
        now = self._clock()
        cached = self._pcie.get(index)
        if cached is not None and now - cached[0] < PCIE_REFRESH_S:
            return cached[1], cached[2]
        # NVML reports PCIe throughput in KB/s (1024 bytes).
        tx = field("pcie_tx", lambda: nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_TX_BYTES) * 1024.0)
        rx = field("pcie_rx", lambda: nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_RX_BYTES) * 1024.0)
        self._pcie[index] = (now, tx, rx)
        return tx, rx

    def _mig_instances(self, nvml: Any, handle: Any, field: _Field) -> tuple[MigInstance, ...]:
        count = field("mig_device_count", lambda: int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)))
        instances = []
        for slot in range(count or 0):
            mig = field("mig_handle", lambda slot=slot: self._mig_handle(nvml, handle, slot))
            if mig is None:
                continue  # an empty slot, or one NVML would not open
            name = field("mig_name", lambda mig=mig: _text(nvml.nvmlDeviceGetName(mig)))
            memory = field("mig_memory", lambda mig=mig: nvml.nvmlDeviceGetMemoryInfo(mig))
            instances.append(MigInstance(
                index=slot,
                uuid=field("mig_uuid", lambda mig=mig: _text(nvml.nvmlDeviceGetUUID(mig))),
                profile=mig_profile(name),
                gpu_instance_id=field("mig_gpu_instance_id", lambda mig=mig: int(nvml.nvmlDeviceGetGpuInstanceId(mig))),
                memory_used=None if memory is None else int(memory.used),
                memory_total=None if memory is None else int(memory.total),
            ))
        return tuple(instances)

    @staticmethod
    def _mig_handle(nvml: Any, handle: Any, slot: int) -> Any:
        try:
            return nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError_NotFound:
            return None  # no MIG device in this slot: normal, not worth a log line

    def _processes(self, nvml: Any, handle: Any, field: _Field) -> tuple[GpuProcess, ...] | None:
        # With MIG on, the parent's lists cover every slice (each entry names its GPU instance).
        compute = field("compute_processes", lambda: self._running(nvml, handle, "Compute"))
        if compute is None:
            return None  # "could not list", not "no process": graphics alone would undercount
        graphics = field("graphics_processes", lambda: self._running(nvml, handle, "Graphics"))
        by_pid: dict[int, GpuProcess] = {}
        for entry in [*compute, *(graphics or ())]:
            process = _process(entry)
            known = by_pid.get(process.pid)
            # A pid in both lists is one process: keep the larger figure rather than count its memory twice.
            if known is None or _memory_key(process) > _memory_key(known):
                by_pid[process.pid] = process
        return tuple(sorted(by_pid.values(), key=lambda p: (-_memory_key(p), p.pid)))

    def _running(self, nvml: Any, handle: Any, kind: str) -> list[Any]:
        # pynvml's unversioned call is the _v3 one, which drivers before R510 lack; those still have _v2.
        if kind not in self._processes_v2:
            not_found = nvml.NVMLError_FunctionNotFound
            missing = (not_found, getattr(nvml, "NVMLLibraryMismatchError", not_found))
            try:
                return getattr(nvml, f"nvmlDeviceGet{kind}RunningProcesses")(handle)
            except missing:
                self._processes_v2.add(kind)
        return getattr(nvml, f"nvmlDeviceGet{kind}RunningProcesses_v2")(handle)

    def _throttle_mask(self, nvml: Any, handle: Any) -> int:
        # "Clocks event reasons" is the new name (drivers >= 535); older drivers only have the throttle call.
        events = None if self._event_reasons_missing else getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if events is not None:
            try:
                return events(handle)
            except nvml.NVMLError_FunctionNotFound:
                self._event_reasons_missing = True
        return nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)

    def _lost(self, index: int, name: str | None, uuid: str | None, error: Exception) -> DeviceSample:
        return DeviceSample(index, name, uuid, status="lost", error=lost_message(index, error))

    def _log_once(self, index: int, label: str, error: Exception) -> None:
        # Debug level: a kernel's default logging would otherwise print red text into the notebook every second.
        key = (index, label, str(error))
        if key not in self._logged:
            self._logged.add(key)
            logger.debug("NVML could not read %s of GPU %d: %s", label, index, error)
