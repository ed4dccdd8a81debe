"""When each cell ran: the windows `%gpucheck` matches against the shared sampler's GPU readings.

IPython glue: `pre_run_cell`/`post_run_cell` record wall-clock start and end (the clock `Sample.timestamp`
uses) of the last cells; nothing is sampled here and nothing touches torch, NVML or CUDA.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections import deque
from typing import Any

KEPT_CELLS = 20


class CellActivity:
    """Records the last `KEPT_CELLS` cell executions of one shell; `close()` unregisters."""

    def __init__(self, shell: Any, kept: int = KEPT_CELLS) -> None:
        self.shell = shell
        self._cells: deque[dict[str, Any]] = deque(maxlen=kept)
        self._started: float | None = None
        shell.events.register("pre_run_cell", self._pre)
        shell.events.register("post_run_cell", self._post)

    def _pre(self, info: Any = None) -> None:
        self._started = time.time()

    def _post(self, result: Any = None) -> None:
        if self._started is None:
            return
        count = getattr(result, "execution_count", None)
        self._cells.append({"execution_count": count, "started": self._started, "ended": time.time()})
        self._started = None

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
