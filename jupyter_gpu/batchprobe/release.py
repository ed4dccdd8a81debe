"""Free the tensors that a failed cell's exception keeps alive, without touching the user's variables.

When an exception escapes a notebook cell, every frame it passed through stays alive, and each frame keeps its
locals: the activations, the batch and the partial outputs of the step that ran out of memory. IPython keeps
that exception in several places (`sys.last_value`, `sys.last_exc` on 3.12+, `sys.last_traceback`,
`shell.InteractiveTB.tb` and `shell.last_execution_result.error_in_exec`); dropping some of them frees nothing,
because the others still hold it (research notes §1.7, checked on Python 3.11-3.13 with IPython 9).

Clearing the frames instead of dropping the references frees the memory through all holders at once and
keeps the traceback printable. No torch import: the caller empties the device cache afterwards.
"""

from __future__ import annotations

import gc
import sys
from types import TracebackType
from typing import Any

from jupyter_gpu.batchprobe.oom import exception_chain


def release_last_error(shell: Any | None) -> int:
    """Clear the locals of the frames the last cell's exception (and the exceptions it chains) keep alive.

    Module frames are left alone: their locals are the user's namespace. The printed traceback (files and line
    numbers) stays intact, but `%debug` afterwards shows no local variables. A frame that is still running,
    such as the caller's own, is skipped. Returns how many frames had locals to clear: 0 when no cell has
    failed, or when this already ran for the same error.
    """
    exceptions: list[BaseException | None] = [getattr(sys, "last_value", None), getattr(sys, "last_exc", None)]
    tracebacks: list[TracebackType | None] = [getattr(sys, "last_traceback", None)]
    if shell is not None:
        result = getattr(shell, "last_execution_result", None)
        exceptions.append(getattr(result, "error_in_exec", None))
        # In IPython 9 this is the same traceback as sys.last_traceback; clearing it too costs nothing and
        # covers a shell whose showtraceback did not set the sys attributes.
        tracebacks.append(getattr(getattr(shell, "InteractiveTB", None), "tb", None))
    seen_frames: set[int] = set()
    seen_exceptions: set[int] = set()
    cleared = 0
    for exception in filter(None, exceptions):
        for linked in exception_chain(exception, seen_exceptions):
            cleared += _clear_frames(linked.__traceback__, seen_frames)
    for traceback in tracebacks:
        cleared += _clear_frames(traceback, seen_frames)
    # Tensors inside reference cycles (a module that stored its own output, an autograd graph) need the cycle
    # collector; the caller's torch.cuda.empty_cache() can only return blocks that are already free.
    gc.collect()
    return cleared


def clear_traceback_frames(traceback: TracebackType | None) -> int:
    """Clear the locals of every finished, non-module frame in `traceback`; returns how many had any.

    Unlike `traceback.clear_frames`, this also empties the frame's cached `f_locals` snapshot, which on Python
    3.11 and 3.12 keeps the cleared locals alive (gh-113939) once anything (IPython's traceback printer, a
    debugger) has read `f_locals`.
    """
    return _clear_frames(traceback, set())


def _clear_frames(traceback: TracebackType | None, seen: set[int]) -> int:
    # The frames running now (the caller, the probe that caught the error) cannot be cleared, and reading
    # their f_locals would leave a snapshot holding their locals, the caught exception included, on 3.11/3.12.
    running: set[int] = set()
    current = sys._getframe()
    while current is not None:
        running.add(id(current))
        current = current.f_back
    cleared = 0
    while traceback is not None:
        frame = traceback.tb_frame
        traceback = traceback.tb_next
        if id(frame) in seen or id(frame) in running:
            continue
        seen.add(id(frame))
        # A module frame's locals are the namespace it ran in, the user's variables in a notebook cell: nothing
        # of the failed step lives there, so the frame is left alone (and not counted).
        if frame.f_code.co_name == "<module>":
            continue
        # A suspended generator frame is closed by clear() before 3.13 and refused after. It is rare here: an
        # exception that escaped a generator ended it; only one caught inside a generator that went on leaves one.
        had_locals = bool(frame.f_locals)  # an already cleared frame is not counted again
        try:
            frame.clear()
        except RuntimeError:
            continue  # still executing in another thread, or (3.13+) a suspended generator
        # Reading f_locals re-syncs the cached snapshot with the now empty frame and drops the old values; on
        # 3.13+ it is a cheap proxy and this does nothing.
        _ = frame.f_locals
        if had_locals:
            cleared += 1
    return cleared
