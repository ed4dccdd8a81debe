"""Which cell is running and when the last ones ran, from IPython's own events: one recorder per shell.

`%gpupanel`'s "GPU idle while a cell runs" alert reads the running cell; `%gpucheck` matches the finished
cells' windows against the shared sampler's GPU readings. IPython glue: `pre_run_cell`/`post_run_cell` record
wall-clock times (the clock `Sample.timestamp` uses); nothing is sampled here and nothing touches torch, NVML or
CUDA.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections import deque
from typing import Any

KEPT_CELLS = 20


class CellActivity:
    """The running cell and the last `KEPT_CELLS` finished ones of one shell; `close()` unregisters."""

    def __init__(self, shell: Any, kept: int = KEPT_CELLS) -> None:
        self.shell = shell
        self.started: float | None = None  # time.time() when the running cell began; None between cells
        self.cell_id: str | None = None  # the front end's id of the last cell run, when it sends one
        self._cells: deque[dict[str, Any]] = deque(maxlen=kept)
        shell.events.register("pre_run_cell", self._pre)
        shell.events.register("post_run_cell", self._post)

    def _pre(self, info: Any = None) -> None:
        self.started = time.time()
        self.cell_id = getattr(info, "cell_id", None)

    def _post(self, result: Any = None) -> None:
        if self.started is None:
            return
        count = getattr(result, "execution_count", None)
        self._cells.append({"execution_count": count, "started": self.started, "ended": time.time()})
        self.started = None

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
