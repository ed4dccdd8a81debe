"""The Sample data model, the simulated scenarios and backend selection."""

from __future__ import annotations

import itertools
import json
import time

import pytest

from jupyter_gpu.metrics.backends.base import BACKEND_ENV, BackendSpecError
from jupyter_gpu.metrics.backends.nvml import NvmlBackend, lost_message
from jupyter_gpu.metrics.backends.select import select_backend
from jupyter_gpu.metrics.backends.simulated import LOST_AFTER_S, SCENARIOS, SimulatedBackend
from jupyter_gpu.metrics.sample import PERFORMANCE_THROTTLES, DeviceSample, Sample, throttle_reason_names

KIB = 1024
MIB = 1024**2
GIB = 1024**3


class FakeClock:
    def __init__(self, now: float = 500.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# -- metrics -------------------------------------------------------------------------------------------


def test_throttle_reason_names_follow_nvml_bits():
    assert throttle_reason_names(0) == ()
    assert throttle_reason_names(0x1) == ("gpu_idle",)
    assert throttle_reason_names(0x60) == ("sw_thermal_slowdown", "hw_thermal_slowdown")
    assert throttle_reason_names(0x1FF) == (
        "gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
        "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "display_clock_setting",
    )
    assert throttle_reason_names(0x800 | 0x4) == ("sw_power_cap", "unknown_0x800")
    with pytest.raises(ValueError):
        throttle_reason_names(-1)


@pytest.mark.parametrize("reasons, throttled", [
    (None, False),
    ((), False),
    (("gpu_idle",), False),
    (("applications_clocks_setting", "sync_boost", "display_clock_setting"), False),
    (("sw_power_cap",), True),
    (("gpu_idle", "hw_slowdown"), True),
    (("hw_power_brake_slowdown",), True),
])
def test_throttled_means_a_reason_that_costs_speed(reasons, throttled):
    assert DeviceSample(0, "g", "u", throttle_reasons=reasons).throttled is throttled


def test_performance_throttles_are_the_five_slowdowns():
    assert {
        "sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown",
    } == PERFORMANCE_THROTTLES


def test_sample_round_trips_through_json_and_missing_stays_none():
    sample = Sample(
        timestamp=1_700_000_000.25,
        backend="nvml",
        simulated=False,
        devices=(
            DeviceSample(0, "NVIDIA H200", "GPU-1", utilization_gpu=50.0, memory_used=3 * GIB,
                         memory_total=141 * GIB, throttle_reasons=("sw_power_cap",)),
            DeviceSample(1, "NVIDIA H200", "GPU-2", status="lost", error="NVML reports GPU 1 is lost."),
        ),
    )
    data = json.loads(json.dumps(sample.to_dict()))
    assert Sample.from_dict(data) == sample
    first, second = data["devices"]
    assert first["power_w"] is None and first["temperature_c"] is None  # never a made-up 0
    assert first["throttle_reasons"] == ["sw_power_cap"] and first["throttled"] is True
    assert second["throttle_reasons"] is None and second["status"] == "lost"


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_scenario_is_simulated_and_round_trips_through_json(name):
    clock = FakeClock()
    backend = SimulatedBackend(name, clock=clock)
    for seconds in (0.0, 7.3, LOST_AFTER_S + 1):  # the last one is past the `lost` scenario's switch
        clock.now = 500.0 + seconds
        sample = backend.read()
        assert sample.simulated is True and sample.backend == f"simulated:{name}"
        assert Sample.from_dict(json.loads(json.dumps(sample.to_dict()))) == sample


def test_from_dict_ignores_keys_a_newer_version_adds():
    data = Sample(1.0, "nvml", False, devices=(DeviceSample(0, "g", "u"),)).to_dict()
    data["schema"] = 9
    data["devices"][0]["fan_percent"] = 40
    assert Sample.from_dict(data).devices[0] == DeviceSample(0, "g", "u")


def test_statuses_are_checked():
    with pytest.raises(ValueError, match="no_driver"):
        Sample(1.0, "nvml", False, status="broken")
    with pytest.raises(ValueError, match="lost"):
        DeviceSample(0, None, None, status="gone")


# -- simulated scenarios -------------------------------------------------------------------------------


def readings(scenario: str, seconds: int = 180, step: float = 1.0) -> list[Sample]:
    clock = FakeClock()
    backend = SimulatedBackend(scenario, clock=clock)
    out = []
    for _ in range(seconds):
        out.append(backend.read())
        clock.now += step
    return out


RANGES = {
    # field: (low, high) per scenario; every read over three minutes must stay inside
    "h200": {"utilization_gpu": (0, 5), "memory_used": (550 * MIB, 650 * MIB), "temperature_c": (30, 35),
             "power_w": (75, 90), "sm_clock_mhz": (345, 345), "pcie_tx_bytes_per_s": (19 * KIB, 401 * KIB),
             "pcie_rx_bytes_per_s": (19 * KIB, 601 * KIB)},
    "h200-busy": {"utilization_gpu": (95, 100), "memory_used": (59 * GIB, 61 * GIB), "temperature_c": (60, 70),
                  "power_w": (600, 690), "sm_clock_mhz": (1950, 1980), "pcie_tx_bytes_per_s": (100e6, 1e9),
                  "pcie_rx_bytes_per_s": (1.9e9, 9.1e9)},
    "h200-hot": {"utilization_gpu": (95, 100), "memory_used": (59 * GIB, 61 * GIB), "temperature_c": (87, 90),
                 "power_w": (450, 690), "sm_clock_mhz": (1000, 1500), "pcie_tx_bytes_per_s": (50e6, 1e9),
                 "pcie_rx_bytes_per_s": (1e9, 8e9)},
}


@pytest.mark.parametrize("scenario", sorted(RANGES))
def test_simulated_values_stay_in_range_and_move(scenario):
    samples = readings(scenario)
    for sample in samples:
        assert (sample.status, sample.simulated, sample.backend) == ("ok", True, f"simulated:{scenario}")
        (device,) = sample.devices
        assert (device.name, device.memory_total, device.power_limit_w) == ("NVIDIA H200", 143771 * MIB, 700.0)
        assert device.uuid.startswith("GPU-")
        for field, (low, high) in RANGES[scenario].items():
            assert low <= getattr(device, field) <= high, (field, getattr(device, field))
    # Two reads a second apart always differ, and every moving field takes several values over 3 minutes.
    devices = [s.devices[0] for s in samples]
    assert all(a != b for a, b in itertools.pairwise(devices))
    for field in ("utilization_gpu", "memory_used", "temperature_c", "power_w", "pcie_tx_bytes_per_s",
                  "pcie_rx_bytes_per_s"):
        assert len({getattr(d, field) for d in devices}) >= 3, field
    for device in devices:
        assert (device.mig_enabled, device.mig_instances) == (False, ())  # an H200 can do MIG; it is off here
        assert device.pcie_tx_bytes_per_s % KIB == 0 and device.pcie_rx_bytes_per_s % KIB == 0  # NVML: whole KB/s
        assert (device.torch_allocated, device.torch_reserved) == (None, None)


def test_idle_h200_has_no_processes_and_busy_ones_have_a_python_holding_the_memory():
    assert all(s.devices[0].processes == () for s in readings("h200", seconds=30))
    for scenario in ("h200-busy", "h200-hot"):
        for sample in readings(scenario, seconds=30):
            device = sample.devices[0]
            (process,) = device.processes
            assert process.pid == 4242 and process.gpu_instance_id is None
            assert 0.95 * device.memory_used < process.memory_used < device.memory_used


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_simulated_values_are_deterministic_from_the_clock(scenario):
    first = [s.devices for s in readings(scenario, seconds=40, step=0.7)]
    second = [s.devices for s in readings(scenario, seconds=40, step=0.7)]
    assert first == second


@pytest.mark.parametrize("scenario", sorted(set(SCENARIOS) - {"nodriver"}))
def test_every_device_of_every_scenario_moves_between_reads(scenario):
    # `lost` only until it is lost: a lost GPU reports nothing that could move.
    samples = readings(scenario, seconds=int(LOST_AFTER_S) if scenario == "lost" else 60)
    for before, after in itertools.pairwise(samples):
        for a, b in zip(before.devices, after.devices, strict=True):
            assert a != b, (scenario, a.index)
            assert (a.index, a.name, a.uuid, a.memory_total) == (b.index, b.name, b.uuid, b.memory_total)


def test_simulated_values_move_on_the_real_clock():
    backend = SimulatedBackend("h200-busy")
    first = backend.read()
    time.sleep(0.12)  # past the 0.1 s step of the sensor jitter
    assert backend.read().devices != first.devices


def test_idle_h200_is_not_throttled():
    for sample in readings("h200"):
        device = sample.devices[0]
        assert set(device.throttle_reasons) <= {"gpu_idle"} and not device.throttled
        assert ("gpu_idle" in device.throttle_reasons) == (device.utilization_gpu == 0)


def test_busy_h200_is_not_throttled_and_hot_h200_is():
    busy = [s.devices[0] for s in readings("h200-busy", seconds=60)]
    hot = [s.devices[0] for s in readings("h200-hot", seconds=60)]
    assert all(d.throttle_reasons == () and not d.throttled for d in busy)
    for device in hot:
        assert {"sw_thermal_slowdown", "hw_thermal_slowdown"} <= set(device.throttle_reasons)
        assert device.throttled
    assert max(d.sm_clock_mhz for d in hot) < min(d.sm_clock_mhz for d in busy)


def test_nodriver_scenario_looks_like_nvml_without_a_library():
    sample = SimulatedBackend("nodriver").read()
    assert (sample.status, sample.devices, sample.simulated) == ("no_driver", (), True)
    assert "NVML Shared Library Not Found" in sample.message


def test_every_scenario_is_described():
    assert {"h200", "h200-busy", "h200-hot", "a100x8-mig", "lost", "nodriver"} <= set(SCENARIOS)
    assert all(text.endswith(".") for text in SCENARIOS.values())
    assert "MIG" in SCENARIOS["a100x8-mig"] and "lost" in SCENARIOS["lost"]


# -- a100x8-mig ----------------------------------------------------------------------------------------

A100_MEMORY_TOTAL = 81920 * MIB


def test_a100x8_has_eight_distinct_a100s():
    samples = readings("a100x8-mig", seconds=180)
    first = samples[0]
    assert (first.status, first.message) == ("ok", None)
    assert [d.index for d in first.devices] == list(range(8))
    uuids = [d.uuid for d in first.devices]
    assert len(set(uuids)) == 8 and all(u.startswith("GPU-") and len(u) == 40 for u in uuids)
    # Stable across runs and machines, so anything keyed on a UUID (a saved layout) keeps working.
    assert uuids[0] == "GPU-acb12897-34e1-50b8-8fcd-2e8a8eb7adc7"
    for sample in samples:
        assert [d.uuid for d in sample.devices] == uuids
        for device in sample.devices:
            assert device.status == "ok" and device.error is None
            assert (device.name, device.memory_total, device.power_limit_w) == (
                "NVIDIA A100-SXM4-80GB", A100_MEMORY_TOTAL, 400.0)
            assert 0 < device.memory_used <= device.memory_total
            assert 25 <= device.temperature_c <= 85 and 0 < device.power_w <= device.power_limit_w
            assert 200 <= device.sm_clock_mhz <= 1410
            assert device.pcie_tx_bytes_per_s >= 0 and device.pcie_rx_bytes_per_s >= 0
            if device.utilization_gpu is not None:
                assert 0 <= device.utilization_gpu <= 100
            assert device.processes is not None
            for process in device.processes:
                assert process.pid > 0 and 0 <= process.memory_used <= device.memory_used
            memories = [p.memory_used for p in device.processes]
            assert memories == sorted(memories, reverse=True)  # the NVML backend's order


def test_a100x8_mig_boards_have_slices_and_no_utilisation():
    for sample in readings("a100x8-mig", seconds=90):
        gpu0, gpu1, *plain = sample.devices
        for board in (gpu0, gpu1):
            assert board.mig_enabled is True
            assert board.utilization_gpu is None and board.utilization_memory is None  # as NVML on a MIG board
            assert all(m.uuid.startswith("MIG-") for m in board.mig_instances)
            assert sum(m.memory_total for m in board.mig_instances) <= board.memory_total
            assert sum(m.memory_used for m in board.mig_instances) <= board.memory_used
            for instance in board.mig_instances:
                assert 0 < instance.memory_used < instance.memory_total
            ids = {m.gpu_instance_id for m in board.mig_instances}
            assert len(ids) == len(board.mig_instances)
            # Every process on a MIG board runs inside one of its instances.
            assert board.processes and {p.gpu_instance_id for p in board.processes} <= ids
        assert [m.profile for m in gpu0.mig_instances] == ["1g.10gb"] * 7
        assert sorted(m.profile for m in gpu1.mig_instances) == ["3g.40gb", "4g.40gb"]
        uuids = [m.uuid for d in (gpu0, gpu1) for m in d.mig_instances]
        assert len(set(uuids)) == 9
        for device in plain:
            assert (device.mig_enabled, device.mig_instances) == (False, ())
            assert device.utilization_gpu is not None
            assert all(p.gpu_instance_id is None for p in device.processes)


def test_a100x8_mig_slices_move_between_reads():
    samples = readings("a100x8-mig", seconds=30)
    slices = [s.devices[0].mig_instances + s.devices[1].mig_instances for s in samples]
    for before, after in itertools.pairwise(slices):
        assert all(a.memory_used != b.memory_used for a, b in zip(before, after, strict=True))
        assert [(a.uuid, a.profile, a.memory_total) for a in before] == [(a.uuid, a.profile, a.memory_total)
                                                                          for a in after]


def test_a100x8_plain_gpus_have_their_workloads():
    for sample in readings("a100x8-mig", seconds=90):
        training = sample.devices[2:4]
        idle, held, capped, inference = sample.devices[4:]
        for device in training:
            assert device.utilization_gpu >= 90 and len(device.processes) == 1
            assert device.processes[0].memory_used > 0.9 * device.memory_used
            assert not device.throttled
        assert idle.utilization_gpu <= 2 and idle.processes == () and idle.memory_used < 10 * MIB
        assert held.utilization_gpu <= 3 and held.memory_used > 0.85 * held.memory_total
        assert len(held.processes) == 1 and held.processes[0].memory_used > 0.99 * (held.memory_used - 8 * MIB)
        assert capped.throttle_reasons == ("sw_power_cap",) and capped.throttled
        assert capped.power_w >= 0.95 * capped.power_limit_w
        assert not any(d.throttled for d in (idle, held, inference))
        assert len(inference.processes) == 2 and 20 <= inference.utilization_gpu <= 60


def test_a100x8_read_is_cheap():
    # The sampler reads it every second and must stay under 1 % of a core: 10 ms. Measured ~0.2 ms.
    backend = SimulatedBackend("a100x8-mig")
    backend.read()
    start = time.perf_counter()
    for _ in range(50):
        backend.read()
    assert (time.perf_counter() - start) / 50 < 0.005


# -- lost ----------------------------------------------------------------------------------------------


def test_lost_scenario_is_busy_then_lost_after_lost_after_s():
    clock = FakeClock()
    backend = SimulatedBackend("lost", clock=clock)
    clock.now += LOST_AFTER_S - 0.01
    (before,) = backend.read().devices
    assert before.status == "ok" and before.utilization_gpu >= 95 and before.processes
    assert (before.name, before.uuid) == ("NVIDIA H200", "GPU-5f3b2c1e-8a4d-4c6b-9e27-1d0a7f6b3c42")

    for seconds in (LOST_AFTER_S, LOST_AFTER_S + 1, LOST_AFTER_S + 3600):
        clock.now = 500.0 + seconds
        sample = backend.read()
        assert (sample.status, sample.message, sample.simulated) == ("ok", None, True)
        (device,) = sample.devices
        assert (device.status, device.index, device.name, device.uuid) == ("lost", 0, before.name, before.uuid)
        # The same sentence the NVML backend writes for NVML_ERROR_GPU_IS_LOST ("GPU is lost").
        assert device.error == lost_message(0, "GPU is lost") and "GPU is lost" in device.error
        assert device.label == "NVIDIA H200"
        assert device == DeviceSample(0, device.name, device.uuid, status="lost", error=device.error)  # all None


def test_unknown_scenario_is_refused():
    with pytest.raises(ValueError, match="h200-busy"):
        SimulatedBackend("h100")


# -- selection -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "", "  ", "nvml", "NVML"])
def test_nvml_is_the_default(value):
    env = {} if value is None else {BACKEND_ENV: value}
    backend = select_backend(env=env)
    assert isinstance(backend, NvmlBackend) and backend.name == "nvml" and backend.simulated is False


def test_simulated_only_when_asked_for():
    backend = select_backend(env={BACKEND_ENV: " simulated:h200-hot "})
    assert isinstance(backend, SimulatedBackend)
    assert (backend.name, backend.simulated) == ("simulated:h200-hot", True)
    # An explicit spec wins over the environment.
    assert select_backend("nvml", env={BACKEND_ENV: "simulated:h200"}).name == "nvml"
    assert select_backend("simulated:nodriver", env={}).name == "simulated:nodriver"


def test_the_environment_is_read_by_default(monkeypatch):
    monkeypatch.setenv(BACKEND_ENV, "simulated:h200")
    assert select_backend().name == "simulated:h200"
    monkeypatch.delenv(BACKEND_ENV)
    assert select_backend().name == "nvml"


@pytest.mark.parametrize("spec, says", [
    ("cuda", "Unknown GPU backend 'cuda'"),
    ("simulated:h100", "Unknown simulated scenario 'h100'"),
    ("simulated", "The simulated backend needs a scenario name"),
    ("simulated:", "The simulated backend needs a scenario name"),
    ("nvml:0", "The 'nvml' backend takes no argument"),
])
def test_bad_specs_name_the_valid_choices(spec, says):
    with pytest.raises(BackendSpecError) as caught:
        select_backend(env={BACKEND_ENV: spec})
    message = str(caught.value)
    assert message.startswith(says)
    assert BACKEND_ENV in message
    assert "'nvml'" in message and all(f"simulated:{name}" in message for name in SCENARIOS)
    assert message.endswith(".") and message.count(". ") == 0  # one sentence


def test_a_bad_explicit_spec_does_not_blame_the_environment():
    with pytest.raises(BackendSpecError) as caught:
        select_backend("simulated:nope", env={})
    assert BACKEND_ENV not in str(caught.value) and "backend spec" in str(caught.value)
    assert isinstance(caught.value, ValueError)
