"""Which notebook holds the GPU: NVML's processes matched to the server's kernels (pure).

A GPU process belongs to a kernel when the kernel's pid is the process or one of its ancestors (DataLoader
workers and subprocesses count for the notebook that started them). A process of the server's own user that
no kernel started is named by its program; anyone else's processes are "other process" rows, one per GPU,
with their memory (and how many there are) only: no pid, no name, no command line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpu.metrics.sample import Sample
from jupyter_gpu.rendering.units import format_bytes, format_duration
from jupyter_gpu.server.kernels import KernelInfo


# What the probe layer (`server.processes`) tells about a pid; attribution only reads it.
@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    ppid: int | None
    uid: int | None  # real uid
    name: str | None


ProcessLookup = Callable[[int], "ProcessInfo | None"]

MAX_ANCESTRY = 64  # a parent chain longer than this is a loop in a hand-made /proc, not a real process tree
OTHER_PROCESS = "other process"
KIND_ORDER = {"kernel": 0, "process": 1, "other": 2}


@dataclass
class Holder:
    """One kernel, or one process, holding memory on one or more GPUs."""

    kind: str  # "kernel", "process" (the server's user, no kernel) or "other"
    label: str
    memory_by_device: dict[int, int | None] = field(default_factory=dict)
    kernel: KernelInfo | None = None
    pid: int | None = None  # shown for the server user's own processes only
    pids: set[int] = field(default_factory=set)  # every GPU process counted here (never sent to the browser)

    @property
    def memory(self) -> int | None:
        known = [m for m in self.memory_by_device.values() if m is not None]
        return sum(known) if known else None

    def add(self, device: int, memory: int | None) -> None:
        if device in self.memory_by_device:
            before = self.memory_by_device[device]
            memory = None if before is None and memory is None else (before or 0) + (memory or 0)
        self.memory_by_device[device] = memory

    def summary(self, now: float) -> str:
        """"Untitled3.ipynb holds 22 GB on GPU 0, idle for 3 h"."""
        held = " and ".join(
            f"{format_bytes(memory)} on GPU {index}" if memory is not None else f"memory on GPU {index}"
            for index, memory in sorted(self.memory_by_device.items()))
        verb = "hold" if self.kind == "other" and len(self.pids) > 1 else "holds"
        text = f"{self.label} {verb} {held}"
        state = self.state(now)
        if state is not None:
            kind, _, duration = state.partition(" ")
            text += f", {kind} for {duration}" if duration else f", kernel {kind}"
        return text

    def state(self, now: float) -> str | None:
        """The kernel's state for the table: "idle 3 h", "busy 12 min", "starting"; None for processes."""
        kernel = self.kernel
        if kernel is None:
            return None
        if kernel.busy_since is not None:
            return f"busy {format_duration(now - kernel.busy_since)}"
        if kernel.execution_state == "idle" and kernel.last_activity is not None:
            return f"idle {format_duration(now - kernel.last_activity)}"
        return kernel.execution_state

    def to_dict(self, now: float) -> dict[str, Any]:
        kernel = self.kernel
        return {
            "kind": self.kind,
            "label": self.label,
            "summary": self.summary(now),
            "memory": self.memory,
            "devices": [{"index": i, "memory": m} for i, m in sorted(self.memory_by_device.items())],
            "pid": self.pid,
            "kernel_id": kernel.kernel_id if kernel else None,
            "kernel_name": kernel.name if kernel else None,
            "paths": list(kernel.paths) if kernel else [],
            "execution_state": kernel.execution_state if kernel else None,
            "state": self.state(now),
            "idle_seconds": _idle_seconds(kernel, now),
            "busy_seconds": None if kernel is None or kernel.busy_since is None else max(now - kernel.busy_since, 0),
        }


def _idle_seconds(kernel: KernelInfo | None, now: float) -> float | None:
    if kernel is None or kernel.execution_state != "idle" or kernel.last_activity is None:
        return None
    return max(now - kernel.last_activity, 0.0)


def idle_gauge_seconds(kernel: KernelInfo | None, now: float) -> float | None:
    """What Prometheus is told: how long the kernel has run nothing, 0 while it runs a cell, None when its state
    says neither (starting, dead, or no activity seen yet)."""
    if kernel is not None and kernel.execution_state == "busy":
        return 0.0
    return _idle_seconds(kernel, now)


def attribute(sample: Sample | None, kernels: Iterable[KernelInfo], lookup: ProcessLookup,
              server_uid: int) -> list[Holder]:
    """Everyone holding GPU memory in `sample`, biggest first."""
    if sample is None or sample.status != "ok":
        return []
    by_pid = {k.pid: k for k in kernels if k.pid is not None}
    holders: dict[tuple[str, object], Holder] = {}
    for device in sample.devices:
        for process in device.processes or ():
            kernel = _owning_kernel(process.pid, by_pid, lookup)
            if kernel is not None:
                key: tuple[str, object] = ("kernel", kernel.kernel_id)
                holder = holders.get(key) or Holder("kernel", kernel.label, kernel=kernel)
            else:
                info = lookup(process.pid)
                if info is not None and info.uid == server_uid:
                    key = ("process", process.pid)
                    holder = holders.get(key) or Holder("process", info.name or f"pid {process.pid}",
                                                        pid=process.pid)
                else:
                    # Other users' (or invisible) processes: one row per GPU, so the table says how much
                    # memory is taken from the notebooks without describing anyone else's work.
                    key = ("other", device.index)
                    holder = holders.get(key) or Holder("other", OTHER_PROCESS)
            holders[key] = holder
            holder.pids.add(process.pid)
            holder.add(device.index, process.memory_used)
            if holder.kind == "other" and len(holder.pids) > 1:
                holder.label = f"{len(holder.pids)} other processes"
    # Notebooks first (the question the table answers), then the user's own processes, then everyone else.
    return sorted(holders.values(), key=lambda h: (KIND_ORDER[h.kind], -(h.memory or 0), h.label))


def _owning_kernel(pid: int, kernels: dict[int, KernelInfo], lookup: ProcessLookup) -> KernelInfo | None:
    current: int | None = pid
    for _ in range(MAX_ANCESTRY):
        if current is None or current <= 1:
            return None
        if current in kernels:
            return kernels[current]
        info = lookup(current)
        current = info.ppid if info is not None else None
    return None

