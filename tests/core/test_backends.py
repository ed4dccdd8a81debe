"""The Sample data model, the simulated scenarios and backend selection."""

from __future__ import annotations

import itertools
import json
import time

import pytest

from jupyter_gpu.backends import (
    BACKEND_ENV,
    SCENARIOS,
    BackendSpecError,
    NvmlBackend,
    SimulatedBackend,
    select_backend,
)
from jupyter_gpu.metrics import PERFORMANCE_THROTTLES, DeviceSample, Sample, throttle_reason_names

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


def test_every_scenario_round_trips_through_json():
    for name in SCENARIOS:
        sample = SimulatedBackend(name, clock=FakeClock()).read()
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
             "power_w": (75, 90), "sm_clock_mhz": (345, 345)},
    "h200-busy": {"utilization_gpu": (95, 100), "memory_used": (59 * GIB, 61 * GIB), "temperature_c": (60, 70),
                  "power_w": (600, 690), "sm_clock_mhz": (1950, 1980)},
    "h200-hot": {"utilization_gpu": (95, 100), "memory_used": (59 * GIB, 61 * GIB), "temperature_c": (87, 90),
                 "power_w": (450, 690), "sm_clock_mhz": (1000, 1500)},
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
    for field in ("utilization_gpu", "memory_used", "temperature_c", "power_w"):
        assert len({getattr(d, field) for d in devices}) >= 3, field


def test_simulated_values_are_deterministic_from_the_clock():
    first = [s.devices for s in readings("h200", seconds=20, step=0.7)]
    second = [s.devices for s in readings("h200", seconds=20, step=0.7)]
    assert first == second


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
    assert {"h200", "h200-busy", "h200-hot", "nodriver"} <= set(SCENARIOS)
    assert all(text.endswith(".") for text in SCENARIOS.values())


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
