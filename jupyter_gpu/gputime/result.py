"""`GpuTimeResult`: plain data about one `%%gputime` run, shaped like IPython's `TimeitResult`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from jupyter_gpu.gputime.ops import is_accelerator
from jupyter_gpu.gputime.stats import TimingStats, summarize
from jupyter_gpu.models import Finding, RichResult
from jupyter_gpu.probekit.device_memory import DeviceMemory


@dataclass(frozen=True)
class OpCounts:
    """What the counted run did, from PyTorch's dispatcher: operators per device type, copies, waits."""

    by_device: dict[str, int]
    by_name: dict[str, int]                                       # ATen operator -> count
    copies: dict[str, int] = field(default_factory=dict)          # direction -> count
    copy_bytes: dict[str, int] = field(default_factory=dict)      # direction -> bytes
    syncs: dict[str, int] = field(default_factory=dict)           # what the user called -> count
    blocking_seconds: float = 0.0        # wall time inside copies and calls that waited for a device
    cpu_bytes_allocated: int = 0         # new CPU tensor storage created by the run
    cpu_peak_bytes: int = 0              # most of it alive at once
    cpu_bytes_held: int = 0              # still alive after the run (assigned to variables, or leaked)
    overhead_seconds: float | None = None  # what counting itself added to the counted run (measured)
    cuda_devices: tuple[int, ...] = ()   # the CUDA device indices the operators ran on
    side_stream_ops: int = 0             # operators queued on a stream other than the one the clock times

    @property
    def top_ops(self) -> list[tuple[str, int]]:
        """The ten most frequent operators, most frequent first."""
        return sorted(self.by_name.items(), key=lambda item: (-item[1], item[0]))[:10]

    @property
    def total(self) -> int:
        return sum(self.by_device.values())

    @property
    def accelerator_ops(self) -> int:
        return sum(n for device, n in self.by_device.items() if is_accelerator(device))

    @property
    def sync_count(self) -> int:
        return sum(self.syncs.values())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GpuBusy:
    """NVML utilisation sampled while the cell ran."""

    percent: float
    samples: int
    devices: list[str]
    simulated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, repr=False)  # RichResult's repr: a summary line, not every field
class GpuTimeResult(RichResult):
    """Timings of one `%%gputime` cell.

    `times` are per-run wall seconds of the steady-state runs (each the mean of its `loops` runs, like
    `TimeitResult.timings`); `gpu_times` the matching CUDA-event seconds, or None where no CUDA clock ran.
    With the default single run, that run is also the first run.
    """

    renderer: ClassVar[str] = "jupyter_gpu.gputime.render"

    label: str
    times: list[float]
    gpu_times: list[float | None]
    first_time: float
    first_gpu_time: float | None
    loops: int = 1
    repeat: int = 1
    warmup: int = 0
    ops: OpCounts | None = None
    ops_note: str | None = None
    memory: list[DeviceMemory] = field(default_factory=list)
    busy: GpuBusy | None = None
    busy_note: str | None = None
    throttle_reasons: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    context: dict[str, Any] = field(default_factory=dict)

    @property
    def repeated(self) -> bool:
        """True when the first run was reported apart from separately timed steady-state runs."""
        return bool(self.context.get("repeated"))

    @property
    def stats(self) -> TimingStats:
        return summarize(self.times)

    @property
    def gpu_stats(self) -> TimingStats | None:
        measured = [t for t in self.gpu_times if t is not None]
        return summarize(measured) if measured else None

    @property
    def median(self) -> float:
        return self.stats.median

    @property
    def best(self) -> float:
        return self.stats.minimum

    @property
    def iqr(self) -> float:
        return self.stats.iqr

    @property
    def n(self) -> int:
        return len(self.times)

    @property
    def gpu_median(self) -> float | None:
        stats = self.gpu_stats
        return stats.median if stats else None

    @property
    def ops_by_device(self) -> dict[str, int]:
        """PyTorch operators per device type in the counted run; empty when they were not counted."""
        return dict(self.ops.by_device) if self.ops else {}

    @property
    def simulated(self) -> bool:
        return bool(self.context.get("simulated"))

    def summary(self) -> str:
        from jupyter_gpu.rendering.units import format_seconds

        what = "median" if self.repeated else "wall"
        return f"{self.label}: {format_seconds(self.median)} {what}, n={self.n}"

    def to_dict(self) -> dict[str, Any]:
        gpu_stats = self.gpu_stats
        return {
            "label": self.label,
            "times": list(self.times),
            "gpu_times": list(self.gpu_times),
            "first_time": self.first_time,
            "first_gpu_time": self.first_gpu_time,
            "loops": self.loops,
            "repeat": self.repeat,
            "warmup": self.warmup,
            "stats": self.stats.to_dict(),
            "gpu_stats": gpu_stats.to_dict() if gpu_stats else None,
            "ops": self.ops.to_dict() if self.ops else None,
            "ops_note": self.ops_note,
            "memory": [m.to_dict() for m in self.memory],
            "busy": self.busy.to_dict() if self.busy else None,
            "busy_note": self.busy_note,
            "throttle_reasons": list(self.throttle_reasons),
            "findings": [f.to_dict() for f in self.findings],
            "context": dict(self.context),
        }
