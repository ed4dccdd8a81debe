"""Which cell is running, from IPython's own events: the panel's "GPU idle while a cell runs" rule needs it."""

from __future__ import annotations

import contextlib
import time
from typing import Any


class CellActivity:
    """Tracks the running cell through `pre_run_cell`/`post_run_cell`; `close()` unregisters both."""

    def __init__(self, shell: Any) -> None:
        self._shell = shell
        self.started: float | None = None  # time.time() when the running cell began
        self.cell_id: str | None = None  # the front end's id of the running cell, when it sends one
        shell.events.register("pre_run_cell", self._pre_run_cell)
        shell.events.register("post_run_cell", self._post_run_cell)

    def _pre_run_cell(self, info: Any) -> None:
        self.started = time.time()
        self.cell_id = getattr(info, "cell_id", None)

    def _post_run_cell(self, result: Any) -> None:
        self.started = None

    def close(self) -> None:
        for event, callback in (("pre_run_cell", self._pre_run_cell), ("post_run_cell", self._post_run_cell)):
            # ValueError: already unregistered (close twice, or the shell was reset).
            with contextlib.suppress(ValueError):
                self._shell.events.unregister(event, callback)
