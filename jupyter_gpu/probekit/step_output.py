"""What the user's step prints while a probe calls it, kept out of the notebook and counted for the report.

A loop body lifted by %%gpuprofile keeps its logging (`if i % 10 == 9: print(f"[{epoch}, {i}] loss: ...")`), and a
probe calls the step tens to hundreds of times: %speedprobe on a tutorial ResNet printed ten such loss lines above
its report, numbers of no training the user ran. While the step runs, `sys.stdout` and `sys.stderr` go to a sink
that counts the lines and keeps the first, and the notebook's tqdm bars are paused; the report says how many lines
were hidden. What the probe itself shows goes through IPython's display, not these streams.

Probe layer.
"""

from __future__ import annotations

import collections
import contextlib
import io
import sys
import threading
import warnings
from collections.abc import Iterable, Iterator
from typing import TextIO

MAX_SHOWN = 120  # characters of the first line the note quotes


class _Sink(io.TextIOBase):
    """Takes what the step writes; what the probe's own threads write (its progress line, which a terminal shell
    prints, ticking while the step runs) and the user's other Python threads go on to the stream it replaced.

    The step writes from more than its own thread: on CUDA, autograd runs the backward of CUDA nodes on a device
    thread of its own (engine.cpp's device_ready_queues_), so a tensor or module backward hook, an
    autograd.Function's backward or checkpoint's recomputation prints from there. Such a thread was started by
    torch's C++ code, not by Python's `threading`, which knows it only as a dummy thread; that is how its writes
    are told apart from the ticker's, whose thread Python started."""

    # Class-level defaults: a write that reaches a sink before its __init__ has run (the ticker's thread, while the
    # sink is set up or torn down) goes to the real stream instead of raising AttributeError in that thread.
    _output: StepOutput | None = None
    _replaced: TextIO | None = None
    _thread: int | None = None

    def __init__(self, output: StepOutput, replaced: TextIO) -> None:
        super().__init__()
        self._replaced = replaced
        self._thread = threading.get_ident()
        self._output = output  # last: a sink with an output is a sink ready to take writes

    def writable(self) -> bool:
        return True

    def _target(self) -> TextIO | None:
        """None where the step wrote it (it is taken), else the stream to pass it on to."""
        if self._output is None:
            return self._replaced or sys.__stdout__
        if threading.get_ident() == self._thread or isinstance(threading.current_thread(), _FOREIGN_THREAD):
            return None
        return self._replaced

    def write(self, text: str) -> int:
        target = self._target()
        if target is None:
            assert self._output is not None
            self._output.take(text)
            return len(text)
        return target.write(text)

    def flush(self) -> None:
        target = self._target()
        if target is not None:
            target.flush()


# What `threading.current_thread()` is in a thread Python did not start (torch's autograd device threads).
_FOREIGN_THREAD = getattr(threading, "_DummyThread", ())


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
    """Counts what the step printed under `hidden()`, over every call, and keeps what it warned apart: a warning
    goes to stderr, the sink, and would have been counted as a printed line and never seen (inductor warns once a
    process on its first compile on sm >= 8.0 without TF32)."""

    def __init__(self) -> None:
        self.lines = 0
        self.first: str | None = None
        self._partial = ""
        self.caught: list[warnings.WarningMessage] = []

    @contextlib.contextmanager
    def hidden(self) -> Iterator[None]:
        with contextlib.redirect_stdout(_Sink(self, sys.stdout)), contextlib.redirect_stderr(_Sink(self, sys.stderr)), \
                _bars_paused(), warnings.catch_warnings(record=True) as caught:
            try:
                yield
            finally:
                self.caught += caught

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

    def warning_notes(self) -> list[str]:
        return warning_notes(self.caught)


def warning_notes(caught: Iterable[warnings.WarningMessage]) -> list[str]:
    """One note per distinct warning, with how many times it came: what the probe's calls warned, shown once in the
    report instead of above it call after call."""
    counts = collections.Counter(f"{w.category.__name__}: {w.message}" for w in caught)
    return [f"warned while the probe ran{f' ({count} times)' if count > 1 else ''}: {text}"
            for text, count in counts.items()]
