"""The progress line's clock: refreshed once a second while a trial holds the kernel's main thread."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable

# A large trial can take minutes; the elapsed time on the progress line must not look frozen meanwhile.
TICK_SECONDS = 1.0


class Ticker:
    """Refreshes the progress line's elapsed time once a second while a trial runs, from a daemon thread.

    The step holds the kernel's main thread for as long as a trial takes (minutes for a large batch on a slow
    device); without this the line would say the same elapsed time throughout and look hung.
    """

    def __init__(self, show: Callable[[str], None]) -> None:
        self._show = show
        self._text: str | None = None
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def resume(self, text: str) -> None:
        """Show `text` now if the line was paused, else from the next tick: a caller that updates the text on
        every step of a millisecond-long loop must not wake a thread (and send a display update) each time."""
        with self._wake:
            was_paused = self._text is None
            self._text = text
            if self._thread is None:
                # The cell's context goes with the thread: ipykernel keeps the request being answered in a
                # context variable, and an update without it would not reach the cell's output.
                context = contextvars.copy_context()
                self._thread = threading.Thread(target=context.run, args=(self._loop,),
                                                name="jupyter-gpu-batchprobe-progress", daemon=True)
                self._thread.start()
            if was_paused:
                self._wake.notify()

    def pause(self) -> None:
        with self._wake:
            self._text = None

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._text = None
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        with self._wake:
            while not self._stopped:
                self._wake.wait(TICK_SECONDS)
                if self._text is not None and not self._stopped:
                    self._show(self._text)
