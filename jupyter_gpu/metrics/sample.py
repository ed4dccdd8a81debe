"""One timestamped reading of every GPU: the `Sample` that the sampler, the widget and the server share.

Pure Python: no torch, NVML or IPython imports, so the TypeScript panel, the server API and the tests all
see the same JSON. A value the GPU did not report is `None`, never 0: a fake 0 % looks like an idle GPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

SAMPLE_STATUSES = ("ok", "no_driver", "error")
DEVICE_STATUSES = ("ok", "lost", "error")

# NVML's clocks-event (formerly "clocks throttle") reason bits, named as NVML names them.
THROTTLE_REASON_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
    # Newer drivers report these two through the throttle-reasons call; they cap clocks by design.
    0x200: "board_limit",
    0x400: "reliability",
}

# The reasons that cost the user speed, by cause (the alerts name the cause). gpu_idle, app clocks, sync boost
# and display clocks are normal states.
THERMAL_THROTTLES: frozenset[str] = frozenset({"sw_thermal_slowdown", "hw_thermal_slowdown"})
POWER_THROTTLES: frozenset[str] = frozenset({"sw_power_cap", "hw_power_brake_slowdown", "hw_slowdown"})
PERFORMANCE_THROTTLES: frozenset[str] = THERMAL_THROTTLES | POWER_THROTTLES


def throttle_reason_names(mask: int) -> tuple[str, ...]:
    """The names of the bits set in an NVML clocks-event mask, lowest bit first.

    A bit this table does not know yet is kept as `unknown_0x...` rather than dropped, so a newer driver's
    reason still shows up.
    """
    if mask < 0:
        raise ValueError(f"A clocks-event mask cannot be negative, got {mask}.")
    names = []
    bit = 1
    while bit <= mask:
        if mask & bit:
            names.append(THROTTLE_REASON_BITS.get(bit, f"unknown_{bit:#x}"))
        bit <<= 1
    return tuple(names)


@dataclass(frozen=True)
class GpuProcess:
    """One process holding memory on a GPU, as NVML lists it (host PIDs: NVML ignores PID namespaces)."""

    pid: int
    memory_used: int | None = None  # None where NVML cannot say (WDDM, some MIG set-ups)
    gpu_instance_id: int | None = None  # the MIG GPU instance it runs in, when MIG is on

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuProcess:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class MigInstance:
    """One MIG slice of a GPU: what CUDA sees as a device of its own (`MIG-...` UUID)."""

    index: int
    uuid: str | None
    profile: str | None  # "1g.10gb", "3g.40gb", ...
    gpu_instance_id: int | None = None
    memory_used: int | None = None
    memory_total: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MigInstance:
        return cls(**_known(cls, data))


def _strict_bool(value: Any, name: str) -> bool:
    # bool("false") is True: a hand-edited fixture must not turn a simulated sample into a real one.
    if not isinstance(value, bool):
        raise ValueError(f"A sample's {name!r} must be true or false, got {value!r}.")
    return value


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    # Unknown keys (derived ones like "throttled", or fields a newer version adds) are ignored.
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass(frozen=True)
class DeviceSample:
    """What one GPU reported at one moment."""

    index: int
    name: str | None
    uuid: str | None
    status: str = "ok"
    error: str | None = None
    utilization_gpu: float | None = None
    utilization_memory: float | None = None
    memory_used: int | None = None
    memory_total: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    throttle_reasons: tuple[str, ...] | None = None
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    # None: the GPU has no MIG (or NVML cannot say); False/True: MIG mode as the driver reports it.
    mig_enabled: bool | None = None
    mig_instances: tuple[MigInstance, ...] = ()
    # None: NVML could not list them; (): no process holds this GPU.
    processes: tuple[GpuProcess, ...] | None = None
    # This kernel's PyTorch caching allocator on this GPU; None unless the kernel had already started CUDA.
    torch_allocated: int | None = None
    torch_reserved: int | None = None
    # NVML's compute mode: "default", "exclusive_process" (one process at a time may hold a context), "prohibited"
    # (none may); None when NVML cannot say. A GPU another process holds in exclusive mode is closed to the rest.
    compute_mode: str | None = None

    def __post_init__(self) -> None:
        if self.status not in DEVICE_STATUSES:
            raise ValueError(f"Device status must be one of {', '.join(DEVICE_STATUSES)}, got {self.status!r}.")

    @property
    def label(self) -> str:
        """The device's name, or its index when NVML could not read the name."""
        return self.name or f"GPU {self.index}"

    @property
    def throttled(self) -> bool:
        return any(reason in PERFORMANCE_THROTTLES for reason in self.throttle_reasons or ())

    @property
    def memory_fraction(self) -> float | None:
        if self.memory_used is None or not self.memory_total:
            return None
        return self.memory_used / self.memory_total

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)  # nested dataclasses become dicts, tuples stay tuples until json
        if self.throttle_reasons is not None:
            data["throttle_reasons"] = list(self.throttle_reasons)
        data["mig_instances"] = list(data["mig_instances"])
        if self.processes is not None:
            data["processes"] = list(data["processes"])
        # Derived, but sent so the TypeScript panel does not keep its own copy of PERFORMANCE_THROTTLES.
        data["throttled"] = self.throttled
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceSample:
        values = _known(cls, data)
        reasons = values.get("throttle_reasons")
        if reasons is not None:
            values["throttle_reasons"] = tuple(reasons)
        values["mig_instances"] = tuple(MigInstance.from_dict(m) for m in values.get("mig_instances") or ())
        processes = values.get("processes")
        if processes is not None:
            values["processes"] = tuple(GpuProcess.from_dict(p) for p in processes)
        return cls(**values)


@dataclass(frozen=True)
class Sample:
    """One reading of every device from one backend, or the reason there is none."""

    timestamp: float
    backend: str
    simulated: bool
    status: str = "ok"
    message: str | None = None
    devices: tuple[DeviceSample, ...] = ()

    def __post_init__(self) -> None:
        if self.status not in SAMPLE_STATUSES:
            raise ValueError(f"Sample status must be one of {', '.join(SAMPLE_STATUSES)}, got {self.status!r}.")

    def to_dict(self) -> dict[str, Any]:
        return {
            "timestamp": self.timestamp,
            "backend": self.backend,
            "simulated": self.simulated,
            "status": self.status,
            "message": self.message,
            "devices": [d.to_dict() for d in self.devices],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        return cls(
            timestamp=float(data["timestamp"]),
            backend=data["backend"],
            simulated=_strict_bool(data["simulated"], "simulated"),
            status=data.get("status", "ok"),
            message=data.get("message"),
            devices=tuple(DeviceSample.from_dict(d) for d in data.get("devices", ())),
        )
