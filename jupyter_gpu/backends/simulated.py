"""Named, deterministic stand-ins for NVML, for tests and demos on machines without a GPU.

Values are smooth functions of the clock plus a seeded jitter, so two reads a second apart differ (a panel
visibly moves) while a test with a fake clock gets exactly the same numbers every run. Every Sample is
marked `simulated=True` and the backend name says which scenario it is, so no surface can pass it off as
real. A scenario is a function of the seconds since the backend was created, which leaves room for
time-scripted ones (a GPU lost after N seconds).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from jupyter_gpu.backends.nvml import NVML_ERROR_LIBRARY_NOT_FOUND, init_failure_message
from jupyter_gpu.metrics import DeviceSample, Sample, throttle_reason_names

MIB = 1024**2
GIB = 1024**3

H200_NAME = "NVIDIA H200"
H200_UUID = "GPU-5f3b2c1e-8a4d-4c6b-9e27-1d0a7f6b3c42"
H200_MEMORY_TOTAL = 143771 * MIB
H200_POWER_LIMIT_W = 700.0

SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
GPU_IDLE = 0x1


def _wave(t: float, key: str) -> float:
    """A smooth value in [-1, 1]: three sines whose periods (5-90 s) and phases are seeded by `key`."""
    rng = random.Random(key)  # str seeds are hashed with sha512: the same on every run and every machine
    total = 0.0
    for weight in (0.5, 0.3, 0.2):
        period = rng.uniform(5.0, 90.0)
        total += weight * math.sin(2 * math.pi * t / period + rng.uniform(0, 2 * math.pi))
    return total


def _jitter(t: float, key: str) -> float:
    """Seeded noise in [-1, 1] that changes every 0.1 s of the clock, like a real sensor's flicker."""
    return random.Random(f"{key}:{math.floor(t * 10)}").uniform(-1.0, 1.0)


def _between(low: float, high: float, t: float, key: str, jitter: float = 0.15) -> float:
    """Mostly the smooth wave, a little jitter, always inside [low, high]."""
    unit = (1 - jitter) * _wave(t, key) + jitter * _jitter(t, key)
    return low + (high - low) * (unit + 1) / 2


@dataclass(frozen=True)
class _Load:
    """The ranges one H200 moves in under one workload."""

    utilization: tuple[float, float]
    memory_utilization: tuple[float, float]
    memory_used: tuple[float, float]  # bytes
    temperature: tuple[float, float]
    power: tuple[float, float]
    sm_clock: tuple[float, float]
    throttle_mask: int = 0


_IDLE = _Load((0, 5), (0, 2), (560 * MIB, 640 * MIB), (30, 35), (75, 90), (345, 345))
_BUSY = _Load((95, 100), (45, 70), (59.5 * GIB, 60.5 * GIB), (60, 70), (600, 690), (1965, 1980))
_HOT = _Load((95, 100), (40, 60), (59.5 * GIB, 60.5 * GIB), (87, 90), (520, 600), (1200, 1410),
             SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN)


def _h200(t: float, load: _Load, seed: str) -> DeviceSample:
    def value(label: str, bounds: tuple[float, float]) -> float:
        return _between(*bounds, t, f"{seed}:{label}")

    utilization = round(value("utilization", load.utilization))
    mask = load.throttle_mask | (GPU_IDLE if utilization == 0 else 0)
    return DeviceSample(
        index=0,
        name=H200_NAME,
        uuid=H200_UUID,
        # NVML reports whole percent, whole degrees, milliwatts and whole MHz; so does the simulation.
        utilization_gpu=float(utilization),
        utilization_memory=float(round(value("memory_utilization", load.memory_utilization))),
        memory_used=int(value("memory_used", load.memory_used)),
        memory_total=H200_MEMORY_TOTAL,
        temperature_c=float(round(value("temperature", load.temperature))),
        power_w=round(value("power", load.power), 3),
        power_limit_w=H200_POWER_LIMIT_W,
        sm_clock_mhz=float(round(value("sm_clock", load.sm_clock) / 15) * 15),  # clocks move in 15 MHz bins
        throttle_reasons=throttle_reason_names(mask),
    )


@dataclass(frozen=True)
class _Scenario:
    description: str
    # seconds since the backend was created -> (status, message, devices)
    read: Callable[[float], tuple[str, str | None, tuple[DeviceSample, ...]]]


def _healthy(load: _Load, seed: str) -> Callable[[float], tuple[str, str | None, tuple[DeviceSample, ...]]]:
    return lambda t: ("ok", None, (_h200(t, load, seed),))


_NO_DRIVER_MESSAGE = init_failure_message("NVML Shared Library Not Found", NVML_ERROR_LIBRARY_NOT_FOUND)

_SCENARIOS: dict[str, _Scenario] = {
    "h200": _Scenario("One idle NVIDIA H200 (141 GB): 0-5 % utilisation, ~600 MiB used, 30-35 C, 75-90 W.",
                      _healthy(_IDLE, "h200")),
    "h200-busy": _Scenario("One fully loaded NVIDIA H200: 95-100 % utilisation, ~60 GiB used, 600-690 W, "
                           "no throttling.", _healthy(_BUSY, "h200-busy")),
    "h200-hot": _Scenario("One loaded NVIDIA H200 throttled by heat: 87-90 C, sw and hw thermal slowdown, "
                          "clocks cut to 1200-1410 MHz.", _healthy(_HOT, "h200-hot")),
    "nodriver": _Scenario("No NVIDIA driver: NVML cannot start and there are no devices.",
                          lambda t: ("no_driver", _NO_DRIVER_MESSAGE, ())),
}

SCENARIOS: dict[str, str] = {name: scenario.description for name, scenario in _SCENARIOS.items()}


class SimulatedBackend:
    """A named scenario read from `clock`; chosen only explicitly, never as a fallback for NVML."""

    simulated = True

    def __init__(self, scenario: str, clock: Callable[[], float] = time.monotonic) -> None:
        if scenario not in _SCENARIOS:
            raise ValueError(f"Unknown simulated scenario {scenario!r}; choose one of {', '.join(SCENARIOS)}.")
        self.scenario = scenario
        self.name = f"simulated:{scenario}"
        self._scenario = _SCENARIOS[scenario]
        self._clock = clock
        self._start = clock()

    def read(self) -> Sample:
        status, message, devices = self._scenario.read(self._clock() - self._start)
        return Sample(time.time(), self.name, True, status=status, message=message, devices=devices)

    def close(self) -> None:
        """Nothing to release; present so every backend can be closed the same way."""
