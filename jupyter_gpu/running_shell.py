"""The IPython shell running this process, if any, found without importing IPython (a script that never loaded it
has no shell, and importing it would cost the script a second)."""

from __future__ import annotations

import sys
from typing import Any


def running_shell() -> Any | None:
    """The running InteractiveShell (a notebook's kernel, an IPython terminal), or None."""
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None
