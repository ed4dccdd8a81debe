"""What the user's step prints while a probe calls it, kept out of the notebook and counted for the report.

A loop body lifted by %%gpuprofile keeps its logging (`if i % 10 == 9: print(f"[{epoch}, {i}] loss: ...")`), and a
probe calls the step tens to hundreds of times: %speedprobe on a tutorial ResNet printed ten such loss lines above
its report, numbers of no training the user ran. While the step runs, `sys.stdout` and `sys.stderr` go to a sink
that counts the lines and keeps the first, and the notebook's tqdm bars are paused; the report says how many lines
were hidden. What the probe itself shows goes through IPython's display, not these streams.

Probe layer.
"""

from __future__ import annotations

import contextlib
import io
import sys
import threading
from collections.abc import Iterator
from typing import TextIO

MAX_SHOWN = 120  # characters of the first line the note quotes


class _Sink(io.TextIOBase):
    """Takes what the step's thread writes; another thread's writes (the probe's own progress line, which a
    terminal shell prints, ticking while the step runs) go on to the stream it replaced."""

    def __init__(self, output: StepOutput, replaced: TextIO) -> None:
        self._output = output
        self._replaced = replaced
        self._thread = threading.get_ident()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if threading.get_ident() != self._thread:
            return self._replaced.write(text)
        self._output.take(text)
        return len(text)

    def flush(self) -> None:
        if threading.get_ident() != self._thread:
            self._replaced.flush()


@contextlib.contextmanager
def _bars_paused() -> Iterator[None]:
    """The notebook's tqdm bars, disabled while the step runs. A bar draws to the stream it was made with, so the
    redirect does not reach it, and an HF-style loop body's `progress_bar.update(1)` would move and redraw the
    user's bar (in the cell output above) on every probe call; a disabled bar's `update` and `refresh` return at
    once, its count untouched."""
    module = sys.modules.get("tqdm.std")
    bars = [bar for bar in list(module.tqdm._instances) if not bar.disable] if module is not None else []
    for bar in bars:
        bar.disable = True
    try:
        yield
    finally:
        for bar in bars:
            bar.disable = False


class StepOutput:
    """Counts what the step printed under `hidden()`, over every call."""

    def __init__(self) -> None:
        self.lines = 0
        self.first: str | None = None
        self._partial = ""

    @contextlib.contextmanager
    def hidden(self) -> Iterator[None]:
        with contextlib.redirect_stdout(_Sink(self, sys.stdout)), contextlib.redirect_stderr(_Sink(self, sys.stderr)), \
                _bars_paused():
            yield

    def take(self, text: str) -> None:
        # A progress bar redraws its line with "\r": each redraw is a line the notebook would have shown.
        parts = (self._partial + text).replace("\r", "\n").split("\n")
        self._partial = parts.pop()
        for line in parts:
            if line.strip():
                self.lines += 1
                if self.first is None:
                    self.first = line.strip()[:MAX_SHOWN]

    def note(self, step_name: str) -> str | None:
        """One sentence for the report; None when the step printed nothing."""
        if self._partial.strip():
            self.take("\n")
        if not self.lines:
            return None
        plural = "line" if self.lines == 1 else "lines"
        return (f"`{step_name}` printed {self.lines:,} {plural} while the probe called it, not shown here (the "
                f"first: {self.first!r}); they come from the probe's calls, not from training")
