"""Plain data about one `%gpumem` run: the memory map, a release, and the per-cell history, shaped like IPython's
`TimeitResult` (text, escaped HTML, `to_dict()`)."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from jupyter_gpu.models import RichResult

# What holds a storage, in the order that decides an entry's kind when several holders reach it: the most specific
# holder names it (`model.fc.weight`, not `w` or `Out[3]`), and every other name is listed beside it.
KINDS = ("parameter", "buffer", "gradient", "optimizer state", "user variable", "output cache", "traceback",
         "autograd graph")
KIND_RANK = {kind: rank for rank, kind in enumerate(KINDS)}
MAX_NAMES = 8  # names kept per storage; the rest are counted


@dataclass(frozen=True)
class MemoryEntry:
    """One tensor storage, counted once, with every path that reaches it (views of it included)."""

    path: str                      # the name a user would type: "model.fc.weight", "Out[12]", "graph of loss"
    kind: str                      # one of KINDS
    device: str                    # "cuda:0", "cpu"
    dtype: str                     # "float32"
    shape: tuple[int, ...]         # the shape of the first tensor found on this storage
    bytes: int                     # the storage's bytes (a view's storage is counted whole, once)
    names: tuple[str, ...] = ()    # every path found, `path` first (at most MAX_NAMES)
    more_names: int = 0            # paths found beyond those kept in `names`
    address: int = 0               # the storage's data pointer: matches a block of torch.cuda.memory._snapshot()

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "shape": list(self.shape), "names": list(self.names)}


@dataclass(frozen=True)
class DeviceTotals:
    """What one device holds, as named by the walk and as its allocator (or the live-storage count) sees it."""

    device: str                    # "cuda:0", "cpu"
    named_bytes: int               # the storages the walk named on this device
    total_bytes: int | None        # torch.cuda.memory_allocated(), or the bytes of all live CPU storages
    total_source: str              # where total_bytes comes from, in words
    reserved_bytes: int | None = None       # CUDA: torch.cuda.memory_reserved()
    inactive_split_bytes: int | None = None  # CUDA: memory_stats()["inactive_split_bytes.all.current"]
    process_bytes: int | None = None        # CUDA: NVML's used memory for this process on the device
    expandable_segments: bool = False       # PYTORCH_CUDA_ALLOC_CONF has expandable_segments:True
    unreached_bytes: int = 0       # storages the garbage collector sees as tensors that no notebook path reaches

    @property
    def coverage(self) -> float | None:
        """Named bytes over the total; None when the total is unknown or zero."""
        if not self.total_bytes:
            return None
        return min(self.named_bytes / self.total_bytes, 1.0)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "coverage": self.coverage}


@dataclass(frozen=True)
class Remainder:
    """A part of a device's memory that no path names, labelled with what holds it and what to do about it."""

    device: str
    label: str                     # "not reachable from Python (autograd buffers, C++ caches)", "allocator cache", ...
    bytes: int
    advice: str | None = None      # the line to type, when there is one

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Release:
    """A line that empties a holder the map named without deleting the variable: an lru_cache'd function's cache."""

    line: str                      # what to type: "class_prototype.cache_clear()"
    holder: str                    # what it empties, in words: "the lru_cache of class_prototype"
    bytes: int                     # the storages named under the holder (another name may keep some alive)
    keeps: str = ""                # what stays: "the function stays"
    target: str = ""               # the holder's path, which `%gpumem --free` accepts: "class_prototype"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, repr=False)
class MemoryMap(RichResult):
    renderer: ClassVar[str] = "jupyter_gpu.gpumem.render"

    entries: tuple[MemoryEntry, ...]         # largest first
    devices: tuple[DeviceTotals, ...]        # the devices explained, CUDA first
    remainders: tuple[Remainder, ...] = ()
    releases: tuple[Release, ...] = ()       # lines that empty a named holder and keep it (`f.cache_clear()`)
    notes: tuple[str, ...] = ()              # walk limits reached, attributes that raised, CUDA not initialised
    top: int = 20                            # how many rows the report shows (the rest are summed)
    objects_visited: int = 0
    seconds: float = 0.0                     # how long the walk and the reconciliation took

    @property
    def coverage(self) -> dict[str, float | None]:
        """Per device: named bytes over the allocator's (CUDA) or the live-storage (CPU) total."""
        return {totals.device: totals.coverage for totals in self.devices}

    @property
    def named_bytes(self) -> int:
        return sum(entry.bytes for entry in self.entries)

    def on(self, device: str) -> list[MemoryEntry]:
        return [entry for entry in self.entries if entry.device == device]

    def entry(self, name: str) -> MemoryEntry:
        """The entry a path names, as its main path or one of its other names."""
        for entry in self.entries:
            if entry.path == name or name in entry.names:
                return entry
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "entries": [entry.to_dict() for entry in self.entries],
            "devices": [totals.to_dict() for totals in self.devices],
            "coverage": self.coverage,
            "remainders": [remainder.to_dict() for remainder in self.remainders],
            "releases": [release.to_dict() for release in self.releases],
            "notes": list(self.notes), "top": self.top, "objects_visited": self.objects_visited,
            "seconds": self.seconds,
        }


@dataclass(frozen=True)
class DeviceLevel:
    """One device's memory at one moment, as the allocator (or the live-storage count) reports it."""

    device: str
    allocated_bytes: int
    reserved_bytes: int | None = None    # CUDA only

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StillHeld:
    """A storage the release did not free, because something it must not drop still holds it."""

    path: str                  # the name that was to be freed: "Out[3]", "model.fc.weight"
    bytes: int
    held_by: tuple[str, ...]   # the other names that keep it alive: "y", "opt.param_groups[0]['params'][0]"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "held_by": list(self.held_by)}


@dataclass(frozen=True, repr=False)
class FreeReport(RichResult):
    renderer: ClassVar[str] = "jupyter_gpu.gpumem.render"

    target: str                              # "outputs", "traceback", "cache", or the names given ("x, y")
    before: tuple[DeviceLevel, ...]
    after: tuple[DeviceLevel, ...]
    released: tuple[str, ...] = ()           # what was dropped: "Out[3]", "_3", "hidden _", "x", "frame train_step"
    still_held: tuple[StillHeld, ...] = ()   # what stays, and who holds it
    next_time: tuple[str, ...] = ()          # the line to type instead next time: "del x", "end the line with ;"
    notes: tuple[str, ...] = ()

    def freed_bytes(self, device: str | None = None) -> int:
        """Allocated bytes given back (on one device, or all), never negative."""
        before = {level.device: level.allocated_bytes for level in self.before}
        after = {level.device: level.allocated_bytes for level in self.after}
        devices = [device] if device is not None else list(before)
        return sum(max(before.get(d, 0) - after.get(d, 0), 0) for d in devices)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target, "before": [level.to_dict() for level in self.before],
            "after": [level.to_dict() for level in self.after], "freed_bytes": self.freed_bytes(),
            "released": list(self.released), "still_held": [held.to_dict() for held in self.still_held],
            "next_time": list(self.next_time), "notes": list(self.notes),
        }


@dataclass(frozen=True)
class CellRecord:
    """Memory after one cell ran, recorded by `%gpumem --watch`."""

    execution_count: int
    cell: str                                # the cell's first non-blank line, shortened
    cell_key: str                            # a hash of the cell's source: the same cell run again has the same key
    allocated: tuple[tuple[str, int], ...]   # (device, bytes): allocator (CUDA) or live storages (CPU)
    named: tuple[tuple[str, int], ...]       # (device, bytes) the walk named
    new_entries: tuple[tuple[str, int], ...] = ()  # (path, bytes) of storages this cell added, largest first
    seconds: float = 0.0                     # what recording this cell cost

    @property
    def allocated_bytes(self) -> int:
        return sum(size for _, size in self.allocated)

    def to_dict(self) -> dict[str, Any]:
        return {"execution_count": self.execution_count, "cell": self.cell, "cell_key": self.cell_key,
                "allocated": dict(self.allocated), "named": dict(self.named),
                "new_entries": [list(pair) for pair in self.new_entries], "seconds": self.seconds}


@dataclass(frozen=True)
class Leak:
    """A cell whose every run left more memory behind than it found."""

    cell: str
    cell_key: str
    runs: tuple[int, ...]                    # the execution counts of its runs
    growth: tuple[int, ...]                  # bytes each run added
    new_entries: tuple[tuple[str, int], ...] = ()  # what its last run added

    def to_dict(self) -> dict[str, Any]:
        return {"cell": self.cell, "cell_key": self.cell_key, "runs": list(self.runs), "growth": list(self.growth),
                "new_entries": [list(pair) for pair in self.new_entries]}


@dataclass(frozen=True, repr=False)
class MemoryHistory(RichResult):
    renderer: ClassVar[str] = "jupyter_gpu.gpumem.render"

    records: tuple[CellRecord, ...]
    leaks: tuple[Leak, ...] = ()
    watching: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    def growth(self) -> list[tuple[CellRecord, int]]:
        """Each record with the bytes it added over the one before (the first record's growth is 0)."""
        records = list(self.records)
        return list(zip(records, growth_by_record(records), strict=True))

    def to_dict(self) -> dict[str, Any]:
        return {"records": [record.to_dict() for record in self.records],
                "leaks": [leak.to_dict() for leak in self.leaks], "watching": self.watching,
                "notes": list(self.notes)}


def growth_by_record(records: list[CellRecord]) -> list[int]:
    """Bytes each record added over the one before; the first (the baseline) added 0."""
    return [0] + [after.allocated_bytes - before.allocated_bytes for before, after in itertools.pairwise(records)]
