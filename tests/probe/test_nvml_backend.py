"""NvmlBackend against the real pynvml (this machine has no driver) and against a scripted fake NVML.

The fake stands in only for the driver calls; it raises pynvml's real exception classes, so the backend's
error handling is tested against the same types a real driver produces.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pynvml
import pytest

from jupyter_gpu.backends.nvml import NvmlBackend

MIB = 1024**2


class FakeGpu:
    def __init__(self, name: str | bytes = "NVIDIA H200", uuid: str | bytes = "GPU-aaaa", **errors: int) -> None:
        self.name = name
        self.uuid = uuid
        self.errors = errors  # call label -> NVML error code to raise
        self.lost = False
        self.utilization = SimpleNamespace(gpu=97, memory=41)
        self.memory = SimpleNamespace(used=61_440 * MIB, total=143_771 * MIB, free=82_331 * MIB)
        self.temperature = 66
        self.power_mw = 645_123
        self.power_limit_mw = 700_000
        self.sm_clock = 1980
        self.reasons = 0x1 | 0x20  # gpu_idle + sw_thermal_slowdown

    def answer(self, label: str, value: object) -> object:
        if self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if label in self.errors:
            raise pynvml.NVMLError(self.errors[label])
        return value


class FakeNvml:
    """The slice of the pynvml module that NvmlBackend uses, driving FakeGpu objects."""

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_GpuIsLost = pynvml.NVMLError_GpuIsLost
    NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound
    NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM

    def __init__(self, *gpus: FakeGpu, init_error: int | None = None, event_reasons: bool = True) -> None:
        self.gpus = list(gpus)
        self.init_error = init_error
        self.init_calls = 0
        self.shutdown_calls = 0
        self.count_error: int | None = None
        self.event_reason_calls = 0
        if event_reasons:
            self.nvmlDeviceGetCurrentClocksEventReasons = self._event_reasons

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlDeviceGetCount(self) -> int:
        if self.count_error is not None:
            raise pynvml.NVMLError(self.count_error)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        gpu = self.gpus[index]
        return gpu.answer("handle", gpu)

    def nvmlDeviceGetName(self, gpu: FakeGpu) -> object:
        return gpu.answer("name", gpu.name)

    def nvmlDeviceGetUUID(self, gpu: FakeGpu) -> object:
        return gpu.answer("uuid", gpu.uuid)

    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> object:
        return gpu.answer("utilization", gpu.utilization)

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu) -> object:
        return gpu.answer("memory", gpu.memory)

    def nvmlDeviceGetTemperature(self, gpu: FakeGpu, sensor: int) -> object:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return gpu.answer("temperature", gpu.temperature)

    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu) -> object:
        return gpu.answer("power", gpu.power_mw)

    def nvmlDeviceGetEnforcedPowerLimit(self, gpu: FakeGpu) -> object:
        return gpu.answer("power_limit", gpu.power_limit_mw)

    def nvmlDeviceGetClockInfo(self, gpu: FakeGpu, clock: int) -> object:
        assert clock == pynvml.NVML_CLOCK_SM
        return gpu.answer("sm_clock", gpu.sm_clock)

    def _event_reasons(self, gpu: FakeGpu) -> object:
        self.event_reason_calls += 1
        return gpu.answer("event_reasons", gpu.reasons)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, gpu: FakeGpu) -> object:
        return gpu.answer("throttle_reasons", gpu.reasons)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def nvml_works_here() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


# -- the real pynvml on this machine -------------------------------------------------------------------


@pytest.mark.skipif(nvml_works_here(), reason="this machine has a working NVIDIA driver")
def test_real_pynvml_without_a_driver_is_a_no_driver_sample_not_an_exception():
    backend = NvmlBackend()
    try:
        sample = backend.read()
        again = backend.read()
    finally:
        backend.close()
    assert (sample.status, sample.backend, sample.simulated, sample.devices) == ("no_driver", "nvml", False, ())
    assert "NVML Shared Library Not Found" in sample.message
    assert "driver" in sample.message and sample.message.endswith(".")
    assert again.status == "no_driver" and again.timestamp >= sample.timestamp


def test_pynvml_is_imported_on_the_first_read_not_at_import_or_construction():
    code = (
        "import sys\n"
        "from jupyter_gpu.backends import select_backend\n"
        "import jupyter_gpu.sampler\n"
        "backend = select_backend('nvml')\n"
        "assert 'pynvml' not in sys.modules, 'imported too early'\n"
        "backend.read()\n"
        "assert 'pynvml' in sys.modules\n"
        "assert 'torch' not in sys.modules and 'IPython' not in sys.modules, 'heavy import'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_missing_pynvml_is_no_driver_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    sample = NvmlBackend().read()
    assert sample.status == "no_driver"
    assert "pip install nvidia-ml-py" in sample.message


# -- a scripted NVML -----------------------------------------------------------------------------------


def test_a_device_that_supports_everything():
    nvml = FakeNvml(FakeGpu(name=b"NVIDIA H200", uuid=b"GPU-5f3b"))
    sample = NvmlBackend(nvml).read()
    assert sample.status == "ok" and sample.message is None
    (device,) = sample.devices
    assert device.to_dict() == {
        "index": 0,
        "name": "NVIDIA H200",
        "uuid": "GPU-5f3b",
        "status": "ok",
        "error": None,
        "utilization_gpu": 97.0,
        "utilization_memory": 41.0,
        "memory_used": 61_440 * MIB,
        "memory_total": 143_771 * MIB,
        "temperature_c": 66.0,
        "power_w": 645.123,
        "power_limit_w": 700.0,
        "sm_clock_mhz": 1980.0,
        "throttle_reasons": ["gpu_idle", "sw_thermal_slowdown"],
        "throttled": True,
    }
    assert nvml.event_reason_calls == 1


@pytest.mark.parametrize("label, fields", [
    ("power", {"power_w"}),
    ("utilization", {"utilization_gpu", "utilization_memory"}),
    ("memory", {"memory_used", "memory_total"}),
    ("event_reasons", {"throttle_reasons"}),
])
def test_an_unsupported_field_is_none_and_the_others_still_read(label, fields):
    other = pynvml.NVML_ERROR_NO_PERMISSION if label == "event_reasons" else pynvml.NVML_ERROR_NOT_SUPPORTED
    (device,) = NvmlBackend(FakeNvml(FakeGpu(**{label: other}))).read().devices
    values = device.to_dict()
    assert device.status == "ok"
    assert {k for k in fields if values[k] is None} == fields
    assert values["temperature_c"] == 66.0 and values["sm_clock_mhz"] == 1980.0
    if label != "power":
        assert values["power_w"] == 645.123
    if label == "event_reasons":
        assert device.throttled is False


def test_clocks_event_reasons_fall_back_to_the_old_throttle_call():
    without = FakeNvml(FakeGpu(), event_reasons=False)
    assert NvmlBackend(without).read().devices[0].throttle_reasons == ("gpu_idle", "sw_thermal_slowdown")
    # A new binding over an old driver: the function exists in pynvml but not in libnvidia-ml.
    old_driver = FakeNvml(FakeGpu(event_reasons=pynvml.NVML_ERROR_FUNCTION_NOT_FOUND))
    old_driver.gpus[0].reasons = 0x4
    backend = NvmlBackend(old_driver)
    assert backend.read().devices[0].throttle_reasons == ("sw_power_cap",)
    backend.read()
    assert old_driver.event_reason_calls == 1  # not asked again once known missing


def test_a_gpu_lost_mid_run_is_marked_lost_while_the_other_gpus_still_read():
    nvml = FakeNvml(FakeGpu(uuid="GPU-0000"), FakeGpu(uuid="GPU-1111"))
    backend = NvmlBackend(nvml)
    first = backend.read()
    assert [d.status for d in first.devices] == ["ok", "ok"]

    nvml.gpus[0].lost = True
    second = backend.read()
    lost, alive = second.devices
    assert second.status == "ok"
    assert (lost.status, lost.index, lost.uuid, lost.name) == ("lost", 0, "GPU-0000", "NVIDIA H200")
    assert "GPU is lost" in lost.error and lost.memory_used is None and lost.utilization_gpu is None
    assert (alive.status, alive.uuid, alive.memory_used) == ("ok", "GPU-1111", 61_440 * MIB)


def test_a_gpu_lost_between_fields_is_lost_not_half_read():
    nvml = FakeNvml(FakeGpu(temperature=pynvml.NVML_ERROR_GPU_IS_LOST))
    (device,) = NvmlBackend(nvml).read().devices
    assert device.status == "lost" and device.power_w is None and device.name == "NVIDIA H200"


def test_a_device_whose_handle_fails_is_an_error_device():
    nvml = FakeNvml(FakeGpu(handle=pynvml.NVML_ERROR_UNKNOWN), FakeGpu(uuid="GPU-1111"))
    bad, good = NvmlBackend(nvml).read().devices
    assert bad.status == "error" and "Unknown Error" in bad.error and bad.error.startswith("NVML could not open GPU 0")
    assert good.status == "ok"


def test_a_failing_device_count_is_an_error_sample():
    nvml = FakeNvml(FakeGpu())
    nvml.count_error = pynvml.NVML_ERROR_UNKNOWN
    sample = NvmlBackend(nvml).read()
    assert sample.status == "error" and "Unknown Error" in sample.message and sample.devices == ()


def test_failed_init_is_retried_at_most_every_30_seconds():
    clock = FakeClock()
    nvml = FakeNvml(FakeGpu(), init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    backend = NvmlBackend(nvml, clock=clock)
    first = backend.read()
    assert first.status == "no_driver"
    assert "Driver Not Loaded" in first.message and "kernel driver is not loaded" in first.message
    clock.now += 29
    assert backend.read().status == "no_driver"
    assert nvml.init_calls == 1

    nvml.init_error = None  # the driver got loaded
    clock.now += 1.5
    sample = backend.read()
    assert nvml.init_calls == 2
    assert sample.status == "ok" and len(sample.devices) == 1


def test_init_once_shutdown_once_and_reads_from_many_threads_share_one_init():
    nvml = FakeNvml(FakeGpu())
    real_init = nvml.nvmlInit

    def slow_init() -> None:
        time.sleep(0.05)  # widen the window in which an unguarded second thread would also init
        real_init()

    nvml.nvmlInit = slow_init
    backend = NvmlBackend(nvml)
    results = []
    threads = [threading.Thread(target=lambda: results.append(backend.read())) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert nvml.init_calls == 1
    assert [s.status for s in results] == ["ok"] * 8
    backend.close()
    backend.close()
    assert nvml.shutdown_calls == 1


def test_close_before_any_read_touches_nothing():
    nvml = FakeNvml(FakeGpu())
    NvmlBackend(nvml).close()
    assert (nvml.init_calls, nvml.shutdown_calls) == (0, 0)


@pytest.mark.gpu
def test_real_gpu_reads_sane_values():
    backend = NvmlBackend()
    try:
        sample = backend.read()
    finally:
        backend.close()
    print(sample.to_dict())
    assert sample.status == "ok" and sample.devices
    for device in sample.devices:
        assert device.status == "ok", device.error
        assert device.name and device.uuid and device.uuid.startswith(("GPU-", "MIG-"))
        assert 0 < device.memory_used <= device.memory_total
        if device.utilization_gpu is not None:
            assert 0 <= device.utilization_gpu <= 100
        if device.power_w is not None:
            assert 0 < device.power_w <= (device.power_limit_w or 2000) * 1.2
        assert device.throttle_reasons is not None
