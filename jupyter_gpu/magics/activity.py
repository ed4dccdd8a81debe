"""Which cell is running and what the last ones did, from IPython's own events: one recorder per shell.

`%gpupanel`'s "GPU idle while a cell runs" alert reads the running cell; `%gpucheck` matches the finished
cells' windows against the shared sampler's GPU readings; `%gpucells` shows each finished cell's GPU figures.
IPython glue: `pre_run_cell`/`post_run_cell` record wall-clock times (the clock `Sample.timestamp` uses) and hand
the GPU measuring to `probekit.cell_meter`, which never starts CUDA or NVML. A failing measurement is kept as the
row's `error`: it never breaks the user's cell.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections import deque
from typing import Any

from jupyter_gpu.memory_growth import cell_key, cell_label

KEPT_CELLS = 200  # about 200 bytes each: a day's work in a notebook, bounded


class CellActivity:
    """The running cell and the last `KEPT_CELLS` finished ones of one shell; `close()` unregisters."""

    def __init__(self, shell: Any, kept: int = KEPT_CELLS) -> None:
        self.shell = shell
        self.started: float | None = None  # time.time() when the running cell began; None between cells
        self.cell_id: str | None = None  # the front end's id of the last cell run, when it sends one
        self._source = ""
        self._opened: Any = None  # what the cell meter recorded at the start (CUDA only)
        self._error: str | None = None
        self._cells: deque[dict[str, Any]] = deque(maxlen=kept)
        shell.events.register("pre_run_cell", self._pre)
        shell.events.register("post_run_cell", self._post)

    def _pre(self, info: Any = None) -> None:
        self.cell_id = getattr(info, "cell_id", None)
        self._source = getattr(info, "raw_cell", None) or ""
        self._opened, self._error = None, None
        try:
            from jupyter_gpu.probekit.cell_meter import open_cell

            self._opened = open_cell()
        except Exception as exc:  # a failing record never breaks the user's cell
            self._error = f"at the start: {type(exc).__name__}: {exc}"
        self.started = time.time()  # after the meter: the cell's wall time is the cell's alone

    def _post(self, result: Any = None) -> None:
        if self.started is None:
            return
        ended = time.time()
        count = getattr(result, "execution_count", None)
        row: dict[str, Any] = {"execution_count": count, "started": self.started, "ended": ended,
                               "cell": cell_label(self._source), "cell_key": cell_key(self._source)}
        try:
            from jupyter_gpu.probekit.cell_meter import busy_during, close_cell

            if self._opened is not None:
                row.update(close_cell(self._opened))
            row.update(busy_during(self.started, ended, row.get("uuids") or []))
        except Exception as exc:  # as above
            self._error = self._error or f"at the end: {type(exc).__name__}: {exc}"
        if self._error:
            row["error"] = self._error
        self._cells.append(row)
        self.started, self._opened = None, None

    def cells(self) -> list[dict[str, Any]]:
        """Finished cells, oldest first (the cell running `%gpucheck` has not finished, so it is not here)."""
        return list(self._cells)

    def close(self) -> None:
        for event, callback in (("pre_run_cell", self._pre), ("post_run_cell", self._post)):
            with contextlib.suppress(ValueError):  # already unregistered
                self.shell.events.unregister(event, callback)


_recorders: weakref.WeakKeyDictionary[Any, CellActivity] = weakref.WeakKeyDictionary()


def activity_for(shell: Any) -> CellActivity:
    """The one recorder of this shell, made on first use: by the kernel-start autoload (so cells before the
    first `%gpucheck` count) or by `%load_ext jupyter_gpu`."""
    recorder = _recorders.get(shell)
    if recorder is None:
        recorder = _recorders[shell] = CellActivity(shell)
    return recorder


def close_activity(shell: Any) -> None:
    recorder = _recorders.pop(shell, None)
    if recorder is not None:
        recorder.close()
