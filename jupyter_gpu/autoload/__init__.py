"""A check at every kernel start, opt-in: `jupyter-gpu autoload on` adds this extension to an environment's
IPython kernel configuration, so each new kernel checks the GPU in a background process and says so, in one
line on the first cell, only when PyTorch cannot use it.

`config` holds the configuration block's text (pure), `install` reads and writes the file, `notice` turns a
check's JSON report into the one line, `startup` runs the check in a child process, `extension` is the
IPython glue. Importing this package imports none of them.
"""

from __future__ import annotations

from typing import Any


def load_ipython_extension(ipython: Any) -> None:
    from jupyter_gpu.autoload.extension import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from jupyter_gpu.autoload.extension import unload

    unload(ipython)
