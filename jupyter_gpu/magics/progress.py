"""One notebook output line updated in place while long work runs, emptied when it ends."""

from __future__ import annotations

from typing import Any

from IPython.display import display


class ProgressLine:
    """Call with the new text; call with "" to empty the line (it stays as a blank output)."""

    def __init__(self) -> None:
        self._handle: Any = None

    def __call__(self, text: str) -> None:
        data = {"text/plain": text}
        if self._handle is None:
            if text:
                self._handle = display(data, raw=True, display_id=True)
        else:
            self._handle.update(data, raw=True)
