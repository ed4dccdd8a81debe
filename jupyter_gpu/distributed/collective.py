"""The checked all-reduce's result: per size the time, nccl-tests' algorithm and bus bandwidth, and the elements
that came back wrong; per GPU pair the checked peer-to-peer copy.

Pure data and arithmetic (nccl-tests' doc/PERFORMANCE.md): the runner measures, the renderer draws.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from jupyter_gpu.distributed.links import LinkPeak, ratio_to_peak
from jupyter_gpu.models import RichResult, Status
from jupyter_gpu.rendering.units import format_bytes, format_count, parse_bytes

KIB, MIB = 1 << 10, 1 << 20
ELEMENT_BYTES = 4  # float32, the element type every rank reduces (exact sums, so wrong is wrong)
# 1 KiB .. 16 MiB by x4: latency-bound to bandwidth-bound sizes in a few seconds on two CPU cores.
DEFAULT_SIZES: tuple[int, ...] = tuple(KIB * 4**step for step in range(8))
DEFAULT_ITERATIONS = 10
DEFAULT_WARMUP = 2
DEFAULT_TIMEOUT_S = 120.0
P2P_SIZE = 64 * MIB  # large enough that the copy is bandwidth-bound; small beside any GPU's memory
P2P_FIX = "NCCL_P2P_DISABLE=1 jupyter-gpu allreduce"
SINGLE_RANK_NOTE = ("One process: no data crosses a link, so bus bandwidth is 0 by nccl-tests' formula "
                    "(2(n-1)/n = 0 for n = 1).")


def bandwidths(size_bytes: int, time_s: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s: algbw = S / t; all-reduce busbw = algbw * 2(n-1)/n, what each rank's link
    carries, comparable to the link's peak whatever the number of ranks (0 for n = 1)."""
    algbw = size_bytes / time_s if time_s > 0 else 0.0
    return algbw, algbw * 2 * (world_size - 1) / world_size


@dataclass(frozen=True)
class SizeResult:
    size_bytes: int
    elements: int
    dtype: str
    iterations: int
    # Per all-reduce: the median of the timed iterations on each rank, then the slowest rank's (max across
    # ranks), as nccl-tests takes the slowest rank: a collective is done when its last rank is.
    time_s: float
    algbw: float  # bytes/s
    busbw: float  # bytes/s
    wrong: int  # elements differing from the exact expected sum, summed over all ranks (nccl-tests' #wrong)
    ratio: float | None  # busbw / the link's nominal peak

    @classmethod
    def measured(cls, *, size_bytes: int, elements: int, dtype: str, iterations: int, time_s: float, wrong: int,
                 world_size: int, peak: LinkPeak | None) -> SizeResult:
        algbw, busbw = bandwidths(size_bytes, time_s, world_size)
        return cls(size_bytes, elements, dtype, iterations, time_s, algbw, busbw, wrong,
                   ratio_to_peak(busbw, peak) if world_size > 1 else None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PeerCopy:
    """One checked `tensor.to(dst)` between two GPUs: broken P2P can return zeros without an error."""

    src: str
    dst: str
    size_bytes: int
    wrong: int  # elements that arrived different from what was sent
    bytes_per_s: float

    @property
    def elements(self) -> int:
        return self.size_bytes // ELEMENT_BYTES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, repr=False)  # RichResult's short repr, not every row
class AllReduceResult(RichResult):
    renderer: ClassVar[str] = "jupyter_gpu.distributed.collective_render"

    backend: str
    world_size: int
    devices: tuple[str, ...]  # one per rank: "cuda:0 NVIDIA H200" or "cpu"
    rows: tuple[SizeResult, ...]
    p2p: tuple[PeerCopy, ...]
    peak: LinkPeak | None
    init_s: float  # from starting the ranks to the first collective being ready (imports included)
    wall_s: float
    notes: tuple[str, ...] = ()
    simulated: bool = False

    @property
    def ok(self) -> bool:
        return all(row.wrong == 0 for row in self.rows) and all(copy.wrong == 0 for copy in self.p2p)

    @property
    def status(self) -> Status:
        return "ok" if self.ok else "fail"

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    @property
    def wrong_rows(self) -> tuple[SizeResult, ...]:
        return tuple(row for row in self.rows if row.wrong)

    @property
    def wrong_copies(self) -> tuple[PeerCopy, ...]:
        return tuple(copy for copy in self.p2p if copy.wrong)

    @property
    def verdict(self) -> str:
        """One line: every size correct and the largest size's bus bandwidth, or the first wrong result."""
        if self.wrong_rows:
            row = self.wrong_rows[0]
            others = len(self.wrong_rows) - 1
            more = f" (and at {others} more size{'s' if others != 1 else ''})" if others else ""
            return (f"WRONG: {format_count(row.wrong)} of {format_count(row.elements * self.world_size)} elements "
                    f"wrong at {format_bytes(row.size_bytes)}{more}")
        if self.wrong_copies:
            copy = self.wrong_copies[0]
            others = len(self.wrong_copies) - 1
            more = f" (and {others} more pair{'s' if others != 1 else ''})" if others else ""
            return (f"WRONG: the copy {copy.src} -> {copy.dst} returned {format_count(copy.wrong)} of "
                    f"{format_count(copy.elements)} elements wrong{more}")
        if not self.rows:
            return "no sizes were run"
        largest = max(self.rows, key=lambda row: row.size_bytes)
        count = len(self.rows)
        correct = f"all {count} sizes correct" if count > 1 else "the one size correct"
        copies = f", {len(self.p2p)} P2P cop{'ies' if len(self.p2p) != 1 else 'y'} correct" if self.p2p else ""
        if self.world_size == 1:
            return f"{correct}{copies}; one process, so no bus bandwidth"
        return f"{correct}{copies}; busbw {largest.busbw / 1e9:.3g} GB/s at {format_bytes(largest.size_bytes)}"

    def summary(self) -> str:
        return self.verdict

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "verdict": self.verdict, "backend": self.backend, "world_size": self.world_size,
                "devices": list(self.devices), "rows": [row.to_dict() for row in self.rows],
                "p2p": [copy.to_dict() for copy in self.p2p],
                "peak": self.peak.to_dict() if self.peak is not None else None,
                "init_s": self.init_s, "wall_s": self.wall_s, "notes": list(self.notes), "simulated": self.simulated}


# nccl-tests' -b/-e sizes are binary (128M = 128 MiB): a bare K, M or G means the same here. KB, MB, GB are SI
# as jupyter_gpu.rendering.units reads them everywhere else.
_BINARY_SUFFIXES = {"k": "KiB", "m": "MiB", "g": "GiB"}
SIZES_SYNTAX = "a list like 1K,64K,16M or a range FROM:TO[:FACTOR] like 8:64M (powers of 2 from 8 B to 64 MiB)"


def _one_size(text: str) -> int:
    cleaned = text.strip()
    if cleaned[-1:].lower() in _BINARY_SUFFIXES and cleaned[:-1].strip():
        cleaned = cleaned[:-1] + _BINARY_SUFFIXES[cleaned[-1].lower()]
    try:
        return parse_bytes(cleaned)
    except ValueError:
        raise ValueError(f"{text.strip()!r} is not a size; write sizes as {SIZES_SYNTAX}") from None


def parse_sizes(text: str) -> list[int]:
    """`1K,64K,16M` -> those sizes; `8:64M` -> 8, 16, ... 64 MiB; `1K:16M:4` -> 1 KiB, 4 KiB, ... 16 MiB.
    K, M and G are binary, as in nccl-tests. ValueError with one sentence on anything else."""
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"{text!r} is not a size range; write sizes as {SIZES_SYNTAX}")
        low, high = _one_size(parts[0]), _one_size(parts[1])
        factor = _factor(parts[2]) if len(parts) == 3 else 2
        if high < low:
            raise ValueError(f"the size range {text!r} ends below where it starts")
        sizes = [low]
        while sizes[-1] * factor <= high:
            sizes.append(sizes[-1] * factor)
        return sizes
    sizes = [_one_size(part) for part in text.split(",") if part.strip()]
    if not sizes:
        raise ValueError(f"no sizes given; write sizes as {SIZES_SYNTAX}")
    return sizes


def _factor(text: str) -> int:
    try:
        factor = int(text)
    except ValueError:
        factor = 0
    if factor < 2:
        raise ValueError(f"a size range's factor must be a whole number of at least 2, not {text!r}")
    return factor
