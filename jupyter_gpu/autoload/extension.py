"""The autoload extension: what `c.IPKernelApp.extensions.append("jupyter_gpu.autoload")` loads at kernel start.

Loading costs about a millisecond and touches nothing heavy: the magics are declared lazily (IPython
imports and registers them on first use), the check runs in a child process started from a daemon thread,
and the `--watch` sampler is acquired from that thread too. Output printed while a kernel starts is
discarded by the notebook, so the result waits for the first cell executed after the check finished: one
line when PyTorch cannot use the GPU, nothing otherwise, and never again in this kernel.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jupyter_gpu.autoload.config import WATCH_INTERVAL_S, WATCH_SECTION, is_silenced

if TYPE_CHECKING:
    from jupyter_gpu.autoload.startup import CheckChild, CheckOutcome
    from jupyter_gpu.metrics.hub import Lease


@dataclass
class AutoloadState:
    """This kernel's start-up check (one per process, so it never runs or speaks twice)."""

    load_seconds: float | None = None  # the extension's own load time, read by tests and the bench
    silenced: bool = False
    started: bool = False
    watch: bool = False
    finished: threading.Event = field(default_factory=threading.Event)
    outcome: CheckOutcome | None = None
    shown: str | None = None  # the line printed on a first cell, once
    watch_lease: Lease | None = None
    watch_problem: str | None = None
    child: CheckChild | None = None
    shell: Any = None  # the shell whose first cell shows the line


STATE = AutoloadState()
# The check child starts once the kernel has had time to finish starting (about 0.6 s here): started at once, its
# interpreter and imports competed with the kernel's own start, +75 ms at the median on 2 cores (bench_autoload).
START_DELAY_S = 0.5
_unloading = threading.Event()  # ends the wait when the extension is unloaded first
LAZY_SPEC = "jupyter_gpu"  # what IPython loads, as `%load_ext jupyter_gpu`, the first time one of its magics runs


def load(ipython: Any) -> None:
    started = time.perf_counter()
    declare_magics(ipython)
    if is_silenced(os.environ):
        STATE.silenced = True
    elif not STATE.started:
        from jupyter_gpu.magics.activity import activity_for

        activity_for(ipython)  # cell windows from the start, for %gpucheck's LOW_GPU_UTILIZATION (two event hooks)
        STATE.started = True
        STATE.watch = watch_setting(ipython)
        STATE.shell = ipython
        ipython.events.register("pre_run_cell", _show_on_first_cell)
        threading.Thread(target=_check_in_background, name="jupyter-gpu-autoload", daemon=True).start()
        atexit.register(_end_child)
    STATE.load_seconds = time.perf_counter() - started


def unload(ipython: Any) -> None:
    from IPython.core import magic

    from jupyter_gpu.magics.activity import close_activity

    _unloading.set()
    _unregister(ipython)
    close_activity(ipython)
    _end_child()
    if STATE.watch_lease is not None:
        STATE.watch_lease.close()
    manager = ipython.magics_manager
    placeholder = getattr(magic, "LazyMagic", None)  # IPython 9's visible placeholders; IPython 8 has none
    for kind, names in _magic_names().items():
        for name in names:
            if manager.lazy_magics.get(name) == LAZY_SPEC:
                del manager.lazy_magics[name]  # else the next use would load jupyter_gpu all the same
            if placeholder is not None and isinstance(manager.magics[kind].get(name), placeholder):
                del manager.magics[kind][name]  # a loaded `jupyter_gpu` keeps its real magics


def declare_magics(ipython: Any) -> None:
    """Declare jupyter_gpu's magics lazily: they show in %lsmagic and completion, and the first use of any
    runs `%load_ext jupyter_gpu`, so kernel start pays nothing for importing them."""
    manager = ipython.magics_manager
    if not hasattr(manager, "register_lazy"):  # an IPython without lazy magics: load them now
        import jupyter_gpu

        jupyter_gpu.load_ipython_extension(ipython)
        return
    names = _magic_names()
    for name in sorted({*names["line"], *names["cell"]}):
        kind = "line_cell" if name in names["line"] and name in names["cell"] else (
            "line" if name in names["line"] else "cell")
        try:
            manager.register_lazy(name, LAZY_SPEC, kind)
        except TypeError:  # IPython 8: lazy magics by name only, for either kind
            manager.register_lazy(name, LAZY_SPEC)


def _magic_names() -> dict[str, list[str]]:
    from jupyter_gpu.magics import MAGIC_NAMES  # the package's __init__ only: no magic is imported

    return MAGIC_NAMES


def watch_setting(ipython: Any) -> bool:
    # A section no Configurable owns: read with .get, because attribute access would create it.
    section = ipython.config.get(WATCH_SECTION) or {}
    return section.get("watch") is True


def _check_in_background() -> None:
    # Imported here, on the thread: the report model and the rules it names stay out of the load time.
    from jupyter_gpu.autoload.notice import could_not_run_notice
    from jupyter_gpu.autoload.startup import CheckChild, CheckOutcome

    if _unloading.wait(START_DELAY_S):
        return
    try:
        STATE.child = CheckChild()
    except OSError as exc:
        STATE.outcome = CheckOutcome(could_not_run_notice(f"cannot start {sys.executable}: {exc.strerror}"), None)
        STATE.finished.set()
        return
    if STATE.watch:
        _keep_sampling()
    STATE.outcome = STATE.child.wait()
    STATE.finished.set()


def _keep_sampling() -> None:
    """--watch: hold a slow lease on the shared sampler for the kernel's life (NVML, never CUDA)."""
    from jupyter_gpu.metrics.hub import shared_hub

    try:
        STATE.watch_lease = shared_hub().acquire(interval=WATCH_INTERVAL_S)
    except ValueError as exc:  # a JUPYTER_GPU_BACKEND that names no backend: %gpupanel says so when used
        STATE.watch_problem = str(exc)


def _show_on_first_cell(*_info: Any) -> None:
    if not STATE.finished.is_set():
        return  # still checking: the first cell after it finishes gets the line, and this one runs unhindered
    _unregister(STATE.shell)
    notice = STATE.outcome.notice if STATE.outcome else None
    if notice and STATE.shown is None:
        STATE.shown = notice
        print(notice, file=sys.stderr, flush=True)


def _unregister(ipython: Any) -> None:
    if ipython is not None and _show_on_first_cell in ipython.events.callbacks["pre_run_cell"]:
        ipython.events.unregister("pre_run_cell", _show_on_first_cell)


def _end_child() -> None:
    if STATE.child is not None:
        STATE.child.kill()
