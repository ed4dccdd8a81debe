"""Named, deterministic stand-ins for NVML, for tests and demos on machines without a GPU.

Values are smooth functions of the clock plus a seeded jitter, so two reads a second apart differ (a panel
visibly moves) while a test with a fake clock gets exactly the same numbers every run. Every Sample is
marked `simulated=True` and the backend name says which scenario it is, so no surface can pass it off as
real. A scenario is a function of the seconds since the backend was created, which leaves room for
time-scripted ones (`lost`: a GPU that falls off the bus after LOST_AFTER_S seconds).

Reads are cheap (the sampler reads every second): the per-key wave parameters and seeds are cached, so one
read of the eight-GPU scenario costs a few hundred microseconds.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from jupyter_gpu.metrics.backends.claims import CLAIMS_ENV, apply_claims, read_claims
from jupyter_gpu.metrics.backends.nvml import NVML_ERROR_LIBRARY_NOT_FOUND, init_failure_message, lost_message
from jupyter_gpu.metrics.sample import DeviceSample, GpuProcess, MigInstance, Sample, throttle_reason_names

KIB = 1024
MIB = 1024**2
GIB = 1024**3
MB_S = 1000**2  # PCIe rates below are in decimal MB/s and GB/s, as link speeds are quoted
GB_S = 1000**3

H200_NAME = "NVIDIA H200"
H200_UUID = "GPU-5f3b2c1e-8a4d-4c6b-9e27-1d0a7f6b3c42"
H200_MEMORY_TOTAL = 143771 * MIB
H200_POWER_LIMIT_W = 700.0

A100_NAME = "NVIDIA A100-SXM4-80GB"
A100_MEMORY_TOTAL = 81920 * MIB
A100_POWER_LIMIT_W = 400.0

RTX4090_NAME = "NVIDIA GeForce RTX 4090"
RTX4090_MEMORY_TOTAL = 24564 * MIB
RTX4090_POWER_LIMIT_W = 450.0

GPU_IDLE = 0x1
SW_POWER_CAP = 0x4
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40

# The `lost` scenario's GPU falls off the bus this many seconds after the backend is created.
LOST_AFTER_S = 5.0
# pynvml's text for NVML_ERROR_GPU_IS_LOST, which the NVML backend quotes in its message.
_GPU_IS_LOST = "GPU is lost"


# -- deterministic noise -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def _wave_terms(key: str) -> tuple[tuple[float, float, float], ...]:
    """(weight, angular frequency, phase) of the three sines behind `key`; seeded, so stable everywhere."""
    rng = random.Random(key)  # str seeds are hashed with sha512: the same on every run and every machine
    terms = []
    for weight in (0.5, 0.3, 0.2):
        period = rng.uniform(5.0, 90.0)
        terms.append((weight, 2 * math.pi / period, rng.uniform(0, 2 * math.pi)))
    return tuple(terms)


def _wave(t: float, key: str) -> float:
    """A smooth value in [-1, 1]: three sines whose periods (5-90 s) and phases are seeded by `key`."""
    return sum(weight * math.sin(omega * t + phase) for weight, omega, phase in _wave_terms(key))


@functools.lru_cache(maxsize=1024)
def _seed(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


_MASK64 = 2**64 - 1


def _jitter(t: float, key: str) -> float:
    """Seeded noise in [-1, 1] that changes every 0.1 s of the clock, like a real sensor's flicker."""
    # splitmix64's finaliser over (key, tenth of a second): well mixed, and far cheaper than seeding a Random.
    x = (_seed(key) + (math.floor(t * 10) + 1) * 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    x ^= x >> 31
    return x / _MASK64 * 2.0 - 1.0


def _between(low: float, high: float, t: float, key: str, jitter: float = 0.15) -> float:
    """Mostly the smooth wave, a little jitter, always inside [low, high]."""
    unit = (1 - jitter) * _wave(t, key) + jitter * _jitter(t, key)
    return low + (high - low) * (unit + 1) / 2


@functools.lru_cache(maxsize=256)
def _stable_id(prefix: str, name: str) -> str:
    """A UUID-shaped identifier that is the same on every run: `GPU-...` for a board, `MIG-...` for a slice."""
    return f"{prefix}-{uuid.uuid5(uuid.NAMESPACE_URL, f'jupyter-gpu:simulated:{name}')}"


# -- one simulated board -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Card:
    """What does not move on a board."""

    name: str
    uuid: str
    memory_total: int  # bytes
    power_limit_w: float
    reserved: int  # bytes used with no process at all (driver and context overhead)


@dataclass(frozen=True)
class _Load:
    """The ranges one board moves in under one workload."""

    utilization: tuple[float, float]
    memory_utilization: tuple[float, float]
    memory_used: tuple[float, float]  # bytes
    temperature: tuple[float, float]
    power: tuple[float, float]
    sm_clock: tuple[float, float]
    pcie_tx: tuple[float, float]  # bytes/s the GPU sends to the host
    pcie_rx: tuple[float, float]  # bytes/s the GPU receives from the host
    throttle_mask: int = 0
    # (pid, share of the memory above `reserved`): the processes NVML would list on this board.
    processes: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class _Slice:
    """One MIG instance: its profile, GPU instance id and size, and the job (if any) running in it."""

    profile: str
    gpu_instance_id: int
    memory_total: int  # bytes
    memory_used: tuple[float, float]  # bytes
    pid: int | None = None


_MIG_SLICE_RESERVED = 12 * MIB  # what an empty MIG instance shows as used


def _kb_rate(value: float) -> float:
    # NVML counts PCIe throughput in whole KB/s.
    return float(round(value / KIB) * KIB)


def _process_list(entries: list[GpuProcess]) -> tuple[GpuProcess, ...]:
    # The order the NVML backend lists them in: most memory first, then pid.
    return tuple(sorted(entries, key=lambda p: (-(p.memory_used or 0), p.pid)))


def _device(t: float, index: int, card: _Card, load: _Load, seed: str,
            slices: tuple[_Slice, ...] | None = None) -> DeviceSample:
    """One board under one load; with `slices`, in MIG mode, which NVML reports the way a real driver does."""

    def value(label: str, bounds: tuple[float, float]) -> float:
        return _between(*bounds, t, f"{seed}:{label}")

    mask = load.throttle_mask
    instances: tuple[MigInstance, ...] = ()
    if slices is None:
        utilization: float | None = float(round(value("utilization", load.utilization)))
        memory_utilization = float(round(value("memory_utilization", load.memory_utilization)))
        memory_used = int(value("memory_used", load.memory_used))
        mask |= GPU_IDLE if utilization == 0 else 0
        held = max(0, memory_used - card.reserved)
        processes = _process_list([GpuProcess(pid, int(held * share) // MIB * MIB) for pid, share in load.processes])
    else:
        # With MIG on, NVML answers Not Supported for the board's utilisation: each slice is its own device.
        utilization = memory_utilization = None
        instances = tuple(
            MigInstance(
                index=slot,
                uuid=_stable_id("MIG", f"{seed}:{slot}"),
                profile=part.profile,
                gpu_instance_id=part.gpu_instance_id,
                memory_used=int(value(f"mig{slot}:memory_used", part.memory_used)),
                memory_total=part.memory_total,
            )
            for slot, part in enumerate(slices)
        )
        memory_used = card.reserved + sum(m.memory_used or 0 for m in instances)
        processes = _process_list([
            GpuProcess(part.pid, max(0, (m.memory_used or 0) - _MIG_SLICE_RESERVED) // MIB * MIB,
                       part.gpu_instance_id)
            for part, m in zip(slices, instances, strict=True) if part.pid is not None
        ])
    return DeviceSample(
        index=index,
        name=card.name,
        uuid=card.uuid,
        # NVML reports whole percent, whole degrees, milliwatts and whole MHz; so does the simulation.
        utilization_gpu=utilization,
        utilization_memory=memory_utilization,
        memory_used=memory_used,
        memory_total=card.memory_total,
        temperature_c=float(round(value("temperature", load.temperature))),
        power_w=round(value("power", load.power), 3),
        power_limit_w=card.power_limit_w,
        sm_clock_mhz=float(round(value("sm_clock", load.sm_clock) / 15) * 15),  # clocks move in 15 MHz bins
        throttle_reasons=throttle_reason_names(mask),
        pcie_tx_bytes_per_s=_kb_rate(value("pcie_tx", load.pcie_tx)),
        pcie_rx_bytes_per_s=_kb_rate(value("pcie_rx", load.pcie_rx)),
        mig_enabled=slices is not None,
        mig_instances=instances,
        processes=processes,
        compute_mode="default",
    )


# -- H200 ----------------------------------------------------------------------------------------------

_H200 = _Card(H200_NAME, H200_UUID, H200_MEMORY_TOTAL, H200_POWER_LIMIT_W, reserved=600 * MIB)

_IDLE = _Load((0, 5), (0, 2), (560 * MIB, 640 * MIB), (30, 35), (75, 90), (345, 345),
              pcie_tx=(20 * KIB, 400 * KIB), pcie_rx=(20 * KIB, 600 * KIB))
# A training loop: batches stream in (rx), little comes back (tx); pid 4242 is the notebook's python.
_BUSY = _Load((95, 100), (45, 70), (59.5 * GIB, 60.5 * GIB), (60, 70), (600, 690), (1965, 1980),
              pcie_tx=(150 * MB_S, 900 * MB_S), pcie_rx=(2 * GB_S, 9 * GB_S), processes=((4242, 1.0),))
_HOT = _Load((95, 100), (40, 60), (59.5 * GIB, 60.5 * GIB), (87, 90), (520, 600), (1200, 1410),
             pcie_tx=(100 * MB_S, 700 * MB_S), pcie_rx=(1.5 * GB_S, 7 * GB_S),
             throttle_mask=SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN, processes=((4242, 1.0),))


# -- eight A100s, two of them split with MIG ------------------------------------------------------------


def _a100(index: int) -> _Card:
    return _Card(A100_NAME, _stable_id("GPU", f"a100x8-mig:{index}"), A100_MEMORY_TOTAL, A100_POWER_LIMIT_W,
                 reserved=4 * MIB)


_A100S = tuple(_a100(index) for index in range(8))

# Slice sizes as an A100-SXM4-80GB reports them; GPU instance ids as the driver hands them out.
_1G_10GB = 9728 * MIB
_3G_40GB = _4G_40GB = 40192 * MIB
_MIG_IDLE_USED = (11 * MIB, 13 * MIB)

# GPU 0: seven 1g.10gb slices, four of them serving small models (pids 7101-7104), three empty.
_SEVEN_SMALL = tuple(
    _Slice("1g.10gb", gpu_instance_id=7 + slot, memory_total=_1G_10GB,
           memory_used=(6.0 * GIB, 8.5 * GIB) if slot < 4 else _MIG_IDLE_USED,
           pid=7101 + slot if slot < 4 else None)
    for slot in range(7)
)
# GPU 1: a 4g.40gb slice fine-tuning (pid 7201) and a 3g.40gb slice running a notebook (pid 7202).
_TWO_LARGE = (
    _Slice("4g.40gb", gpu_instance_id=1, memory_total=_4G_40GB, memory_used=(33 * GIB, 36 * GIB), pid=7201),
    _Slice("3g.40gb", gpu_instance_id=2, memory_total=_3G_40GB, memory_used=(11 * GIB, 14 * GIB), pid=7202),
)


def _a100_load(utilization: tuple[float, float], memory_utilization: tuple[float, float],
               memory_used: tuple[float, float], temperature: tuple[float, float], power: tuple[float, float],
               sm_clock: tuple[float, float], pcie_rx: tuple[float, float], *, throttle_mask: int = 0,
               processes: tuple[tuple[int, float], ...] = ()) -> _Load:
    # Compute jobs mostly pull data in: the GPU sends back about a tenth of what it receives.
    pcie_tx = (pcie_rx[0] / 10, pcie_rx[1] / 10)
    return _Load(utilization, memory_utilization, memory_used, temperature, power, sm_clock, pcie_tx, pcie_rx,
                 throttle_mask, processes)


_UNREPORTED = (0.0, 0.0)  # MIG boards: utilisation and memory come from their slices instead

_A100_LOADS: tuple[_Load, ...] = (
    # 0, 1: MIG parents (utilisation is not reported; the rest is the whole board).
    _a100_load(_UNREPORTED, _UNREPORTED, _UNREPORTED, (44, 52), (150, 230), (1395, 1410), (300 * MB_S, 1.2 * GB_S)),
    _a100_load(_UNREPORTED, _UNREPORTED, _UNREPORTED, (50, 58), (220, 310), (1395, 1410), (600 * MB_S, 2.5 * GB_S)),
    # 2, 3: one data-parallel training job over two GPUs.
    _a100_load((94, 100), (55, 75), (64 * GIB, 68 * GIB), (60, 68), (330, 390), (1380, 1410),
               (3 * GB_S, 11 * GB_S), processes=((51001, 1.0),)),
    _a100_load((93, 100), (55, 75), (64 * GIB, 68 * GIB), (59, 67), (320, 385), (1380, 1410),
               (3 * GB_S, 11 * GB_S), processes=((51002, 1.0),)),
    # 4: idle, nothing on it.
    _a100_load((0, 2), (0, 1), (4 * MIB, 7 * MIB), (29, 33), (55, 65), (210, 210), (10 * KIB, 300 * KIB)),
    # 5: nearly idle, but someone else's process keeps 74 GiB: the card looks free and is not.
    _a100_load((0, 3), (0, 2), (74 * GIB, 74.5 * GIB), (33, 37), (70, 85), (1410, 1410),
               (20 * KIB, 500 * KIB), processes=((60606, 1.0),)),
    # 6: pinned at its 400 W limit, so the driver holds its clocks down (sw_power_cap).
    _a100_load((97, 100), (70, 85), (60 * GIB, 63 * GIB), (70, 76), (392, 400), (1095, 1290),
               (1 * GB_S, 6 * GB_S), throttle_mask=SW_POWER_CAP, processes=((52000, 1.0),)),
    # 7: light inference: a server plus a small client process.
    _a100_load((25, 60), (10, 30), (20 * GIB, 24 * GIB), (40, 48), (120, 210), (1395, 1410),
               (200 * MB_S, 1.5 * GB_S), processes=((53000, 0.93), (53011, 0.07))),
)
_A100_SLICES: dict[int, tuple[_Slice, ...]] = {0: _SEVEN_SMALL, 1: _TWO_LARGE}


# The GPU another process holds is in exclusive-process mode, as shared servers set a GPU handed to one job.
_A100_EXCLUSIVE = 5


def _a100x8(t: float) -> tuple[str, str | None, tuple[DeviceSample, ...]]:
    devices = (
        _device(t, index, _A100S[index], _A100_LOADS[index], f"a100x8-mig:{index}", _A100_SLICES.get(index))
        for index in range(8)
    )
    return "ok", None, tuple(replace(d, compute_mode="exclusive_process") if d.index == _A100_EXCLUSIVE else d
                             for d in devices)


# -- two consumer cards on PCIe, no NVLink --------------------------------------------------------------


def _rtx4090(index: int) -> _Card:
    return _Card(RTX4090_NAME, _stable_id("GPU", f"pcie-pair:{index}"), RTX4090_MEMORY_TOTAL, RTX4090_POWER_LIMIT_W,
                 reserved=270 * MIB)


_RTX4090S = (_rtx4090(0), _rtx4090(1))
_RTX4090_IDLE = _Load((0, 3), (0, 1), (270 * MIB, 300 * MIB), (30, 36), (12, 25), (210, 210),
                      pcie_tx=(10 * KIB, 200 * KIB), pcie_rx=(10 * KIB, 300 * KIB))


def _pcie_pair(t: float) -> tuple[str, str | None, tuple[DeviceSample, ...]]:
    return "ok", None, tuple(_device(t, index, card, _RTX4090_IDLE, f"pcie-pair:{index}")
                             for index, card in enumerate(_RTX4090S))


# -- scenarios -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Scenario:
    description: str
    # seconds since the backend was created -> (status, message, devices)
    read: Callable[[float], tuple[str, str | None, tuple[DeviceSample, ...]]]


def _healthy(load: _Load, seed: str) -> Callable[[float], tuple[str, str | None, tuple[DeviceSample, ...]]]:
    return lambda t: ("ok", None, (_device(t, 0, _H200, load, seed),))


def _lost(t: float) -> tuple[str, str | None, tuple[DeviceSample, ...]]:
    if t < LOST_AFTER_S:
        return "ok", None, (_device(t, 0, _H200, _BUSY, "lost"),)
    # What NvmlBackend reports for a GPU that fell off the bus: name and UUID kept, every metric None.
    return "ok", None, (DeviceSample(0, H200_NAME, H200_UUID, status="lost", error=lost_message(0, _GPU_IS_LOST)),)


_NO_DRIVER_MESSAGE = init_failure_message("NVML Shared Library Not Found", NVML_ERROR_LIBRARY_NOT_FOUND)

_SCENARIOS: dict[str, _Scenario] = {
    "h200": _Scenario("One idle NVIDIA H200 (141 GB): 0-5 % utilisation, ~600 MiB used, 30-35 C, 75-90 W, "
                      "no processes, MIG off.", _healthy(_IDLE, "h200")),
    "h200-busy": _Scenario("One fully loaded NVIDIA H200: 95-100 % utilisation, ~60 GiB used (almost all by "
                           "python pid 4242), 600-690 W, 2-9 GB/s PCIe in, no throttling.",
                           _healthy(_BUSY, "h200-busy")),
    "h200-hot": _Scenario("One loaded NVIDIA H200 throttled by heat: 87-90 C, sw and hw thermal slowdown, "
                          "clocks cut to 1200-1410 MHz.", _healthy(_HOT, "h200-hot")),
    "a100x8-mig": _Scenario(
        "Eight NVIDIA A100-SXM4-80GB: GPU 0 in MIG mode as 7x 1g.10gb, GPU 1 as 4g.40gb + 3g.40gb (no "
        "utilisation on MIG boards, as NVML reports it); GPUs 2-3 training, 4 idle, 5 with 74 GiB held by "
        "another process in exclusive-process mode, 6 capped at its 400 W power limit, 7 serving light "
        "inference.", _a100x8),
    "pcie-pair": _Scenario(
        "Two idle NVIDIA GeForce RTX 4090 (24 GB) on PCIe, no NVLink: 0-3 % utilisation, ~280 MiB used, "
        "12-25 W, no processes.", _pcie_pair),
    "lost": _Scenario(f"One busy NVIDIA H200 that falls off the bus after {LOST_AFTER_S:g} s: from then on "
                      "it is reported lost, with its name and UUID but no metrics.", _lost),
    "nodriver": _Scenario("No NVIDIA driver: NVML cannot start and there are no devices.",
                          lambda t: ("no_driver", _NO_DRIVER_MESSAGE, ())),
}

SCENARIOS: dict[str, str] = {name: scenario.description for name, scenario in _SCENARIOS.items()}


class SimulatedBackend:
    """A named scenario read from `clock`; chosen only explicitly, never as a fallback for NVML."""

    simulated = True

    def __init__(self, scenario: str, clock: Callable[[], float] = time.monotonic,
                 claims_dir: str | None = None) -> None:
        if scenario not in _SCENARIOS:
            raise ValueError(f"Unknown simulated scenario {scenario!r}; choose one of {', '.join(SCENARIOS)}.")
        self.scenario = scenario
        self.name = f"simulated:{scenario}"
        self._scenario = _SCENARIOS[scenario]
        self._clock = clock
        self._start = clock()
        # Real processes that "hold" memory on these simulated GPUs (see backends/claims.py).
        claims = claims_dir if claims_dir is not None else os.environ.get(CLAIMS_ENV)
        self._claims = Path(claims) if claims else None

    def read(self) -> Sample:
        status, message, devices = self._scenario.read(self._clock() - self._start)
        if self._claims is not None:
            devices = apply_claims(devices, read_claims(self._claims))
        return Sample(time.time(), self.name, True, status=status, message=message, devices=devices)

    def close(self) -> None:
        """Nothing to release; present so every backend can be closed the same way."""
