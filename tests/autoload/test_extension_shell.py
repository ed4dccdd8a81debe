"""Loading and unloading the autoload extension in a real IPython shell (silenced: no check is started here)."""

from __future__ import annotations

import pytest
from IPython.core.magic import LazyMagic

from jupyter_gpu.autoload import extension
from jupyter_gpu.magics import MAGIC_NAMES


def declared(shell) -> dict[str, list[str]]:
    return {kind: sorted(name for name in names if isinstance(shell.magics_manager.magics[kind].get(name), LazyMagic))
            for kind, names in MAGIC_NAMES.items()}


@pytest.mark.timing
def test_silenced_it_declares_every_magic_lazily_and_checks_nothing(shell, monkeypatch):
    monkeypatch.setenv("JUPYTER_GPU_AUTOLOAD", "off")
    callbacks = list(shell.events.callbacks["pre_run_cell"])
    if "jupyter_gpu" in shell.extension_manager.loaded:  # another test loaded it: start from a clean shell
        shell.run_line_magic("unload_ext", "jupyter_gpu")
    shell.run_line_magic("load_ext", "jupyter_gpu.autoload")
    try:
        assert declared(shell) == {kind: sorted(names) for kind, names in MAGIC_NAMES.items()}
        assert "gpucheck" not in shell.magics_manager.magics["cell"]  # a line magic only is not declared as a cell one
        assert extension.STATE.silenced and not extension.STATE.started
        assert shell.events.callbacks["pre_run_cell"] == callbacks
        assert extension.STATE.load_seconds is not None and extension.STATE.load_seconds < 0.25
    finally:
        shell.run_line_magic("unload_ext", "jupyter_gpu.autoload")
    assert declared(shell) == {kind: [] for kind in MAGIC_NAMES}
    assert shell.find_line_magic("gpucheck") is None  # gone, not merely waiting to load on next use
    assert "jupyter_gpu" not in shell.extension_manager.loaded


def test_unloading_keeps_magics_a_loaded_jupyter_gpu_registered(shell, monkeypatch):
    monkeypatch.setenv("JUPYTER_GPU_AUTOLOAD", "0")
    shell.run_line_magic("load_ext", "jupyter_gpu.autoload")
    shell.run_line_magic("load_ext", "jupyter_gpu")  # the user's own %load_ext: real magics replace the placeholders
    try:
        shell.run_line_magic("unload_ext", "jupyter_gpu.autoload")
        assert not isinstance(shell.magics_manager.magics["line"]["gpucheck"], LazyMagic)
        assert callable(shell.magics_manager.magics["line"]["gpucheck"])
    finally:
        shell.run_line_magic("unload_ext", "jupyter_gpu")
