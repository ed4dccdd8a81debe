"""One notebook output line updated in place while long work runs, emptied when it ends."""

from __future__ import annotations

import threading
from typing import Any

from IPython.display import display


class ProgressLine:
    """Call with the new text; call with "" to empty the line (it stays as a blank output).

    Safe to call from a second thread (the probe refreshes the elapsed time from one while a trial runs).
    """

    def __init__(self) -> None:
        self._handle: Any = None
        self._lock = threading.Lock()

    def __call__(self, text: str) -> None:
        data = {"text/plain": text}
        with self._lock:
            if self._handle is None:
                if text:
                    self._handle = display(data, raw=True, display_id=True)
            else:
                self._handle.update(data, raw=True)
