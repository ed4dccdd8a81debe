"""Whether other processes took the CPU cores a probe's timings needed: the CPU time every core of this process's
affinity spent busy (Linux `/proc/stat`, steal time included: a VM's host running others), less this process's own
and its live children's (DataLoader workers), over the wall time.

Why it matters: torch runs each operator on `torch.get_num_threads()` threads that wait for each other. When other
processes keep the cores busy, a thread that lost its core holds up every operator: on this project's 2-core test
machine, with a second notebook training, a small MLP step took 198 ms instead of 0.7 ms, and `%speedprobe` called a
fused optimizer 42.6x faster. The probes say so instead of recommending from such timings.

Linux only: elsewhere (and where /proc cannot be read) nothing is said. Importing this module imports nothing heavy.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

# Other processes' average load, in cores, from which timings are called shared: below half a core the threads
# lose their cores too rarely to matter.
MIN_OTHERS = 0.5
# Threads may exceed the cores by this much before they wait for each other (the OS has some slack).
SLACK = 0.5


@dataclass(frozen=True)
class CpuContention:
    others: float   # cores other processes kept busy, on average
    cores: int      # the cores this process may run on
    threads: int    # torch's intra-op threads

    @property
    def oversubscribed(self) -> bool:
        return self.others >= MIN_OTHERS and self.others + self.threads > self.cores + SLACK

    def sentence(self) -> str:
        # Fewer threads only where that is fewer than torch has: said to a process already on one thread, "give
        # torch fewer threads: torch.set_num_threads(1)" was advice it could not follow.
        fewer = max(1, int(self.cores - self.others))
        threads = "thread" if self.threads == 1 else "threads"
        advice = (f" (or give torch fewer threads: torch.set_num_threads({fewer}))" if fewer < self.threads else "")
        return (f"other processes kept {self.others:.1f} of this machine's {self.cores} CPU cores busy while it ran, "
                f"and torch uses {self.threads} {threads}, so its {threads} waited for cores and the timings are not "
                f"the step's own; run it again when the machine is idle{advice}")


class ContentionWatch:
    """`with ContentionWatch(torch) as watch: ...`, then `watch.result` (None where it cannot be measured)."""

    def __init__(self, torch: object) -> None:
        self._threads = int(getattr(torch, "get_num_threads", lambda: 1)())
        self._cores = _cores()
        self._start: tuple[float, float, float] | None = None
        self.result: CpuContention | None = None

    def __enter__(self) -> ContentionWatch:
        self._start = _reading(self._cores)
        return self

    def __exit__(self, *exc_info: object) -> None:
        end = _reading(self._cores)
        if self._start is None or end is None or not self._cores:
            return
        wall = end[0] - self._start[0]
        if wall <= 0:
            return
        others = ((end[1] - self._start[1]) - (end[2] - self._start[2])) / wall
        self.result = CpuContention(others=max(0.0, others), cores=len(self._cores), threads=self._threads)

    @property
    def note(self) -> str | None:
        """The sentence to show, when other processes took the cores the timings needed."""
        return self.result.sentence() if self.result is not None and self.result.oversubscribed else None


def _cores() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return set()


def _reading(cores: set[int]) -> tuple[float, float, float] | None:
    """(wall seconds, busy CPU seconds of `cores`, CPU seconds of this process and its children), or None."""
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        with open("/proc/stat", encoding="ascii") as handle:
            lines = handle.read().splitlines()
    except (OSError, ValueError, AttributeError):
        return None
    busy = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
            # user nice system idle iowait irq softirq steal (guest is inside user): all but idle and iowait.
            fields = [int(value) for value in rest.split()[:8]]
            busy += sum(fields) - fields[3] - fields[4]
    own = os.times()
    mine = own.user + own.system + own.children_user + own.children_system + _live_children_seconds(ticks)
    return time.monotonic(), busy / ticks, mine


def _live_children_seconds(ticks: int) -> float:
    """CPU seconds of this process's live descendants (DataLoader workers): os.times counts children only once
    they have ended and been waited for."""
    parents: dict[int, int] = {}
    seconds: dict[int, float] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0.0
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                text = handle.read()
        except OSError:
            continue  # it ended meanwhile
        fields = text.rpartition(")")[2].split()  # the name may hold spaces and parentheses
        if len(fields) > 12:
            parents[int(entry)] = int(fields[1])
            seconds[int(entry)] = (int(fields[11]) + int(fields[12])) / ticks
    me, total = os.getpid(), 0.0
    for pid, spent in seconds.items():
        ancestor, hops = parents.get(pid), 0
        while ancestor and ancestor != me and hops < 64:
            ancestor, hops = parents.get(ancestor), hops + 1
        if ancestor == me:
            total += spent
    return total


def runqueue_seconds() -> float | None:
    """Seconds the calling thread has so far spent ready to run but waiting for a CPU core (Linux schedstat: its
    second field, run_delay in ns), or None where it cannot be read. Time a thread sleeps or blocks (a DataLoader's
    next() waiting on its workers, time.sleep) is not in it: only the time other work held the core it needed.
    The calling thread only: torch's idle intra-op threads wait in the run queue too, all at once, and summed with
    them the figure outgrew the wall time (3 threads on 2 busy cores: 36-136 ms a step against 4 ms of sleep)."""
    try:
        with open("/proc/thread-self/schedstat", encoding="ascii") as handle:
            return int(handle.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None
