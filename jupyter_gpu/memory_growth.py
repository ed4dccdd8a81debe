"""The one rule for "this cell's memory grows run after run", and how a cell is named and keyed for it.

Pure. Shared by `%gpumem --watch`'s history and `%gpucells`' flags, so the two never disagree about which cell
leaks. A cell leaks when it ran at least twice and every run left at least LEAK_BYTES more behind than it found: a
cell that builds a model grows once, a cell that appends each loss tensor (and its graph) to a list grows each time
it runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

MIB = 1024 * 1024
LEAK_BYTES = MIB  # below this, growth is a counter or a cached scalar, not a leak worth a warning


def cell_key(source: str) -> str:
    """The same cell, run again, has the same key; an edited cell is a new one."""
    return hashlib.sha1(source.strip().encode("utf-8", "replace")).hexdigest()[:12]


def cell_label(source: str, width: int = 60) -> str:
    """The cell's first non-blank line, shortened."""
    line = next((line.strip() for line in source.splitlines() if line.strip()), "")
    return line if len(line) <= width else line[:width - 1] + "…"


def grew_every_run(growth: Sequence[int]) -> bool:
    """`growth`: the bytes each run of one cell left behind, in order. At least two runs, each LEAK_BYTES or more."""
    return len(growth) >= 2 and all(size >= LEAK_BYTES for size in growth)
