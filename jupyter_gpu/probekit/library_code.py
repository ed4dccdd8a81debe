"""Which code is a library's and which is the user's: the one rule behind every place the package names "your line"
(a sync's line in `%%gpuprofile`, the line a probe's step failed on) or rewinds "your objects" (the classes the
probes put back, `%gpumem`'s module roots).

Library code is the interpreter's (its prefixes and standard library), every site-packages or dist-packages folder,
torch, and this package (whose frames run the user's step). Everything else is the user's: notebook cells (IPython
compiles them to `/tmp/ipykernel_*/…py` or `<ipython-input-…>`), their own `train_lib.py`, an editable install's
source. Importing this module imports nothing heavy.
"""

from __future__ import annotations

import functools
import os
import site
import sys
import sysconfig
from typing import Any

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # jupyter_gpu/
_INSTALL_FOLDER_NAMES = {"site-packages", "dist-packages"}
_FROZEN = "<frozen "  # the code file name of a module frozen into the interpreter (importlib, runpy)


def library_code_prefixes(torch: Any = None) -> tuple[str, ...]:
    """The interpreter's folders (its prefixes, the standard library), every site-packages, this package and torch
    (when given), each ending in a separator so that `/opt/py` does not cover `/opt/python-notes`, as written and
    with its links resolved, and the frozen modules' "<frozen importlib._bootstrap>": a code object's file name is
    compared with `str.startswith`, on a hot path, without resolving it. Worked out once per sys.path (it can
    change; resolving every folder costs about 0.5 ms, and the probes ask once per notebook object)."""
    return _prefixes(tuple(sys.path), os.path.abspath(torch.__file__) if torch is not None else None)


@functools.lru_cache(maxsize=8)
def _prefixes(path: tuple[str, ...], torch_file: str | None) -> tuple[str, ...]:
    folders = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, site.getusersitepackages(),
               *site.getsitepackages(), *(sysconfig.get_paths().get(key, "") for key in
                                          ("stdlib", "platstdlib", "purelib", "platlib"))}
    folders |= {entry for entry in path if os.path.basename(entry) in _INSTALL_FOLDER_NAMES}
    # A prefix of "/" (an interpreter installed at the root) would cover every folder, the user's too.
    found = {os.path.join(folder, "") for folder in folders if folder and os.path.dirname(folder) != folder}
    found.add(os.path.join(_PACKAGE, ""))
    if torch_file is not None:
        found.add(os.path.join(os.path.dirname(torch_file), ""))
    resolved = {os.path.join(os.path.realpath(folder), "") for folder in found}
    return (_FROZEN, *sorted(found | resolved))


def is_library_file(filename: str, torch: Any = None) -> bool:
    """Whether code in `filename` is a library's (see the module's docstring), not the user's."""
    if filename.startswith("<"):  # "<ipython-input-3-...>" and exec'd strings are the user's; importlib is not
        return filename.startswith(_FROZEN)
    path = os.path.realpath(filename)
    # By path component too: an installed package's folder need not be on this interpreter's lists (a venv's
    # site-packages seen from a kernel of another interpreter, a wheel unpacked on PYTHONPATH).
    return bool(_INSTALL_FOLDER_NAMES & set(path.split(os.sep))) or path.startswith(library_code_prefixes(torch))
