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
from types import FrameType, TracebackType
from typing import Any

from jupyter_gpu.probekit.exceptions import exception_chain


def release_last_error(shell: Any | None) -> int:
    """Clear the locals of the frames the last cell's exception (and the exceptions it chains) keep alive.

    Module frames are left alone: their locals are the user's namespace. The printed traceback (files and line
    numbers) stays intact, but `%debug` afterwards shows no local variables. A frame that is still running,
    such as the caller's own, is skipped. Returns how many frames had locals to clear: 0 when no cell has
    failed, or when this already ran for the same error.
    """
    cleared = sum(_clear_frame(frame) for frame in last_error_frames(shell))
    # Tensors inside reference cycles (a module that stored its own output, an autograd graph) need the cycle
    # collector; the caller's torch.cuda.empty_cache() can only return blocks that are already free.
    gc.collect()
    return cleared


def last_error_frames(shell: Any | None) -> list[FrameType]:
    """The finished, non-module frames that the last error (and the errors it chains) keep alive, each once.

    IPython keeps that exception in several places, all read here: `sys.last_value`, `sys.last_exc` (3.12+),
    `sys.last_traceback`, the shell's `InteractiveTB.tb` and `last_execution_result.error_in_exec`.
    """
    exceptions: list[BaseException | None] = [getattr(sys, "last_value", None), getattr(sys, "last_exc", None)]
    tracebacks: list[TracebackType | None] = [getattr(sys, "last_traceback", None)]
    if shell is not None:
        result = getattr(shell, "last_execution_result", None)
        exceptions.append(getattr(result, "error_in_exec", None))
        # In IPython 9 this is the same traceback as sys.last_traceback; reading it too costs nothing and
        # covers a shell whose showtraceback did not set the sys attributes.
        tracebacks.append(getattr(getattr(shell, "InteractiveTB", None), "tb", None))
    seen_exceptions: set[int] = set()
    for exception in filter(None, exceptions):
        tracebacks.extend(linked.__traceback__ for linked in exception_chain(exception, seen_exceptions))
    return _finished_frames(tracebacks)


def clear_traceback_frames(traceback: TracebackType | None) -> int:
    """Clear the locals of every finished, non-module frame in `traceback`; returns how many had any.

    Unlike `traceback.clear_frames`, this also empties the frame's cached `f_locals` snapshot, which on Python
    3.11 and 3.12 keeps the cleared locals alive (gh-113939) once anything (IPython's traceback printer, a
    debugger) has read `f_locals`.
    """
    return sum(_clear_frame(frame) for frame in _finished_frames([traceback]))


def _finished_frames(tracebacks: list[TracebackType | None]) -> list[FrameType]:
    # The frames running now (the caller, the probe that caught the error) cannot be cleared, and reading
    # their f_locals would leave a snapshot holding their locals, the caught exception included, on 3.11/3.12.
    running: set[int] = set()
    current: FrameType | None = sys._getframe()
    while current is not None:
        running.add(id(current))
        current = current.f_back
    frames: list[FrameType] = []
    seen: set[int] = set()
    for traceback in tracebacks:
        while traceback is not None:
            frame = traceback.tb_frame
            traceback = traceback.tb_next
            # A module frame's locals are the namespace it ran in, the user's variables in a notebook cell:
            # nothing of the failed step lives there, so the frame is left alone (and not counted).
            if id(frame) in seen or id(frame) in running or frame.f_code.co_name == "<module>":
                continue
            seen.add(id(frame))
            frames.append(frame)
    return frames


def _clear_frame(frame: FrameType) -> int:
    """Clear one frame's locals; 1 if it had any, 0 if it was already clear or cannot be cleared."""
    # A suspended generator frame is closed by clear() before 3.13 and refused after. It is rare here: an
    # exception that escaped a generator ended it; only one caught inside a generator that went on leaves one.
    had_locals = bool(frame.f_locals)  # an already cleared frame is not counted again
    try:
        frame.clear()
    except RuntimeError:
        return 0  # still executing in another thread, or (3.13+) a suspended generator
    # Reading f_locals re-syncs the cached snapshot with the now empty frame and drops the old values; on
    # 3.13+ it is a cheap proxy and this does nothing.
    _ = frame.f_locals
    return 1 if had_locals else 0
