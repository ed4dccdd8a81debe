"""Synchronising, CUDA-event timing and allocator memory, touching only what the kernel already initialised.

Every method checks `torch.cuda.is_initialized()` first: creating a CUDA context on the user's behalf
would make every later forked DataLoader worker fail ("Cannot re-initialize CUDA in forked subprocess").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from jupyter_gpu.kernel_torch import allocator_counters, context_devices, cuda_initialized, loaded_torch
from jupyter_gpu.probekit.device_memory import DeviceMemory


def eager_op_floor(torch: Any, calls: int = 200, rounds: int = 5) -> float:
    """Seconds this host takes to dispatch one eager operator that does almost no arithmetic (an add of two
    one-element CPU tensors), the median of a few rounds (the step it is set against is a median too, under the same
    load): the yardstick per-operator overhead is judged against. It differs by host (1.4 us on one machine, 1.6-3.2
    us on a 2-core EPYC), so a fixed microsecond line misjudges the same step on a slower host. About 2 ms; on the
    CPU, so it never touches CUDA."""
    one = torch.ones(1)
    per_call = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(calls):
            one.add(one)
        per_call.append((time.perf_counter() - started) / calls)
    return sorted(per_call)[len(per_call) // 2]


def record_event(torch: Any, index: int) -> Any:
    """A timing event recorded now on device `index`'s current stream.

    The stream is named explicitly: `Event.record()` without one uses whichever device is current, so work on
    another device would be timed as zero, and a cell that calls `torch.cuda.set_device` would leave two events
    on two devices, whose `elapsed_time` raises.
    """
    event = torch.cuda.Event(enable_timing=True)
    event.record(torch.cuda.current_stream(index))
    return event


def step_device_index(torch: Any, device: Any) -> int:
    """The index of a CUDA `torch.device`; a bare "cuda" means the device current now, as torch reads it."""
    return int(device.index) if device.index is not None else int(torch.cuda.current_device())


class DeviceClock:
    """Wall time bracketed by device synchronisation, plus CUDA events when CUDA is up.

    Only devices this kernel has a context on are synchronised and timed (`kernel_torch.context_devices`), plus
    `devices`, those the operator counts saw the work on. `extra_sync` names other accelerator types the cell
    used (mps, xpu), synchronised too. The GPU time is the longest span among the timed devices, each measured on
    its current stream: work on side streams that the current stream does not wait for is not in it.
    """

    def __init__(self, torch: Any | None, extra_sync: frozenset[str] = frozenset(),
                 devices: Iterable[int] = ()) -> None:
        self._torch = torch
        self._extra_sync = extra_sync
        self._named = frozenset(devices)

    def _current_torch(self) -> Any | None:
        # The torch given, else the one a cell has imported since this clock was made.
        return self._torch if self._torch is not None else loaded_torch()

    def devices(self) -> tuple[int, ...]:
        """The CUDA devices to synchronise and time now; () while CUDA is not initialised in this kernel."""
        found = context_devices(self._current_torch())
        return tuple(sorted({*found, *self._named})) if found else ()

    def synchronize(self, devices: tuple[int, ...] | None = None) -> None:
        torch = self._current_torch()
        for index in self.devices() if devices is None else devices:
            torch.cuda.synchronize(index)
        for kind in self._extra_sync:
            backend = getattr(torch, kind, None)
            if backend is not None and hasattr(backend, "synchronize"):
                backend.synchronize()

    def time(self, run: Callable[[], Any]) -> tuple[float, float | None]:
        """(wall seconds, GPU seconds or None) of `run()`, with queued work drained before and after."""
        devices = self.devices()
        self.synchronize(devices)
        torch = self._current_torch()  # the one `devices` came from: a clock made before the cell imported torch
        starts = {index: record_event(torch, index) for index in devices}
        ends: dict[int, Any] = {}
        began = time.perf_counter()
        try:
            run()
        finally:
            for index in starts:
                ends[index] = record_event(torch, index)
            self.synchronize()  # again from the top: the run may have started CUDA or used a new device
            wall = time.perf_counter() - began
        gpu = max((starts[i].elapsed_time(ends[i]) for i in starts), default=None)
        return wall, None if gpu is None else gpu / 1000.0


class CudaMemoryWatch:
    """Peak allocated/reserved bytes and the change in allocated bytes, per CUDA device, over the magic.

    Resets PyTorch's peak statistics on devices already initialised (the only way to get a peak for a
    window); if the cell itself initialises CUDA, every figure since then belongs to the cell.
    """

    def __init__(self, torch: Any | None) -> None:
        self._torch = torch
        self._before: dict[int, int] = {}
        self.reserved_after = 0  # bytes reserved on every device when `finish()` read them (untouched ones too)
        if cuda_initialized(torch):
            for index in range(torch.cuda.device_count()):
                self._before[index] = allocator_counters(torch, index).allocated
                torch.cuda.reset_peak_memory_stats(index)

    def finish(self) -> list[DeviceMemory]:
        # The torch given, else the one the cell imported since: a cell that starts CUDA owns every figure.
        torch = self._torch if self._torch is not None else loaded_torch()
        if not cuda_initialized(torch):
            return []
        found = []
        self.reserved_after = 0
        for index in range(torch.cuda.device_count()):
            counters = allocator_counters(torch, index)
            self.reserved_after += counters.reserved
            before = self._before.get(index, 0)
            if counters.peak_allocated == 0 and before == 0 and counters.allocated == 0:
                continue  # a device the cell never touched
            found.append(DeviceMemory(device=f"cuda:{index}", peak_allocated=counters.peak_allocated,
                                      peak_reserved=counters.peak_reserved, allocated_before=before,
                                      allocated_after=counters.allocated))
        return found
