"""Metrics from the real NVIDIA driver through NVML (`pynvml` from the nvidia-ml-py package).

This is the only module that calls NVML for metrics. Every driver problem becomes a status in the Sample:
no library or driver -> `no_driver`, a GPU that fell off the bus -> that device `lost`, a field the GPU does
not support -> `None`. A monitoring panel must never take the kernel or the server down with it.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from jupyter_gpu.metrics import DeviceSample, Sample, throttle_reason_names

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


def init_failure_message(error: str, code: int | None = None) -> str:
    """One sentence saying why NVML could not start, quoting NVML's own words."""
    hint = _INIT_HINTS.get(code) if code is not None else None
    return f"NVML could not start: {error}" + (f" ({hint})." if hint else ".")


def _text(value: Any) -> str:
    # Older pynvml releases return bytes for names and UUIDs.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


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
        )

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
        message = f"NVML reports GPU {index} is lost ({error}): it fell off the bus and needs a reset or a reboot."
        return DeviceSample(index, name, uuid, status="lost", error=message)

    def _log_once(self, index: int, label: str, error: Exception) -> None:
        # Debug level: a kernel's default logging would otherwise print red text into the notebook every second.
        key = (index, label, str(error))
        if key not in self._logged:
            self._logged.add(key)
            logger.debug("NVML could not read %s of GPU %d: %s", label, index, error)
