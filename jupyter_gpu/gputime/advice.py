"""What a `%%gputime` result means for the user: findings with evidence and the fix. Pure Python."""

from __future__ import annotations

from dataclasses import dataclass, field

from jupyter_gpu.gputime.ops import DEVICE_TO_HOST, HOST_TO_DEVICE
from jupyter_gpu.gputime.result import GpuBusy, OpCounts
from jupyter_gpu.gputime.stats import TimingStats
from jupyter_gpu.models import Finding, order_findings
from jupyter_gpu.rendering.units import format_bytes, format_count, format_seconds

# A cell that spends more than half its first run copying or waiting is copy-bound, not compute-bound.
COPY_BOUND_FRACTION = 0.5
COPY_BOUND_FLOOR_SECONDS = 1e-3
# Below this NVML utilisation the GPU mostly waited for the host while the cell ran.
IDLE_BUSY_PERCENT = 50.0
# This many waits for the GPU in one run is a pattern (an `.item()` per step), not a final read-out.
SYNC_HEAVY_COUNT = 10

MOVE_TO_GPU_FIX = [
    "device = torch.device('cuda')",
    "model = model.to(device)                      # the parameters live where the math runs",
    "inputs, targets = inputs.to(device), targets.to(device)   # every batch, inside the loop",
    "DataLoader(..., pin_memory=True) and .to(device, non_blocking=True) for fast copies",
]


@dataclass(frozen=True)
class GpuAvailability:
    """Whether PyTorch in this kernel could use a GPU right now, without initialising CUDA to find out."""

    usable: bool
    devices: list[str] = field(default_factory=list)
    simulated: bool = False
    reason: str | None = None

    @property
    def label(self) -> str:
        names = ", ".join(self.devices) or "a GPU"
        return f"{names} (simulated)" if self.simulated else names


def timing_findings(*, first_time: float, stats: TimingStats | None, ops: OpCounts | None,
                    availability: GpuAvailability, busy: GpuBusy | None, throttle_reasons: list[str],
                    cuda_initialized_by_cell: bool) -> list[Finding]:
    findings: list[Finding] = []
    if ops is not None and availability.usable:
        findings += _device_findings(ops, availability)
    if ops is not None and ops.accelerator_ops:
        findings += _copy_findings(ops, first_time)
    if stats is not None and stats.spread_is_large:
        findings.append(_spread_finding(stats))
    if throttle_reasons:
        findings.append(_throttle_finding(throttle_reasons))
    if busy is not None and busy.percent < IDLE_BUSY_PERCENT and (ops is None or ops.accelerator_ops):
        findings.append(_idle_finding(busy))
    if cuda_initialized_by_cell:
        findings.append(Finding(
            "CUDA_INITIALIZED_BY_CELL", "info",
            "This cell initialised CUDA, so its first run includes creating the CUDA context "
            "(often 0.2-2 s); time it again, or use -n/-r, for the steady state.",
            evidence={"first run": format_seconds(first_time)}))
    if ops is not None and ops.side_stream_ops:
        findings.append(Finding(
            "GPU_TIME_LOWER_BOUND", "info",
            f"{format_count(ops.side_stream_ops)} of the cell's GPU operations ran on side streams, so the GPU "
            "time is a lower bound: it is measured on each device's current stream, and work on another stream "
            "that stream does not wait for is not in it. The wall time, taken after synchronising, includes it.",
            evidence={"operations on side streams": format_count(ops.side_stream_ops),
                      "GPU operations": format_count(ops.accelerator_ops)}))
    return order_findings(findings)


def _device_findings(ops: OpCounts, availability: GpuAvailability) -> list[Finding]:
    if ops.accelerator_ops:
        return []
    if ops.total == 0:
        return [Finding(
            "NO_TORCH_WORK", "info",
            f"The cell ran no PyTorch operations, so none of its work could run on {availability.label}.",
            evidence={"GPU available": availability.label},
            fix=["Do the heavy work with torch tensors created on the GPU: torch.randn(..., device='cuda')"])]
    devices = ", ".join(f"{kind} {format_count(n)}" for kind, n in sorted(ops.by_device.items()))
    return [Finding(
        "NO_GPU_WORK", "warn",
        f"No GPU work: the cell ran {format_count(ops.total)} PyTorch operations, none of them on the GPU, "
        f"while {availability.label} is available to this kernel.",
        evidence={"operations by device": devices, "GPU available": availability.label,
                  "most frequent": _top(ops)},
        fix=list(MOVE_TO_GPU_FIX))]


def _copy_findings(ops: OpCounts, first_time: float) -> list[Finding]:
    findings: list[Finding] = []
    copies = ops.copies.get(HOST_TO_DEVICE, 0) + ops.copies.get(DEVICE_TO_HOST, 0)
    blocked = ops.blocking_seconds
    if first_time > 0 and blocked >= COPY_BOUND_FLOOR_SECONDS and blocked / first_time > COPY_BOUND_FRACTION:
        findings.append(Finding(
            "COPY_BOUND", "warn",
            f"The cell spent {blocked / first_time:.0%} of its counted run copying between host and GPU "
            "or waiting for the GPU, not computing.",
            evidence={"blocked": format_seconds(blocked), "run": format_seconds(first_time),
                      "copies": _copies(ops), "waits": _syncs(ops) or "none"},
            fix=["Create tensors on the GPU: torch.zeros(..., device='cuda') instead of .to('cuda') each step",
                 "Move the model and fixed data to the GPU once, before the loop",
                 "DataLoader(..., pin_memory=True) and batch.to(device, non_blocking=True)",
                 "Read results back (.item(), .cpu(), print) once at the end, not every step"]))
    elif ops.sync_count >= SYNC_HEAVY_COUNT:
        findings.append(Finding(
            "SYNC_HEAVY", "info",
            f"The cell made the host wait for the GPU {format_count(ops.sync_count)} times; each wait drains "
            "the GPU's queue, so the CPU cannot run ahead.",
            evidence={"waits": _syncs(ops), "copies": _copies(ops) if copies else "none"},
            fix=["Accumulate on the GPU (total += loss.detach()) and call .item() once at the end",
                 "Log every N steps rather than every step"]))
    return findings


def _spread_finding(stats: TimingStats) -> Finding:
    return Finding(
        "LARGE_SPREAD", "warn",
        f"The slowest run took {stats.spread_ratio:.1f}x longer than the fastest: the median may not be "
        "representative (caching, other processes, clock changes, or work that grows per run).",
        evidence={"fastest": format_seconds(stats.minimum), "slowest": format_seconds(stats.maximum),
                  "runs": stats.n},
        fix=["Add warm-up runs (-w 3) and more repeats (-r 7), and check what else uses the machine"])


def _throttle_finding(reasons: list[str]) -> Finding:
    return Finding(
        "GPU_THROTTLED", "warn",
        "The GPU slowed its clocks while the cell ran, so these times are lower than the GPU can do.",
        evidence={"throttle reasons": ", ".join(reasons)},
        fix=["nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER   # which limit, and how close",
             "Check cooling and power limits before trusting or comparing these numbers"])


def _idle_finding(busy: GpuBusy) -> Finding:
    return Finding(
        "GPU_MOSTLY_IDLE", "warn",
        f"GPU busy {busy.percent:.0f}% of the cell: input pipeline or host-bound.",
        evidence={"devices": ", ".join(busy.devices), "samples": busy.samples},
        fix=["%gpucheck audits DataLoaders (num_workers, pin_memory) and device placement",
             "Use larger batches, or torch.compile / CUDA graphs to cut per-step launch overhead"])


def _top(ops: OpCounts, limit: int = 5) -> str:
    return ", ".join(f"{name} {format_count(n)}" for name, n in ops.top_ops[:limit])


def _copies(ops: OpCounts) -> str:
    parts = [f"{direction.replace('_', ' ')} {format_count(n)} ({format_bytes(ops.copy_bytes.get(direction, 0))})"
             for direction, n in sorted(ops.copies.items())]
    return ", ".join(parts) or "none"


def _syncs(ops: OpCounts) -> str:
    return ", ".join(f"{what} {format_count(n)}" for what, n in sorted(ops.syncs.items()))
