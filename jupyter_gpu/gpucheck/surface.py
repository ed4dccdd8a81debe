"""The same finding, worded for where it is read. The rules write for the notebook (`%pip`, `%env`, restart the
kernel), where most users meet them; `jupyter-gpu check` and `./dev check` print to a terminal or a CI log, where
there is no kernel to restart and `%pip` is not a command. There the fix is `python -m pip` with the interpreter
that runs torch (a bare `pip` may belong to another environment), `export`, and starting Python again.

One table of rewrites for every finding, so that a new rule's wording is covered without a second copy of it; a test
renders every finding of the generated machines both ways (tests/gpucheck/test_surface_wording.py).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from jupyter_gpu.models import Finding

NOTEBOOK, TERMINAL = "notebook", "terminal"

# (pattern, replacement) in order: the longer phrases before the words they contain. A replacement may use the
# interpreter ({python}).
_REWRITES: list[tuple[str, str]] = [
    (r"Or install into this kernel itself with %pip \(never !pip, which may target another env\):",
     "Or install into this Python itself with {python} -m pip (a bare pip may target another environment):"),
    (r"Install packages from the notebook with %pip, which targets this kernel\.",
     "Install packages with {python} -m pip, which targets this Python."),
    (r"Kernel → Restart Kernel, then run the notebook from the top\.",
     "Start Python again, then run your script from the top."),
    (r"Kernel → Change Kernel → ", "Run with the Python of the Jupyter kernel "),
    (r"# then Kernel → Change Kernel", "# or run your script with that environment's Python"),
    (r"\s*\((?:Kernel → Restart Kernel|Kernel > Restart)\)", ""),
    (r"\(then restart the kernel\)", "(then start Python again)"),
    (r"Restart the kernel", "Start Python again"),
    (r"restart the kernel", "start Python again"),
    (r"Run this notebook on", "Run this on"),
    (r"run the notebook again", "run it again"),
    (r"this notebook's container", "this container"),
    (r"next to the notebook", "next to your script"),
    (r"In this notebook, drop the stale values: ", "Drop the stale values (`unset` them in the shell, or in Python): "),
    (r"defined in this notebook", "defined in a notebook"),
    (r"from this notebook", "from a notebook"),
    (r"in this notebook", "in this Python"),
    (r"this kernel's", "this Python's"),
    (r"this kernel", "this Python"),
    (r"`%gpucheck` \(or `jupyter-gpu check`\)", "`jupyter-gpu check`"),
    (r"`%gpucheck`", "`jupyter-gpu check`"),
    (r"%pip\b", "{python} -m pip"),
    (r"%env (\w+)=", r"export \1="),
]
_COMPILED = [(re.compile(pattern), replacement) for pattern, replacement in _REWRITES]


def for_terminal(text: str, python: str) -> str:
    """`text` as a terminal reads it: pip through `python` (quoted for a shell), no kernel, no notebook."""
    quoted = shlex.quote(python)
    for pattern, replacement in _COMPILED:
        text = pattern.sub(_expand(replacement, quoted), text)
    return text


def _expand(replacement: str, python: str) -> str | Callable[[re.Match[str]], str]:
    if "{python}" not in replacement:
        return replacement
    filled = replacement.replace("{python}", python)
    return lambda match: filled  # a function: the interpreter's path may hold backslashes (Windows)


def finding_for_terminal(finding: Finding, python: str) -> Finding:
    """A finding as a terminal reads it: headline, fix lines and evidence (evidence quotes fixes too: "not suggested
    here: `%pip install ...`")."""
    def words(value: Any) -> Any:
        if isinstance(value, str):
            return for_terminal(value, python)
        return [words(item) for item in value] if isinstance(value, list) else value

    return replace(finding, headline=words(finding.headline), fix=words(finding.fix),
                   evidence={key: words(value) for key, value in finding.evidence.items()})


def worded(text: str, surface: str, python: str) -> str:
    return for_terminal(text, python) if surface == TERMINAL else text
