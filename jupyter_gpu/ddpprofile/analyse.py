"""Every rank's profile and communication records, read together: per rank and step, the single-GPU buckets, the
all-reduce time, how much of it ran under the backward (overlapped) and how much the step waited for after it
(exposed); the slowest rank of each step and the bucket that made it slow; with a one-process run beside it, the
scaling efficiency and what the lost part is made of. Pure Python over the ranks' JSON (rank_main.py writes it).

The lost part, in seconds per step, adds up by construction. Every rank's step ends together (the all-reduce waits
for the last rank's gradients), so the step on N ranks is the slowest rank's compute plus the communication it then
waited for. Against the one-process step T1:
    T_N - T1 = exposed communication (the slowest rank's wait after its backward: nobody's compute hides it)
             + straggler (the slowest rank's compute over the others': what every other rank waits for)
             + data wait (the other ranks' wait for data over the one process's: loaders that starve each other)
             + the rest (the other ranks' compute over the one process's: shared cores, DDP's own work).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpu.gpuprofile.result import BACKWARD, BUCKET_TITLES, COPIES, DATA, FORWARD, GC, OPTIMIZER, OTHER, SYNC

# A rank whose compute leads the others' by less than this share of the step is not named a straggler: on shared cores
# the last rank of a step changes from step to step by a few percent.
STRAGGLER_SHARE = 0.05


@dataclass(frozen=True)
class StepComm:
    """One rank's communication in one optimizer step, in seconds."""

    total: float      # the union of its buckets' all-reduces, ready to done
    exposed: float    # from the last bucket ready to the backward's return, over every backward that all-reduced
    buckets: int      # buckets all-reduced
    allreduces: int   # backward calls that all-reduced (more than one: accumulation without no_sync)
    backwards: int    # backward calls

    @property
    def overlapped(self) -> float:
        return max(0.0, self.total - self.exposed)


@dataclass(frozen=True)
class RankSummary:
    rank: int
    host: str
    steps: int
    step: float                 # mean profiled step, seconds
    buckets: dict[str, float]   # mean seconds per step per single-GPU bucket (backward less the exposed wait)
    comm: float                 # mean all-reduce seconds per step
    exposed: float
    overlapped: float
    buckets_per_step: float
    bucket_bytes: list[int]
    allreduces_per_step: float
    backwards_per_step: float
    settings: dict[str, Any]
    gradient_bytes: int | None
    gather: float = 0.0          # FSDP: mean all-gather seconds per step (the union of its all-gathers)
    kind: str = "all_reduce"     # how the gradients travel: DDP's "all_reduce", FSDP's "reduce_scatter"
    loader_workers: int | None = None  # the most num_workers of the DataLoaders the rank made (None: it made none)
    computes: tuple[float, ...] = ()   # each profiled step less the communication it waited for
    batches_per_epoch: int | None = None  # the first DataLoader's length on this rank

    @property
    def compute(self) -> float:
        """The step less the communication it waited for."""
        return self.step - self.exposed


@dataclass(frozen=True)
class Straggler:
    rank: int
    slowest_steps: int   # steps in which it was the slowest rank
    steps: int
    lead: float          # seconds per step its compute took over the others' mean
    bucket: str          # the bucket that made it slow
    its_seconds: float   # that bucket on the straggler, per step
    others_seconds: float
    by_step: tuple[int, ...] = ()  # the slowest rank of each profiled step


@dataclass(frozen=True)
class Scaling:
    processes: int
    one_step: float        # seconds per step with one process, the same per-rank batch
    n_step: float
    efficiency: float      # throughput_N / (N x throughput_1) = one_step / n_step
    parts: list[tuple[str, float]] = field(default_factory=list)  # (what, seconds per step), adding up to the loss

    @property
    def speedup(self) -> float:
        return self.processes * self.efficiency

    @property
    def lost(self) -> float:
        return self.n_step - self.one_step


def step_comm(comm: dict[str, Any], step: int) -> StepComm:
    """One rank's communication in optimizer step `step` (the count of steps completed before it)."""
    buckets = [b for b in comm.get("buckets", []) if b["step"] == step and b.get("done") is not None]
    backwards = [b for b in comm.get("backwards", []) if b["step"] == step]
    exposed, allreduces = 0.0, 0
    for call in backwards:
        inside = [b for b in buckets if call["start"] <= b["ready"] <= call["end"]]
        if inside:
            allreduces += 1
            exposed += max(0.0, call["end"] - max(b["ready"] for b in inside))
    return StepComm(total=_union([(b["ready"], b["done"]) for b in buckets]), exposed=exposed,
                    buckets=len(buckets), allreduces=allreduces, backwards=len(backwards))


def summarise_rank(record: dict[str, Any]) -> RankSummary:
    profile, comm = record["profile"], record.get("comm", {})
    steps = profile["step_seconds"]
    first = len(profile.get("warmup_seconds", []))  # profiled steps come after the warm-up ones
    per_step = [step_comm(comm, first + k) for k in range(len(steps))]
    keys = list(dict.fromkeys(key for buckets in profile["step_buckets"] for key in buckets))
    buckets: dict[str, float] = {}
    for key in keys:
        values = [b.get(key, 0.0) for b in profile["step_buckets"]]
        if key == BACKWARD:  # the backward's wait for the all-reduce is communication, not compute
            values = [max(0.0, v - c.exposed) for v, c in zip(values, per_step, strict=False)]
        buckets[key] = _mean(values)
    sizes = sorted({b["bytes"] for b in comm.get("buckets", [])}, reverse=True)
    kinds = {b.get("kind", "all_reduce") for b in comm.get("buckets", [])}
    gathers = [_union([(g["ready"], g["done"]) for g in comm.get("gathers", [])
                       if g["step"] == first + k and g.get("done") is not None]) for k in range(len(steps))]
    settings = (comm.get("settings") or [{}])[0]
    gradient = (comm.get("parameters") or [{}])[0].get("bytes")
    workers = [loader.get("num_workers", 0) for loader in comm.get("loaders") or []]
    batches = next((loader.get("batches") for loader in comm.get("loaders") or [] if loader.get("batches")), None)
    return RankSummary(rank=record["rank"], host=record.get("host", ""), steps=len(steps), step=_mean(steps),
                       buckets=buckets, comm=_mean([c.total for c in per_step]),
                       exposed=_mean([c.exposed for c in per_step]), overlapped=_mean([c.overlapped for c in per_step]),
                       buckets_per_step=_mean([c.buckets for c in per_step]), bucket_bytes=sizes,
                       allreduces_per_step=_mean([c.allreduces for c in per_step]),
                       backwards_per_step=_mean([c.backwards for c in per_step]), settings=settings,
                       gradient_bytes=gradient, loader_workers=max(workers) if workers else None,
                       batches_per_epoch=batches, gather=_mean(gathers),
                       kind="reduce_scatter" if kinds == {"reduce_scatter"} else "all_reduce",
                       computes=tuple(step - c.exposed for step, c in zip(steps, per_step, strict=False)))


def straggler(ranks: list[RankSummary]) -> Straggler | None:
    """The rank whose compute the others waited for, step by step, and the bucket that made it slow."""
    if len(ranks) < 2:
        return None
    computes = {r.rank: r.computes for r in ranks}
    steps = min(len(values) for values in computes.values())
    if steps == 0:
        return None
    slowest_each = [max(computes, key=lambda r, k=k: computes[r][k]) for k in range(steps)]
    slowest = statistics.mode(slowest_each)
    by_rank = {r.rank: r for r in ranks}
    others = [r for r in ranks if r.rank != slowest]
    lead = by_rank[slowest].compute - _mean([r.compute for r in others])
    if lead < STRAGGLER_SHARE * max(r.step for r in ranks):
        return None  # the ranks keep pace: which one was last in a step is the noise of shared cores
    excess = {key: value - _mean([r.buckets.get(key, 0.0) for r in others])
              for key, value in by_rank[slowest].buckets.items()}
    bucket = max(excess, key=lambda key: excess[key])
    return Straggler(rank=slowest, slowest_steps=slowest_each.count(slowest), steps=steps, lead=lead, bucket=bucket,
                     its_seconds=by_rank[slowest].buckets.get(bucket, 0.0),
                     others_seconds=_mean([r.buckets.get(bucket, 0.0) for r in others]), by_step=tuple(slowest_each))


def scaling(one: RankSummary, ranks: list[RankSummary], late: Straggler | None) -> Scaling:
    """Weak scaling (the same per-rank batch) from one process's step and N ranks' steps, the loss split."""
    n_step = _mean([r.step for r in ranks])  # the ranks' steps end together: they differ by the noise
    slowest = next((r for r in ranks if late is not None and r.rank == late.rank), None)
    others = [r for r in ranks if slowest is None or r.rank != slowest.rank]
    # Communication nobody's compute hid, over what one process's own (one-rank) DDP step already waited for: the
    # slowest rank's where one is named, since the others' wait includes waiting for it.
    exposed = (slowest.exposed if slowest is not None else _mean([r.exposed for r in ranks])) - one.exposed
    lead = late.lead if late is not None else 0.0
    data = _mean([r.buckets.get(DATA, 0.0) for r in others]) - one.buckets.get(DATA, 0.0)
    parts = [("exposed communication", exposed)]
    if late is not None:
        parts.append((f"rank {late.rank}'s lead (the others wait for it)", lead))
    parts.append(("data wait", data))
    parts.append(("other", (n_step - one.step) - exposed - lead - data))
    return Scaling(processes=len(ranks), one_step=one.step, n_step=n_step, efficiency=one.step / n_step,
                   parts=parts)


# What a bucket is called inside a sentence ("rank 1's data wait"); the report's columns use BUCKET_TITLES.
BUCKET_NOUNS = {DATA: "data wait", COPIES: "host-to-device copies", FORWARD: "forward", BACKWARD: "backward",
                OPTIMIZER: "optimizer step", SYNC: "syncs", GC: "garbage collection", OTHER: "other host time"}


def bucket_title(key: str) -> str:
    return BUCKET_NOUNS.get(key) or BUCKET_TITLES.get(key, key)


def _union(spans: list[tuple[float, float]]) -> float:
    total, covered = 0.0, float("-inf")
    for start, end in sorted(spans):
        start = max(start, covered)
        if end > start:
            total += end - start
        covered = max(covered, end)
    return total


def _mean(values: list[float] | list[int]) -> float:
    return float(statistics.fmean(values)) if values else 0.0
