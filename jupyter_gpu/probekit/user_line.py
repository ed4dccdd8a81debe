"""The user's own line in a traceback: the innermost frame that is not torch, the standard library, an installed
package or jupyter-gpu, named as IPython names notebook cells ("Cell In[3], line 4, in step: `...`").

Used to say *where* a step did something the probe cannot follow (read a tensor's value under fake tensors).
IPython is not imported here: when it is not loaded, there is no cell to name.
"""

from __future__ import annotations

import linecache
import os
from typing import Any

from jupyter_gpu.probekit.library_code import is_library_file
from jupyter_gpu.running_shell import running_shell

# A source line quoted in a message is cut here: the place is what matters, not a long expression.
QUOTED_LINE_CHARS = 120


def innermost_user_frame(torch: Any, frames: list[tuple[Any, int]]) -> int | None:
    """The index of the innermost frame that is neither torch, nor the standard library, nor an installed
    package, nor this package (whose frames run the step): the user's own line that led to the error."""
    for index in range(len(frames) - 1, -1, -1):
        filename = frames[index][0].f_code.co_filename
        if not is_library_file(filename, torch):
            return index
    return None


def in_torch(torch: Any, filename: str, *folders: str) -> bool:
    """Whether a code file is inside the torch package (in its subfolder `folders` when given)."""
    root = os.path.join(os.path.dirname(os.path.realpath(torch.__file__)), *folders, "")
    return not filename.startswith("<") and os.path.realpath(filename).startswith(root)


def place_of(frame: Any, lineno: int) -> str:
    """The line as IPython's tracebacks name it, with its text: "Cell In[3], line 4, in step: `...`"."""
    filename = frame.f_code.co_filename
    text = linecache.getline(filename, lineno, frame.f_globals).strip()
    if len(text) > QUOTED_LINE_CHARS:
        text = text[:QUOTED_LINE_CHARS - 3] + "..."
    where = f"{_code_name(filename)}, line {lineno}, in {frame.f_code.co_name}"
    return f"{where}: `{text}`" if text else where


def _code_name(filename: str) -> str:
    """A notebook cell as IPython names it, "Cell In[3]" (its file is /tmp/ipykernel_*/....py or
    <ipython-input-3-...>); else the file's name."""
    shell = running_shell()  # none where IPython is not loaded: there is no cell to name
    label = getattr(getattr(shell, "compile", None), "format_code_name", lambda name: None)(filename)
    if label is not None:
        return " ".join(label)
    return os.path.basename(filename) or filename
