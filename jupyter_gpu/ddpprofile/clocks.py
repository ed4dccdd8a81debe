"""Each rank's clock against rank 0's, measured over the process group, so per-rank timelines can be merged.

Every rank stamps its events with its own wall clock. On one machine those clocks agree; across machines they agree
only as well as NTP/PTP keeps them, and milliseconds apart is common on a cluster whose time daemon is misconfigured.
A merged timeline built from such stamps lies: a rank's all-reduce appears to start before the gradients it reduces
were ready on another rank.

The offsets are measured the way NTP does it, over the process group's own transport:

- rank 0 stamps t0 and sends a small tensor to a peer;
- the peer stamps t1 once the tensor has arrived and t2 just before it replies with [t1, t2];
- rank 0 stamps t3 once the reply has arrived.

Whatever the delays on each leg, the peer's stamps fall inside [t0, t3] once read on rank 0's clock, so the peer's
offset (its clock minus rank 0's) lies within `((t1 - t0) + (t2 - t3)) / 2 ± round_trip / 2`, where the round trip
is `(t3 - t0) - (t2 - t1)`: the time spent on the wire, not in the peer. The estimate is exact when both legs take
equally long; half the round trip bounds its error whatever they take. Several rounds are made per peer and the one
with the least round trip is kept: its bound is the tightest, and it is the one least disturbed by the scheduler.

torch is imported inside the functions that need it: the report side reads offsets without torch installed.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from jupyter_gpu.rendering.units import format_seconds

OFFSET_ENV = "JUPYTER_GPU_CLOCK_OFFSET_NS"

# A DDP bucket's all-reduce takes hundreds of microseconds on NVLink or InfiniBand: a clock offset past 1 ms moves
# ranks' events by more than the communication the timeline is meant to show, so the order of events across ranks
# can no longer be read from it. Well-kept NTP holds machines within tens of microseconds on a LAN, PTP within a few,
# so an offset past 1 ms is a real misconfiguration, never noise.
CLOCK_FINDING_S = 1e-3


def rank_clock_ns() -> int:
    """This process's clock for stamps that other ranks compare: the wall clock, in nanoseconds.

    The wall clock (`time.time_ns`) is what NTP/PTP keep in step across machines; `perf_counter` counts from an
    arbitrary point that differs between processes, so it cannot be compared across ranks at all.
    `JUPYTER_GPU_CLOCK_OFFSET_NS` shifts what this process reads: it is how the tests give two processes on one
    machine clocks that differ by a known amount. Users never set it.
    """
    # The environment is read before the clock, so the stamp is the moment the function returns.
    shift = int(os.environ.get(OFFSET_ENV) or 0)
    return time.time_ns() + shift


@dataclass(frozen=True)
class ClockOffset:
    """One rank's clock against rank 0's."""

    rank: int
    offset_s: float  # this rank's clock minus rank 0's
    bound_s: float  # half the least round trip: the error bound
    round_trip_s: float
    rounds: int  # rounds measured (rank 0 measures nothing against itself: 0)
    host: str

    def align(self, t_ns: int) -> float:
        """A stamp this rank took with `rank_clock_ns()`, in seconds on rank 0's clock."""
        return t_ns / 1e9 - self.offset_s


def ntp_offset(t0: int, t1: int, t2: int, t3: int) -> tuple[float, float]:
    """(offset, round trip) in seconds from one round's nanosecond stamps: t0 and t3 on rank 0's clock (sent,
    reply received), t1 and t2 on the peer's (ping received, reply sent). The offset is the peer's clock minus rank
    0's; its error is at most half the round trip."""
    offset_ns = ((t1 - t0) + (t2 - t3)) / 2
    round_trip_ns = (t3 - t0) - (t2 - t1)
    return offset_ns / 1e9, round_trip_ns / 1e9


def best_sample(samples: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """The (offset, round trip) sample with the least round trip: the tightest bound.

    A negative round trip means a clock was stepped during that round (the two differences were read on clocks that
    moved), so its bound is meaningless: such a sample is kept only when no round was clean.
    """
    chosen = min(samples, key=lambda sample: (sample[1] < 0, sample[1]), default=None)
    if chosen is None:
        raise ValueError("best_sample needs at least one sample")
    return chosen


def measure_offsets(rounds: int = 8, device: str = "cpu", group: Any = None) -> list[ClockOffset]:
    """Every rank's clock against rank 0's: a collective that every rank of the process group calls.

    Rank 0 pings each peer in turn with `send`/`recv` of a small int64 tensor on `device` (the rank's GPU under
    NCCL, which carries no CPU tensors; "cpu" under gloo), `rounds` counted rounds after one warm-up round. Every
    rank returns the same list, one entry per rank in rank order; rank 0's has offset 0 and bound 0. Ranks are those
    of `group` (the default group when None), and its rank 0 is the reference. Under NCCL the object collectives
    used here run on `torch.cuda.current_device()`, so each rank must have called `torch.cuda.set_device` first, as
    DDP scripts do.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, not {rounds}")
    import torch
    import torch.distributed as dist

    rank = dist.get_rank(group)
    world = dist.get_world_size(group)

    def global_rank(group_rank: int) -> int:
        # send/recv and broadcast name peers by their rank in the default group, whatever group they run on.
        return group_rank if group is None else dist.get_global_rank(group, group_rank)

    hosts: list[Any] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname(), group=group)

    ping = torch.zeros(2, dtype=torch.int64, device=device)
    reply = torch.zeros(2, dtype=torch.int64, device=device)
    offsets: list[Any] = [None]
    if rank == 0:
        found = [ClockOffset(rank=0, offset_s=0.0, bound_s=0.0, round_trip_s=0.0, rounds=0, host=str(hosts[0]))]
        for peer in range(1, world):
            samples = []
            # The warm-up round is not counted: the first message to a peer pays for setting up the link (NCCL
            # builds a communicator for the pair on its first send), which says nothing about the clocks.
            for index in range(rounds + 1):
                t0 = rank_clock_ns()
                dist.send(ping, global_rank(peer), group=group)
                dist.recv(reply, global_rank(peer), group=group)
                # Reading the values waits for the reply to have arrived even where recv only queues the copy
                # (NCCL), so t3 is stamped after the arrival: the bound needs t3 late, never early.
                t1, t2 = reply.tolist()
                t3 = rank_clock_ns()
                if index > 0:
                    samples.append(ntp_offset(t0, t1, t2, t3))
            offset_s, round_trip_s = best_sample(samples)
            found.append(ClockOffset(rank=peer, offset_s=offset_s, bound_s=abs(round_trip_s) / 2,
                                     round_trip_s=round_trip_s, rounds=rounds, host=str(hosts[peer])))
        offsets[0] = found
    else:
        for _ in range(rounds + 1):
            dist.recv(ping, global_rank(0), group=group)
            # As on rank 0: the ping must have arrived before t1 is stamped (under NCCL recv returns once queued).
            ping.tolist()
            t1 = rank_clock_ns()
            t2 = rank_clock_ns()
            # t2 is stamped before the reply is built and sent: the bound needs t2 early, never late. Filling the
            # tensor afterwards only lengthens the return leg, which the round trip (and so the bound) includes.
            reply.copy_(torch.tensor([t1, t2], dtype=torch.int64))
            dist.send(reply, global_rank(0), group=group)
    dist.broadcast_object_list(offsets, src=global_rank(0), group=group)
    return list(offsets[0])


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:+.1f} ms"


def _beyond(offsets: Iterable[ClockOffset]) -> list[ClockOffset]:
    # The bound is subtracted: an offset counts only when even its most favourable reading is past the threshold.
    return [o for o in offsets if o.rank != 0 and abs(o.offset_s) - o.bound_s > CLOCK_FINDING_S]


def clock_finding(offsets: list[ClockOffset]) -> str | None:
    """One sentence when a rank's clock is more than `CLOCK_FINDING_S` off rank 0's (its error bound counted),
    else None."""
    off = _beyond(offsets)
    if not off:
        return None
    reference = next((o.host for o in offsets if o.rank == 0), None)
    against = f"rank 0's (on {reference})" if reference else "rank 0's"
    ranks = [f"rank {o.rank} (on {o.host}) by {_ms(o.offset_s)} ± {format_seconds(o.bound_s)}" for o in off]
    if len(ranks) == 1:
        only = off[0]
        subject = (f"Rank {only.rank}'s clock (on {only.host}) is {_ms(only.offset_s)} ± "
                   f"{format_seconds(only.bound_s)} off {against}")
        hosts = "that host"
    else:
        subject = f"Clocks are off {against}: " + ", ".join(ranks[:-1]) + f" and {ranks[-1]}"
        hosts = "those hosts" if len({o.host for o in off}) > 1 else "that host"
    return (f"{subject}: larger than a DDP bucket's all-reduce takes (hundreds of µs on NVLink/InfiniBand), so a "
            "merged timeline would show an all-reduce starting before the gradients it reduces were ready; the "
            "timelines here are aligned by the measured offsets; to fix the clocks themselves, check NTP/PTP on "
            f"{hosts}: `chronyc tracking` or `timedatectl`.")


def offsets_line(offsets: list[ClockOffset]) -> str:
    """One line for a report: each rank's offset against rank 0, or that the clocks are in step."""
    peers = [o for o in offsets if o.rank != 0]
    if not peers:
        return "clocks: one rank, nothing to compare"
    if not _beyond(peers):
        # The widest the true offset could be, so "within" holds whichever way the estimate errs.
        within = max(abs(o.offset_s) + o.bound_s for o in peers)
        return f"clocks: in step (within {format_seconds(within)} of rank 0)"
    return "clocks: " + ", ".join(f"rank {o.rank} ({o.host}) {_ms(o.offset_s)} ± {format_seconds(o.bound_s)}"
                                  for o in peers) + " against rank 0"
