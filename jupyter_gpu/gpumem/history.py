"""Which cell made memory grow: per-cell growth from `%gpumem --watch`'s records, and the cells that leak.

Pure. A cell leaks when it ran at least twice and every run left at least LEAK_BYTES more behind than it found:
a cell that builds a model grows once, a cell that appends each loss tensor (and its graph) to a list grows each
time it runs.
"""

from __future__ import annotations

import hashlib

from jupyter_gpu.gpumem.result import CellRecord, Leak, growth_by_record

MIB = 1024 * 1024
LEAK_BYTES = MIB  # below this, growth is a counter or a cached scalar, not a leak worth a warning
NEW_ENTRIES = 3   # the largest new storages named per cell


def cell_key(source: str) -> str:
    """The same cell, run again, has the same key; an edited cell is a new one."""
    return hashlib.sha1(source.strip().encode("utf-8", "replace")).hexdigest()[:12]


def cell_label(source: str, width: int = 60) -> str:
    """The cell's first non-blank line, shortened."""
    line = next((line.strip() for line in source.splitlines() if line.strip()), "")
    return line if len(line) <= width else line[:width - 1] + "…"


def find_leaks(records: list[CellRecord]) -> list[Leak]:
    """The cells that ran at least twice and grew by at least LEAK_BYTES every time, in the order they first ran.

    The first record is the baseline taken when watching started; its growth is unknown, so it is never a run.
    """
    growth = growth_by_record(records)
    runs: dict[str, list[int]] = {}
    for index, record in enumerate(records[1:], start=1):
        runs.setdefault(record.cell_key, []).append(index)
    leaks: list[Leak] = []
    for key, indices in runs.items():
        grew = [growth[i] for i in indices]
        if len(indices) >= 2 and all(size >= LEAK_BYTES for size in grew):
            last = records[indices[-1]]
            leaks.append(Leak(cell=last.cell, cell_key=key, runs=tuple(records[i].execution_count for i in indices),
                              growth=tuple(grew), new_entries=last.new_entries))
    return leaks


def new_entries(previous: dict[tuple[str, int], tuple[str, int]],
                current: dict[tuple[str, int], tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    """(path, bytes) of the largest holders of storages in `current` that `previous` did not have; the storages of
    one path (the tensors a graph saved) are summed, as the map's table shows them."""
    added: dict[str, int] = {}
    for key in current.keys() - previous.keys():
        path, size = current[key]
        added[path] = added.get(path, 0) + size
    return tuple(sorted(added.items(), key=lambda pair: -pair[1])[:NEW_ENTRIES])
