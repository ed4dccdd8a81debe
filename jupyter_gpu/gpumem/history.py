"""Which cell made memory grow: per-cell growth from `%gpumem --watch`'s records, and the cells that leak.

Pure. Which cell leaks is `memory_growth.grew_every_run`, the rule `%gpucells` flags with too.
"""

from __future__ import annotations

from jupyter_gpu.gpumem.result import CellRecord, Leak, growth_by_record
from jupyter_gpu.memory_growth import LEAK_BYTES, cell_key, cell_label, grew_every_run

__all__ = ["LEAK_BYTES", "NEW_ENTRIES", "cell_key", "cell_label", "find_leaks", "new_entries"]

NEW_ENTRIES = 3   # the largest new storages named per cell


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
        if grew_every_run(grew):
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
