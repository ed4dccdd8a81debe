"""The autoload block in an environment's `ipython_kernel_config.py`: where the file is, and its text.

Pure text functions: `add_block` and `remove_block` keep every other line of the file as it was, because
IPython reads one such file per environment (no `.d/` fragments), so other tools and the user share it.

The block appends to `c.IPKernelApp.extensions` lazily (traitlets' LazyConfigValue): an append merges with
extensions configured in the other config files (the profile's, /etc/ipython's), and, being in the
IPKernelApp section, it also survives a plain `c.InteractiveShellApp.extensions = [...]` anywhere (traitlets
applies a subclass's section after its parent's). Only a plain `c.IPKernelApp.extensions = [...]` in a file
read later (the profile) or further down this file replaces it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

EXTENSION = "jupyter_gpu.autoload"
SILENCE_VARIABLE = "JUPYTER_GPU_AUTOLOAD"
SILENCING_VALUES = frozenset({"0", "off", "false", "no"})
WATCH_SECTION = "JupyterGpuAutoload"  # a config section of its own, read from `shell.config` in the kernel
WATCH_INTERVAL_S = 2.0  # the low rate kept up by --watch: enough for a utilisation trend, almost no cost

BEGIN = "# >>> jupyter-gpu autoload >>>"
END = "# <<< jupyter-gpu autoload <<<"
_EXTENSION_LINE = f'c.IPKernelApp.extensions.append("{EXTENSION}")'
_WATCH_LINE = f"c.{WATCH_SECTION}.watch = True"
_WATCH_PATTERN = re.compile(rf"^\s*c\.{WATCH_SECTION}\.watch\s*=\s*True\b", re.MULTILINE)


class BlockError(ValueError):
    """The file holds a damaged autoload block, as one sentence a user can act on."""


@dataclass(frozen=True)
class BlockState:
    on: bool
    watch: bool


def config_file(prefix: str | Path) -> Path:
    """The kernel configuration IPython reads for every kernel whose `sys.prefix` is `prefix`.

    IPython/core/application.py puts `{sys.prefix}/etc/ipython` in ENV_CONFIG_DIRS, and ipykernel's
    IPKernelApp (name "ipython-kernel") reads `ipython_kernel_config.py` there.
    """
    return Path(prefix) / "etc" / "ipython" / "ipython_kernel_config.py"


def render_block(*, watch: bool) -> str:
    lines = [
        BEGIN,
        "# Added by `jupyter-gpu autoload on`; `jupyter-gpu autoload off` removes this block (and only it).",
        "# Each new kernel of this environment checks in the background whether PyTorch can use the GPU and,",
        f"# only if not, says so in one line on the first cell. {SILENCE_VARIABLE}=0 silences it.",
        _EXTENSION_LINE,
    ]
    if watch:
        lines += ["# --watch: keep the low-rate GPU sampler running for the kernel's life.", _WATCH_LINE]
    return "\n".join([*lines, END]) + "\n"


def _span(text: str) -> tuple[int, int] | None:
    """Start and end offsets of the block's lines (end after END's newline), or None when there is none."""
    begin = _line_start(text, BEGIN)
    if begin is None:
        return None
    end = _line_start(text, END, begin)
    if end is None:
        raise BlockError(f"The jupyter-gpu block has its first line ({BEGIN!r}) but not its last ({END!r}); "
                         "fix or delete it by hand.")
    newline = text.find("\n", end)
    return begin, len(text) if newline == -1 else newline + 1


def _line_start(text: str, line: str, start: int = 0) -> int | None:
    match = re.compile(rf"^{re.escape(line)}[ \t]*$", re.MULTILINE).search(text, start)
    return match.start() if match else None


def read_block(text: str) -> BlockState:
    span = _span(text)
    if span is None:
        return BlockState(on=False, watch=False)
    return BlockState(on=True, watch=bool(_WATCH_PATTERN.search(text, *span)))


def add_block(text: str, *, watch: bool) -> str:
    """The file's text with our block, set to `watch`: an existing block is rewritten in place, else appended.

    Appended at the end, so an assignment earlier in the file cannot replace our append.
    """
    block = render_block(watch=watch)
    span = _span(text)
    if span is not None:
        return text[: span[0]] + block + text[span[1]:]
    if not text.strip():
        return block
    return text.rstrip("\n") + "\n\n" + block


def remove_block(text: str) -> str:
    """The file's text without our block (and the blank line `add_block` put before it)."""
    span = _span(text)
    if span is None:
        return text
    before, after = text[: span[0]], text[span[1]:]
    if before.endswith("\n\n"):
        before = before[:-1]
    return before + after


def is_silenced(env: Mapping[str, str]) -> bool:
    return env.get(SILENCE_VARIABLE, "").strip().lower() in SILENCING_VALUES
