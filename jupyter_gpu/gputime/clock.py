"""Synchronising, CUDA-event timing and allocator memory, touching only what the kernel already initialised.

Every method checks `torch.cuda.is_initialized()` first: creating a CUDA context on the user's behalf
would make every later forked DataLoader worker fail ("Cannot re-initialize CUDA in forked subprocess").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from jupyter_gpu.gputime.result import DeviceMemory
from jupyter_gpu.kernel_torch import cuda_initialized


class DeviceClock:
    """Wall time bracketed by device synchronisation, plus CUDA events when CUDA is up.

    `extra_sync` names other accelerator types the cell used (mps, xpu), synchronised too.
    """

    def __init__(self, torch: Any | None, extra_sync: frozenset[str] = frozenset()) -> None:
        self._torch = torch
        self.cuda = cuda_initialized(torch)
        self._extra_sync = extra_sync

    def synchronize(self) -> None:
        torch = self._torch
        if self.cuda:
            for index in range(torch.cuda.device_count()):
                torch.cuda.synchronize(index)
        for kind in self._extra_sync:
            backend = getattr(torch, kind, None)
            if backend is not None and hasattr(backend, "synchronize"):
                backend.synchronize()

    def time(self, run: Callable[[], Any]) -> tuple[float, float | None]:
        """(wall seconds, GPU seconds or None) of `run()`, with queued work drained before and after."""
        self.synchronize()
        start = end = None
        if self.cuda:
            start = self._torch.cuda.Event(enable_timing=True)
            end = self._torch.cuda.Event(enable_timing=True)
            start.record()
        began = time.perf_counter()
        try:
            run()
        finally:
            if end is not None:
                end.record()
            self.synchronize()
            wall = time.perf_counter() - began
        gpu = start.elapsed_time(end) / 1000.0 if start is not None and end is not None else None
        return wall, gpu


class CudaMemoryWatch:
    """Peak allocated/reserved bytes and the change in allocated bytes, per CUDA device, over the magic.

    Resets PyTorch's peak statistics on devices already initialised (the only way to get a peak for a
    window); if the cell itself initialises CUDA, every figure since then belongs to the cell.
    """

    def __init__(self, torch: Any | None) -> None:
        self._torch = torch
        self._before: dict[int, int] = {}
        if cuda_initialized(torch):
            for index in range(torch.cuda.device_count()):
                self._before[index] = int(torch.cuda.memory_allocated(index))
                torch.cuda.reset_peak_memory_stats(index)

    def finish(self) -> list[DeviceMemory]:
        torch = self._torch
        if not cuda_initialized(torch):
            return []
        found = []
        for index in range(torch.cuda.device_count()):
            peak_allocated = int(torch.cuda.max_memory_allocated(index))
            before = self._before.get(index, 0)
            after = int(torch.cuda.memory_allocated(index))
            if peak_allocated == 0 and before == 0 and after == 0:
                continue  # a device the cell never touched
            found.append(DeviceMemory(device=f"cuda:{index}", peak_allocated=peak_allocated,
                                      peak_reserved=int(torch.cuda.max_memory_reserved(index)),
                                      allocated_before=before, allocated_after=after))
        return found
