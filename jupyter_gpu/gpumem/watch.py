"""`%gpumem --watch`: after every cell, record the memory each device holds and what the walk names, so
`--history` can say which cell made it grow and which cell keeps growing.

Probe ring. It hooks IPython's `post_run_cell` event; a failure while recording is noted once and never reaches
the user's cell. It keeps names and sizes of the last walk, never a reference to a tensor.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from jupyter_gpu.gpumem.allocator import levels
from jupyter_gpu.gpumem.history import cell_key, cell_label, find_leaks, new_entries
from jupyter_gpu.gpumem.result import CellRecord, MemoryHistory
from jupyter_gpu.gpumem.runner import walk_notebook
from jupyter_gpu.kernel_torch import loaded_torch

MAX_RECORDS = 1000  # a long session keeps its last thousand cells
BASELINE = "(watching started)"


class MemoryWatch:
    """One shell's per-cell memory records."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.records: deque[CellRecord] = deque(maxlen=MAX_RECORDS)
        self.notes: list[str] = []
        self.active = False
        self._previous: dict[tuple[str, int], tuple[str, int]] = {}

    def start(self) -> None:
        """Start recording; the memory now is the baseline the first cell's growth is measured from."""
        if self.active:
            return
        self.shell.events.register("post_run_cell", self._after_cell)
        self.active = True
        # A running cell has already moved execution_count on to the next cell's number.
        self.record(max(getattr(self.shell, "execution_count", 1) - 1, 0), BASELINE)

    def stop(self) -> None:
        if self.active:
            self.shell.events.unregister("post_run_cell", self._after_cell)
            self.active = False

    def history(self) -> MemoryHistory:
        records = list(self.records)
        return MemoryHistory(records=tuple(records), leaks=tuple(find_leaks(records)), watching=self.active,
                             notes=tuple(self.notes))

    def record(self, execution_count: int, source: str) -> CellRecord | None:
        torch = loaded_torch()
        if torch is None:
            return None  # no torch, no tensors: nothing to record until the notebook imports it
        started = time.perf_counter()
        walk = walk_notebook(torch, self.shell.user_ns, self.shell)
        named: dict[str, int] = {}
        current: dict[tuple[str, int], tuple[str, int]] = {}
        for key, storage in walk.storages.items():
            named[storage.device] = named.get(storage.device, 0) + storage.bytes
            current[key] = (storage.path, storage.bytes)
        allocated = tuple((level.device, level.allocated_bytes) for level in levels(torch, walk))
        added = new_entries(self._previous, current) if self.records else ()
        self._previous = current
        record = CellRecord(execution_count=execution_count, cell=cell_label(source),
                            cell_key=cell_key(source), allocated=allocated, named=tuple(sorted(named.items())),
                            new_entries=added, seconds=time.perf_counter() - started)
        self.records.append(record)
        return record

    def _after_cell(self, result: Any) -> None:
        source = getattr(getattr(result, "info", None), "raw_cell", "") or ""
        if source.lstrip().startswith("%gpumem"):
            return  # the watch's own cells are not the notebook's work
        try:
            self.record(getattr(result, "execution_count", None) or 0, source)
        except Exception as error:  # recording must never break the user's cell
            if not self.notes:
                self.notes.append(f"recording after a cell failed ({type(error).__name__}: {error}); "
                                  "those cells are missing from the history")


_WATCHES: dict[int, MemoryWatch] = {}


def watch_for(shell: Any) -> MemoryWatch:
    """The shell's watch (made on first use, whether or not it is recording)."""
    watch = _WATCHES.get(id(shell))
    if watch is None or watch.shell is not shell:
        watch = _WATCHES[id(shell)] = MemoryWatch(shell)
    return watch
