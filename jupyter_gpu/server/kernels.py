"""A snapshot of the server's running kernels and the notebooks they serve (read on the event loop).

Reading the kernel and session managers is in-memory work, cheap enough for the event loop; the snapshot
is an immutable tuple that the sampler thread reads without a lock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class KernelInfo:
    kernel_id: str
    name: str  # the kernel spec, "python3"
    pid: int | None  # None for kernels this server did not start as a local process (gateways)
    execution_state: str  # "idle", "busy", "starting", "dead", ...
    last_activity: float | None  # epoch seconds of the last message from the kernel
    busy_since: float | None  # epoch seconds when this server first saw it busy; None when not busy
    paths: tuple[str, ...] = ()  # notebooks (or consoles) whose sessions use this kernel

    @property
    def label(self) -> str:
        if self.paths:
            return ", ".join(self.paths)
        return f"kernel {self.kernel_id[:8]} ({self.name})"


class BusyTracker:
    """Remembers when each kernel turned busy: the kernel manager only keeps the latest state."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def update(self, kernel_id: str, state: str, now: float) -> float | None:
        if state != "busy":
            self._since.pop(kernel_id, None)
            return None
        return self._since.setdefault(kernel_id, now)

    def forget_except(self, kernel_ids: set[str]) -> None:
        for kernel_id in set(self._since) - kernel_ids:
            del self._since[kernel_id]


async def snapshot_kernels(kernel_manager: Any, session_manager: Any, tracker: BusyTracker,
                           now: float | None = None) -> tuple[KernelInfo, ...]:
    """Every running kernel with its pid, state and notebook paths."""
    now = time.time() if now is None else now
    paths: dict[str, list[str]] = {}
    if session_manager is not None:
        for session in await session_manager.list_sessions():
            kernel = session.get("kernel") or {}
            if kernel.get("id") and session.get("path"):
                paths.setdefault(kernel["id"], []).append(session["path"])
    kernels = []
    ids = set(kernel_manager.list_kernel_ids())
    for kernel_id in sorted(ids):
        try:
            manager = kernel_manager.get_kernel(kernel_id)
        except KeyError:  # shut down between the listing and now
            continue
        state = getattr(manager, "execution_state", None) or "unknown"
        kernels.append(KernelInfo(
            kernel_id=kernel_id,
            name=getattr(manager, "kernel_name", None) or "unknown",
            pid=_kernel_pid(manager),
            execution_state=state,
            last_activity=_epoch(getattr(manager, "last_activity", None)),
            busy_since=tracker.update(kernel_id, state, now),
            paths=tuple(sorted(paths.get(kernel_id, ()))),
        ))
    tracker.forget_except(ids)
    return tuple(kernels)


def _kernel_pid(manager: Any) -> int | None:
    provisioner = getattr(manager, "provisioner", None)
    pid = getattr(provisioner, "pid", None)
    return pid if isinstance(pid, int) else None


def _epoch(value: datetime | None) -> float | None:
    return value.timestamp() if isinstance(value, datetime) else None
