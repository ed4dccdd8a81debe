"""Paths as a facts snapshot records them: POSIX paths of the machine that was checked.

Diagnosis is a pure function of the snapshot, so the rules read these paths with `posixpath`, never the
replaying host's `os.path` (a snapshot from a Linux kernel diagnosed on Windows must give the same findings).
"""

from __future__ import annotations

import posixpath

# PYTHONPATH and PATH in a snapshot are split the way the checked (POSIX) machine splits them.
PATH_SEPARATOR = ":"


def prefix_of_interpreter(path: str) -> str:
    """/x/env/bin/python -> /x/env (the layout of venvs, conda envs and system Pythons alike)."""
    return posixpath.dirname(posixpath.dirname(path))
