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

from jupyter_gpu.metrics.backends.nvml import NvmlBackend, lost_message, mig_profile
from jupyter_gpu.metrics.sample import GpuProcess, MigInstance

MIB = 1024**2
NOT_APPLICABLE = 0xFFFFFFFF  # NVML's gpuInstanceId for a process outside any MIG instance


def proc(pid: int, memory: int | None, instance: int = NOT_APPLICABLE) -> SimpleNamespace:
    """A process entry as pynvml's _v3 call returns it (usedGpuMemory None where NVML has no figure)."""
    return SimpleNamespace(pid=pid, usedGpuMemory=memory, gpuInstanceId=instance, computeInstanceId=NOT_APPLICABLE)


class FakeGpu:
    def __init__(self, name: str | bytes = "NVIDIA H200", uuid: str | bytes = "GPU-aaaa", **errors: int) -> None:
        self.name = name
        self.uuid = uuid
        self.errors = errors  # call label -> NVML error code to raise
        self.lost = False
        self.compute_mode = pynvml.NVML_COMPUTEMODE_DEFAULT
        self.utilization = SimpleNamespace(gpu=97, memory=41)
        self.memory = SimpleNamespace(used=61_440 * MIB, total=143_771 * MIB, free=82_331 * MIB)
        self.temperature = 66
        self.power_mw = 645_123
        self.power_limit_mw = 700_000
        self.sm_clock = 1980
        self.reasons = 0x1 | 0x20  # gpu_idle + sw_thermal_slowdown
        self.pcie_kb = {pynvml.NVML_PCIE_UTIL_TX_BYTES: 1_250, pynvml.NVML_PCIE_UTIL_RX_BYTES: 3_500_000}
        self.mig_mode = [pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_DISABLE]  # current, pending
        self.mig_slots: list[FakeMig | None] = []  # None: an empty slot (NVML answers Not Found)
        self.compute = [proc(4242, 60_000 * MIB)]
        self.graphics: list[SimpleNamespace] = []

    def answer(self, label: str, value: object) -> object:
        if self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if label in self.errors:
            raise pynvml.NVMLError(self.errors[label])
        return value


class FakeMig(FakeGpu):
    """A MIG device handle: answers name, UUID, memory and GPU instance id; lost when its parent is."""

    def __init__(self, parent: FakeGpu, profile: str, uuid: str, gpu_instance_id: int, used_mib: int,
                 total_mib: int, **errors: int) -> None:
        super().__init__(name=f"NVIDIA A100-SXM4-80GB MIG {profile}", uuid=uuid, **errors)
        self.parent = parent
        self.gpu_instance_id = gpu_instance_id
        self.memory = SimpleNamespace(used=used_mib * MIB, total=total_mib * MIB, free=(total_mib - used_mib) * MIB)

    def answer(self, label: str, value: object) -> object:
        if self.parent.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return super().answer(label, value)


def a100_with_mig(**errors: int) -> FakeGpu:
    """An A100 in MIG mode with a 4g.40gb and a 3g.40gb slice, and an empty slot between them."""
    gpu = FakeGpu(name="NVIDIA A100-SXM4-80GB", uuid="GPU-a100", utilization=pynvml.NVML_ERROR_NOT_SUPPORTED,
                  **errors)
    gpu.mig_mode = [pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE]
    gpu.mig_slots = [
        FakeMig(gpu, "4g.40gb", "MIG-aaaa", 1, 20_000, 40_192),
        None,
        FakeMig(gpu, "3g.40gb", b"MIG-bbbb", 2, 5, 40_192),
        None, None, None, None,
    ]
    gpu.compute = [proc(7, 19_000 * MIB, 1), proc(8, 3 * MIB, 2)]
    return gpu


class FakeNvml:
    """The slice of the pynvml module that NvmlBackend uses, driving FakeGpu objects."""

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_GpuIsLost = pynvml.NVMLError_GpuIsLost
    NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound
    NVMLError_NotFound = pynvml.NVMLError_NotFound
    NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_PCIE_UTIL_TX_BYTES = pynvml.NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = pynvml.NVML_PCIE_UTIL_RX_BYTES
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE

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

    def nvmlDeviceGetComputeMode(self, gpu: FakeGpu) -> object:
        return gpu.answer("compute_mode", gpu.compute_mode)

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

    def nvmlDeviceGetPcieThroughput(self, gpu: FakeGpu, counter: int) -> object:
        label = {pynvml.NVML_PCIE_UTIL_TX_BYTES: "pcie_tx", pynvml.NVML_PCIE_UTIL_RX_BYTES: "pcie_rx"}[counter]
        return gpu.answer(label, gpu.pcie_kb[counter])

    def nvmlDeviceGetMigMode(self, gpu: FakeGpu) -> object:
        return gpu.answer("mig_mode", list(gpu.mig_mode))

    def nvmlDeviceGetMaxMigDeviceCount(self, gpu: FakeGpu) -> object:
        return gpu.answer("mig_count", len(gpu.mig_slots))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, gpu: FakeGpu, index: int) -> object:
        mig = gpu.answer(f"mig_handle_{index}", gpu.mig_slots[index])
        if mig is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return mig

    def nvmlDeviceGetGpuInstanceId(self, mig: FakeMig) -> object:
        return mig.answer("gpu_instance_id", mig.gpu_instance_id)

    def nvmlDeviceGetComputeRunningProcesses(self, gpu: FakeGpu) -> object:
        return gpu.answer("compute", list(gpu.compute))

    def nvmlDeviceGetGraphicsRunningProcesses(self, gpu: FakeGpu) -> object:
        return gpu.answer("graphics", list(gpu.graphics))


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
        "from jupyter_gpu.metrics.backends.select import select_backend\n"
        "import jupyter_gpu.metrics.sampler\n"
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
        "pcie_tx_bytes_per_s": 1_250 * 1024.0,
        "pcie_rx_bytes_per_s": 3_500_000 * 1024.0,
        "mig_enabled": False,
        "mig_instances": [],
        "processes": [{"pid": 4242, "memory_used": 60_000 * MIB, "gpu_instance_id": None}],
        "torch_allocated": None,
        "torch_reserved": None,
        "compute_mode": "default",
        "throttled": True,
    }
    assert nvml.event_reason_calls == 1


def test_the_compute_mode_is_named_as_nvml_h_names_it():
    gpu = FakeGpu()
    gpu.compute_mode = pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    (device,) = NvmlBackend(FakeNvml(gpu)).read().devices
    assert device.compute_mode == "exclusive_process"
    gpu.compute_mode = pynvml.NVML_COMPUTEMODE_PROHIBITED
    assert NvmlBackend(FakeNvml(gpu)).read().devices[0].compute_mode == "prohibited"


@pytest.mark.parametrize("label, fields", [
    ("power", {"power_w"}),
    ("utilization", {"utilization_gpu", "utilization_memory"}),
    ("memory", {"memory_used", "memory_total"}),
    ("event_reasons", {"throttle_reasons"}),
    ("pcie_tx", {"pcie_tx_bytes_per_s"}),
    ("pcie_rx", {"pcie_rx_bytes_per_s"}),
    ("mig_mode", {"mig_enabled"}),
    ("compute", {"processes"}),
    ("compute_mode", {"compute_mode"}),
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


def test_pcie_throughput_is_converted_from_kb_to_bytes_per_second():
    gpu = FakeGpu()
    gpu.pcie_kb = {pynvml.NVML_PCIE_UTIL_TX_BYTES: 0, pynvml.NVML_PCIE_UTIL_RX_BYTES: 55_000_000}
    (device,) = NvmlBackend(FakeNvml(gpu)).read().devices
    assert device.pcie_tx_bytes_per_s == 0.0  # a real idle link, not a missing value
    assert device.pcie_rx_bytes_per_s == 55_000_000 * 1024 and isinstance(device.pcie_rx_bytes_per_s, float)


def test_pcie_throughput_is_re_read_only_every_few_seconds():
    # Each PCIe call may wait NVML's 20 ms counting window: the 0.1 s sampler must not pay it every read.
    from jupyter_gpu.metrics.backends.nvml import PCIE_REFRESH_S

    clock = FakeClock()
    gpu = FakeGpu()
    gpu.pcie_kb = {pynvml.NVML_PCIE_UTIL_TX_BYTES: 10, pynvml.NVML_PCIE_UTIL_RX_BYTES: 20}
    backend = NvmlBackend(FakeNvml(gpu), clock=clock)
    assert backend.read().devices[0].pcie_rx_bytes_per_s == 20 * 1024
    gpu.pcie_kb = {pynvml.NVML_PCIE_UTIL_TX_BYTES: 30, pynvml.NVML_PCIE_UTIL_RX_BYTES: 40}
    clock.now += PCIE_REFRESH_S / 2
    assert backend.read().devices[0].pcie_rx_bytes_per_s == 20 * 1024, "the cached figure until it is due"
    clock.now += PCIE_REFRESH_S / 2
    assert backend.read().devices[0].pcie_rx_bytes_per_s == 40 * 1024


def test_mig_disabled_is_false_with_no_instances():
    (device,) = NvmlBackend(FakeNvml(FakeGpu())).read().devices
    assert (device.mig_enabled, device.mig_instances) == (False, ())


def test_a_gpu_without_mig_is_none_not_false():
    nvml = FakeNvml(FakeGpu(mig_mode=pynvml.NVML_ERROR_NOT_SUPPORTED))
    (device,) = NvmlBackend(nvml).read().devices
    assert (device.mig_enabled, device.mig_instances, device.status) == (None, (), "ok")
    assert device.memory_used == 61_440 * MIB


def test_only_the_current_mig_mode_counts_not_the_pending_one():
    gpu = FakeGpu()
    gpu.mig_mode = [pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_ENABLE]  # enabled after the next reset
    gpu.mig_slots = [FakeMig(gpu, "7g.80gb", "MIG-cccc", 0, 1, 81_000)]
    (device,) = NvmlBackend(FakeNvml(gpu)).read().devices
    assert (device.mig_enabled, device.mig_instances) == (False, ())


def test_mig_slices_are_listed_and_empty_slots_skipped():
    nvml = FakeNvml(a100_with_mig())
    (device,) = NvmlBackend(nvml).read().devices
    assert device.status == "ok" and device.mig_enabled is True
    assert device.utilization_gpu is None and device.utilization_memory is None  # NVML: not supported with MIG on
    assert device.mig_instances == (
        MigInstance(index=0, uuid="MIG-aaaa", profile="4g.40gb", gpu_instance_id=1, memory_used=20_000 * MIB,
                    memory_total=40_192 * MIB),
        MigInstance(index=2, uuid="MIG-bbbb", profile="3g.40gb", gpu_instance_id=2, memory_used=5 * MIB,
                    memory_total=40_192 * MIB),
    )
    assert device.processes == (GpuProcess(7, 19_000 * MIB, 1), GpuProcess(8, 3 * MIB, 2))


def test_a_mig_slice_field_that_fails_is_none_and_the_rest_still_read():
    gpu = a100_with_mig()
    first = gpu.mig_slots[0]
    first.errors = {"name": pynvml.NVML_ERROR_NO_PERMISSION, "memory": pynvml.NVML_ERROR_NOT_SUPPORTED}
    gpu.mig_slots[2].errors = {"gpu_instance_id": pynvml.NVML_ERROR_UNKNOWN, "uuid": pynvml.NVML_ERROR_UNKNOWN}
    (device,) = NvmlBackend(FakeNvml(gpu)).read().devices
    one, three = device.mig_instances
    assert (one.uuid, one.profile, one.gpu_instance_id, one.memory_used, one.memory_total) == (
        "MIG-aaaa", None, 1, None, None)
    assert (three.uuid, three.profile, three.gpu_instance_id, three.memory_total) == (
        None, "3g.40gb", None, 40_192 * MIB)
    assert device.status == "ok" and device.memory_total == 143_771 * MIB


def test_mig_slots_that_cannot_be_counted_or_opened_are_left_out():
    uncountable = a100_with_mig(mig_count=pynvml.NVML_ERROR_NO_PERMISSION)
    (device,) = NvmlBackend(FakeNvml(uncountable)).read().devices
    assert (device.mig_enabled, device.mig_instances, device.status) == (True, (), "ok")
    unopenable = a100_with_mig(mig_handle_0=pynvml.NVML_ERROR_NO_PERMISSION)
    (device,) = NvmlBackend(FakeNvml(unopenable)).read().devices
    assert [m.uuid for m in device.mig_instances] == ["MIG-bbbb"]


def test_processes_merge_both_lists_and_sort_by_memory():
    gpu = FakeGpu()
    gpu.compute = [
        proc(300, None),  # NVML has no figure for it (pynvml turns NVML_VALUE_NOT_AVAILABLE into None)
        proc(100, 2 * MIB),
        proc(200, 50 * MIB),
        proc(400, 0xFFFFFFFFFFFFFFFF),  # the raw sentinel, should a binding pass it through
        proc(150, 2 * MIB),
    ]
    gpu.graphics = [proc(200, 80 * MIB), proc(100, 1 * MIB), proc(500, 0)]
    (device,) = NvmlBackend(FakeNvml(gpu)).read().devices
    assert device.processes == (
        GpuProcess(200, 80 * MIB),  # in both lists: the larger figure, not the sum
        GpuProcess(100, 2 * MIB),
        GpuProcess(150, 2 * MIB),
        GpuProcess(500, 0),
        GpuProcess(300, None),
        GpuProcess(400, None),
    )
    assert all(p.gpu_instance_id is None for p in device.processes)  # 0xFFFFFFFF: not in a MIG instance


def test_no_process_is_an_empty_tuple_and_an_unlistable_one_is_none():
    gpu = FakeGpu()
    gpu.compute = []
    assert NvmlBackend(FakeNvml(gpu)).read().devices[0].processes == ()
    denied = FakeGpu(compute=pynvml.NVML_ERROR_NO_PERMISSION)
    denied.graphics = [proc(9, MIB)]
    (device,) = NvmlBackend(FakeNvml(denied)).read().devices
    assert device.processes is None and device.status == "ok" and device.power_w == 645.123
    # The graphics list alone failing still leaves the compute processes.
    no_graphics = FakeGpu(graphics=pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert NvmlBackend(FakeNvml(no_graphics)).read().devices[0].processes == (GpuProcess(4242, 60_000 * MIB),)


def test_process_entries_without_a_gpu_instance_field_read_as_none():
    gpu = FakeGpu()
    gpu.compute = [SimpleNamespace(pid=11, usedGpuMemory=5 * MIB)]  # the v1 struct
    assert NvmlBackend(FakeNvml(gpu)).read().devices[0].processes == (GpuProcess(11, 5 * MIB, None),)


def test_process_lists_fall_back_to_v2_on_a_driver_without_v3():
    nvml = FakeNvml(FakeGpu())
    calls = []

    def v3_missing(gpu: FakeGpu) -> object:
        calls.append("v3")
        raise pynvml.NVMLLibraryMismatchError("Unversioned function called and the pyNVML version does not match")

    def v2(gpu: FakeGpu) -> object:
        calls.append("v2")
        return [proc(77, 3 * MIB)]

    nvml.nvmlDeviceGetComputeRunningProcesses = v3_missing
    nvml.nvmlDeviceGetComputeRunningProcesses_v2 = v2
    nvml.nvmlDeviceGetGraphicsRunningProcesses_v2 = lambda gpu: []
    backend = NvmlBackend(nvml)
    assert backend.read().devices[0].processes == (GpuProcess(77, 3 * MIB),)
    assert backend.read().devices[0].processes == (GpuProcess(77, 3 * MIB),)
    assert calls == ["v3", "v2", "v2"]  # v3 is not asked again once known missing


@pytest.mark.parametrize("label", ["compute", "graphics", "pcie_rx", "mig_count", "gpu_instance_id"])
def test_a_gpu_lost_during_the_new_reads_is_lost_not_an_exception(label):
    gpu = a100_with_mig()
    target = gpu.mig_slots[2] if label == "gpu_instance_id" else gpu
    target.errors = {**target.errors, label: pynvml.NVML_ERROR_GPU_IS_LOST}
    other = FakeGpu(uuid="GPU-1111")
    lost, alive = NvmlBackend(FakeNvml(gpu, other)).read().devices
    assert (lost.status, lost.name, lost.uuid) == ("lost", "NVIDIA A100-SXM4-80GB", "GPU-a100")
    assert lost.error == lost_message(0, pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST))
    assert (lost.processes, lost.mig_enabled, lost.mig_instances, lost.pcie_tx_bytes_per_s) == (None, None, (), None)
    assert alive.status == "ok" and alive.processes == (GpuProcess(4242, 60_000 * MIB),)


def test_a_gpu_lost_in_the_middle_of_the_process_read():
    gpu = FakeGpu()
    nvml = FakeNvml(gpu)
    backend = NvmlBackend(nvml)
    assert backend.read().devices[0].status == "ok"

    def falls_off(handle: FakeGpu) -> object:
        gpu.lost = True  # the GPU drops between the compute and the graphics list
        return [proc(1, MIB)]

    nvml.nvmlDeviceGetComputeRunningProcesses = falls_off
    (device,) = backend.read().devices
    assert device.status == "lost" and "GPU is lost" in device.error and device.processes is None
    assert (device.name, device.uuid) == ("NVIDIA H200", "GPU-aaaa")


@pytest.mark.parametrize("name, profile", [
    ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "1g.10gb"),
    ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "3g.40gb"),
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb+me", "1g.5gb+me"),
    ("MIG 7g.80gb", "7g.80gb"),
    ("Some future name 2g.20gb", "2g.20gb"),
    ("NVIDIA A100-SXM4-80GB", None),
    ("", None),
    (None, None),
])
def test_mig_profile_is_the_end_of_the_mig_device_name(name, profile):
    assert mig_profile(name) == profile


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
        for rate in (device.pcie_tx_bytes_per_s, device.pcie_rx_bytes_per_s):
            assert rate is None or 0 <= rate < 1e12  # bytes/s: PCIe 6 x16 is ~1.3e11
        assert device.mig_enabled in (None, False, True)
        assert bool(device.mig_instances) <= bool(device.mig_enabled)
        for mig in device.mig_instances:
            assert mig.uuid is None or mig.uuid.startswith("MIG-")
            assert mig.profile is None or "g." in mig.profile
        assert device.processes is None or all(p.pid > 0 for p in device.processes)
        assert (device.torch_allocated, device.torch_reserved) == (None, None)
