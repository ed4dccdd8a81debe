"""Freeing what a failed cell's exception keeps alive, in a real IPython shell with real torch tensors."""

from __future__ import annotations

import contextlib
import gc
import io
import sys
import traceback
import weakref
from collections.abc import Iterator

import pytest
import torch
from IPython.core.interactiveshell import ExecutionResult, InteractiveShell

from jupyter_gpu.batchprobe.oom import FailureKind, classify
from jupyter_gpu.probekit.release import clear_traceback_frames, release_last_error

SETUP = """
import torch, weakref
REFS = []
keep = torch.ones(3)

def step(bs):
    activations = torch.empty(bs, 1024)
    REFS.append(weakref.ref(activations))
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
"""

# Two ways an OOM ends up chained: re-raised with `from`, and a second error while handling it (implicit
# __context__). In the second, the frame that ran out of memory is reachable only through the context.
CHAINED = {
    "explicit-cause": """
def inner(bs):
    activations = torch.empty(bs, 1024)
    REFS.append(weakref.ref(activations))
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

def outer(bs):
    batch = torch.empty(bs, 512)
    REFS.append(weakref.ref(batch))
    try:
        inner(bs)
    except torch.OutOfMemoryError as oom:
        raise RuntimeError("step failed") from oom
""",
    "implicit-context": """
def inner(bs):
    activations = torch.empty(bs, 1024)
    REFS.append(weakref.ref(activations))
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

def cleanup(bs):
    scratch = torch.empty(bs, 256)
    REFS.append(weakref.ref(scratch))
    raise ValueError("logging the failure failed")

def outer(bs):
    batch = torch.empty(bs, 512)
    REFS.append(weakref.ref(batch))
    try:
        inner(bs)
    except torch.OutOfMemoryError:
        cleanup(bs)
""",
}


@pytest.fixture
def ip(shell: InteractiveShell) -> Iterator[InteractiveShell]:
    names = set(shell.user_ns)
    mode = shell.InteractiveTB.mode
    yield shell
    shell.InteractiveTB.set_mode(mode)
    for name in set(shell.user_ns) - names:
        del shell.user_ns[name]


def run_quietly(shell: InteractiveShell, cell: str) -> ExecutionResult:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return shell.run_cell(cell)


def alive(shell: InteractiveShell) -> list[bool]:
    gc.collect()
    return [ref() is not None for ref in shell.user_ns["REFS"]]


def formatted(shell: InteractiveShell) -> str:
    error = shell.last_execution_result.error_in_exec
    assert error is not None
    python_text = "".join(traceback.format_exception(error))
    ipython_text = shell.InteractiveTB.stb2text(
        shell.InteractiveTB.structured_traceback(type(error), error, error.__traceback__)
    )
    return python_text + ipython_text


@pytest.mark.parametrize("xmode", ["Context", "Verbose", "Plain"])
def test_the_failed_steps_tensors_are_freed_and_the_namespace_kept(ip: InteractiveShell, xmode: str) -> None:
    # Context and Verbose read the frames' f_locals when printing: the case where frame.clear() alone is not
    # enough on Python 3.11 and 3.12.
    ip.InteractiveTB.set_mode(xmode)
    assert run_quietly(ip, SETUP).success
    keep = ip.user_ns["keep"]
    result = run_quietly(ip, "step(64)")
    assert isinstance(result.error_in_exec, torch.OutOfMemoryError)
    assert alive(ip) == [True]  # the failed cell really holds the tensor, so this test can fail

    assert release_last_error(ip) >= 1

    assert alive(ip) == [False]
    assert ip.user_ns["keep"] is keep and callable(ip.user_ns["step"]) and len(ip.user_ns["REFS"]) == 1
    text = formatted(ip)
    assert "in step" in text and "CUDA out of memory. Tried to allocate 2.00 GiB" in text
    assert run_quietly(ip, "step(8)").error_in_exec is not None  # the user's function still works


@pytest.mark.parametrize("variant", sorted(CHAINED))
def test_an_oom_chained_in_another_error_is_freed(ip: InteractiveShell, variant: str) -> None:
    assert run_quietly(ip, SETUP + CHAINED[variant]).success
    result = run_quietly(ip, "outer(32)")
    failure = classify(result.error_in_exec)
    assert failure is not None and (failure.kind, failure.chained) == (FailureKind.OUT_OF_MEMORY, True)
    assert all(alive(ip)) and len(alive(ip)) >= 2

    assert release_last_error(ip) >= 2

    assert not any(alive(ip))
    assert "in inner" in formatted(ip)


def test_a_module_level_tensor_is_not_freed(ip: InteractiveShell) -> None:
    # The cell's own (module) frame has the user's namespace as its locals: clearing it would delete variables.
    assert run_quietly(ip, SETUP).success
    cell = (
        "big = torch.empty(64, 1024)\n"
        "REFS.append(weakref.ref(big))\n"
        "raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')\n"
    )
    assert run_quietly(ip, cell).error_in_exec is not None
    release_last_error(ip)
    assert alive(ip) == [True]
    assert ip.user_ns["REFS"][0]() is ip.user_ns["big"]


def test_with_no_previous_error_it_does_nothing(ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> None:
    # pytest itself sets sys.last_* for a failed test; a fresh kernel has none of these.
    for name in ("last_value", "last_exc", "last_traceback", "last_type"):
        monkeypatch.delattr(sys, name, raising=False)
    monkeypatch.setattr(ip.InteractiveTB, "tb", None, raising=False)
    assert run_quietly(ip, "ok = 1").success
    assert release_last_error(ip) == 0
    assert release_last_error(None) == 0
    assert ip.user_ns["ok"] == 1


def test_calling_twice_is_safe(ip: InteractiveShell) -> None:
    assert run_quietly(ip, SETUP).success
    run_quietly(ip, "step(16)")
    assert release_last_error(ip) >= 1
    assert release_last_error(ip) == 0  # the frames are already empty
    assert alive(ip) == [False]
    assert "in step" in formatted(ip)


def test_the_probe_can_clear_its_own_caught_error() -> None:
    refs: list[weakref.ref[torch.Tensor]] = []

    def step(bs: int) -> None:
        activations = torch.empty(bs, 1024)
        refs.append(weakref.ref(activations))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    survivor = torch.ones(2)
    try:
        step(64)
    except torch.OutOfMemoryError as error:
        error_ref = weakref.ref(error)
        assert refs[0]() is not None
        # This frame is running, so it is skipped; only step's frame is cleared, and its tensor freed by refcount.
        assert clear_traceback_frames(error.__traceback__) == 1
        assert refs[0]() is None
    # Nothing (such as an f_locals snapshot of this running frame) keeps the caught exception past the handler.
    assert error_ref() is None
    assert survivor.sum().item() == 2
    assert clear_traceback_frames(None) == 0
