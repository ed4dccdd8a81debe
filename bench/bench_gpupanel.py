"""What `%gpupanel` costs: the sampler's CPU at 1 Hz over eight GPUs, a panel's cost in a real kernel, and
whether a panel slows the code the kernel runs.

Every figure uses the simulated scenario `a100x8-mig` (eight A100s, two of them split with MIG), so the same
work is done on a machine without a GPU. Configurations are interleaved round by round, so machine load hits
them alike; costs are pooled over the rounds (total CPU over total wall time), with the rounds' spread.

1. Sampler cost, in this process, without Jupyter. The main thread only sleeps, so the process CPU time
   (`time.process_time()`, all threads) over a window is the samplers' cost; it is given as % of one core:
   a. ours: one shared `SamplerHub` with four 1 s leases (four panels open): one thread, one read a second;
   b. what other tools do: four independent `Sampler`s at 1 s, each with its own backend (one polling loop per
      open panel or chart, as in per-widget monitors and nvdashboard's per-socket periodic callbacks);
   c. nvdashboard's default rate: the same four loops at 0.1 s.
   The mean cost of one `backend.read()` of the eight GPUs is timed on its own, so the figures can be checked
   by arithmetic (reads per second x cost of a read).
2. A panel's cost in a real ipykernel started with `jupyter_client` (`JUPYTER_GPU_BACKEND=simulated:a100x8-mig`):
   the kernel process's CPU while idle with `panel = %gpupanel -o` open (1 s, all eight GPUs) against the same
   kernel with no panel. The client drains iopub and counts the widgets' comm messages, which shows the updates
   really are serialised and sent. The time of one update (eight GPU rows) is measured on the sampler thread
   during those windows, and over many direct `_on_sample` calls with fresh readings.
3. Does a panel block the kernel? The wall time of a fixed pure-Python loop in the kernel with no panel, one
   panel at 1 s, and four panels at 0.2 s (a stress case), as ratios to no panel (best round against best
   round; the updates' comm messages counted during the loops show the panels kept moving meanwhile).

    .venv/bin/python bench/bench_gpupanel.py [--seconds S] [--rounds N] [--updates N]
                                             [--loop-seconds S] [--loop-rounds N]

`--seconds` is the time each configuration is measured for in parts 1 and 2 (split over the rounds); the
defaults take under three minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import ast
import os
import queue
import statistics
import threading
import time
import timeit
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client import KernelManager

from jupyter_gpu.metrics.backends.base import BACKEND_ENV
from jupyter_gpu.metrics.backends.simulated import SCENARIOS, SimulatedBackend
from jupyter_gpu.metrics.hub import SamplerHub
from jupyter_gpu.metrics.sample import Sample
from jupyter_gpu.metrics.sampler import THREAD_NAME, Sampler

SCENARIO = "a100x8-mig"
PANELS = 4
# Waited after starting samplers or opening a panel before a window opens: the first reading and the widgets'
# creation are a one-off cost, not the steady state being measured.
SETTLE_S = 0.3
ROOT = Path(__file__).resolve().parent.parent


# -- 1. sampler cost in this process ---------------------------------------------------------------------


@dataclass
class Pooled:
    """CPU and wall seconds summed over rounds, plus each round's own % for the spread."""

    cpu: float = 0.0
    wall: float = 0.0
    reads: int = 0
    threads: int = 0
    rounds: list[float] = field(default_factory=list)

    def add(self, cpu: float, wall: float) -> None:
        self.cpu += cpu
        self.wall += wall
        self.rounds.append(100 * cpu / wall)

    @property
    def percent(self) -> float:
        return 100 * self.cpu / self.wall

    @property
    def spread(self) -> str:
        return f"{min(self.rounds):.3f}-{max(self.rounds):.3f}"


def _ignore(sample: Sample) -> None:
    """A subscriber that does nothing: part 1 measures the polling, part 2 the panel's work."""


def shared(interval: float) -> tuple[list[Sampler], Callable[[], None]]:
    """Ours: four leases on one hub, as four open panels hold them."""
    hub = SamplerHub(lambda: SimulatedBackend(SCENARIO))
    leases = [hub.acquire(interval, _ignore) for _ in range(PANELS)]
    assert hub.sampler is not None

    def stop() -> None:
        for lease in leases:
            lease.close()

    return [hub.sampler], stop


def independent(interval: float) -> tuple[list[Sampler], Callable[[], None]]:
    """The usual design: every panel or chart owns its polling loop and its backend."""
    samplers = [Sampler(SimulatedBackend(SCENARIO), interval) for _ in range(PANELS)]
    for sampler in samplers:
        sampler.subscribe(_ignore)
        sampler.start()

    def stop() -> None:
        for sampler in samplers:
            sampler.stop()
            sampler.backend.close()

    return samplers, stop


def read_cost(number: int = 500, repeat: int = 7) -> float:
    """Seconds per `read()` of the eight GPUs: the median over repeats of the mean of many reads."""
    backend = SimulatedBackend(SCENARIO)
    backend.read()  # fills the wave and seed caches, as the sampler's first read does
    return statistics.median(timeit.repeat(backend.read, number=number, repeat=repeat)) / number


def sampler_cost(seconds: float, rounds: int) -> tuple[dict[str, Pooled], float]:
    configs: dict[str, Callable[[], tuple[list[Sampler], Callable[[], None]]]] = {
        "a": lambda: shared(1.0),
        "b": lambda: independent(1.0),
        "c": lambda: independent(0.1),
    }
    results = {name: Pooled() for name in configs}
    window = seconds / rounds
    names = list(configs)
    for index in range(rounds):
        for name in names[index % len(names):] + names[:index % len(names)]:
            samplers, stop = configs[name]()
            try:
                time.sleep(SETTLE_S)
                results[name].threads = sum(t.name == THREAD_NAME for t in threading.enumerate())
                stamp, wall, cpu = time.time(), time.perf_counter(), time.process_time()
                time.sleep(window)
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                # The history says how many reads really happened in the window: the rate, checked.
                results[name].reads += sum(1 for s in samplers for sample in s.history(since=stamp)
                                           if sample.timestamp <= stamp + wall)
                results[name].add(cpu, wall)
            finally:
                stop()
    return results, read_cost()


# -- 2 and 3. a real kernel ------------------------------------------------------------------------------


class Kernel:
    """A real ipykernel; every iopub message is drained here and counted by type, as a front end would."""

    def __init__(self) -> None:
        env = {**os.environ, BACKEND_ENV: f"simulated:{SCENARIO}"}
        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel(env=env, cwd=str(ROOT))
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)
        self.counts: Counter[str] = Counter()
        self.stderr: list[str] = []

    def run(self, code: str, result: str | None = None, timeout: float = 300) -> Any:
        """Execute `code`; with `result`, evaluate that expression afterwards and return its value."""
        expressions = {"result": result} if result is not None else {}
        msg_id = self.client.execute(code, user_expressions=expressions, store_history=False)
        while True:
            message = self.client.get_iopub_msg(timeout=timeout)
            self._count(message)
            content = message["content"]
            if (message["parent_header"].get("msg_id") == msg_id and message["msg_type"] == "status"
                    and content["execution_state"] == "idle"):
                break
        while True:
            reply = self.client.get_shell_msg(timeout=timeout)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        content = reply["content"]
        if content["status"] != "ok":
            raise RuntimeError(f"The kernel failed on {code!r}:\n" + "\n".join(content.get("traceback", [])))
        if result is None:
            return None
        value = content["user_expressions"]["result"]
        if value["status"] != "ok":
            raise RuntimeError(f"The kernel failed on {result!r}: {value.get('ename')}: {value.get('evalue')}")
        return ast.literal_eval(value["data"]["text/plain"])

    def idle(self, seconds: float) -> None:
        """Send nothing for `seconds`, but keep draining iopub: the panel's updates arrive meanwhile."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                self._count(self.client.get_iopub_msg(timeout=remaining))
            except queue.Empty:
                break

    def _count(self, message: dict[str, Any]) -> None:
        self.counts[message["msg_type"]] += 1
        if message["msg_type"] == "stream" and message["content"]["name"] == "stderr":
            self.stderr.append(message["content"]["text"])

    def shutdown(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel()


# Run once in the kernel. The class-level wrapper times every update the sampler thread makes (a panel binds
# `_on_sample` when it is built, so the class must be patched before any panel opens); calls on other threads
# (the first reading, in the constructor, also builds the rows) are not recorded.
KERNEL_SETUP = f"""
%load_ext jupyter_gpu
import dataclasses, statistics, threading, time
from jupyter_gpu.metrics.backends.simulated import SimulatedBackend
from jupyter_gpu.metrics.sampler import THREAD_NAME
from jupyter_gpu.widgets.panel import GpuPanel

_bench_on_sample = GpuPanel._on_sample
_bench_thread_updates = []

def _bench_timed(self, sample):
    started = time.perf_counter()
    _bench_on_sample(self, sample)
    if threading.current_thread().name == THREAD_NAME:
        _bench_thread_updates.append(time.perf_counter() - started)

GpuPanel._on_sample = _bench_timed

def _bench_spin(n):
    # Pure Python, so the interpreter offers the GIL to the sampler thread every switch interval, as a
    # training loop's Python does; one long C call (sum(range(n))) would hold it throughout.
    total = 0
    for i in range(n):
        total += i
    return total

def _bench_timed_spin(n):
    started = time.perf_counter()
    _bench_spin(n)
    return time.perf_counter() - started

def _bench_direct(n, warm_up):
    # One panel fed by hand: each reading is fresh, its timestamp one interval after the last, so the rate
    # limiter lets every call through; the far-future stamps make it drop the sampler thread's own readings.
    # The backend's clock also moves one interval per read, so values change as much as at the real rate
    # (back-to-back reads of the real clock would change few widgets, and send few messages).
    panel = get_ipython().run_line_magic("gpupanel", "-o")
    ticks = iter(range(10**9))
    backend = SimulatedBackend({SCENARIO!r}, clock=lambda: next(ticks) * panel.interval)
    base = time.time() + 1e6
    durations = []
    for i in range(warm_up + n):
        sample = dataclasses.replace(backend.read(), timestamp=base + i * panel.interval)
        started = time.perf_counter()
        panel._on_sample(sample)
        if i >= warm_up:
            durations.append(time.perf_counter() - started)
    shown = panel.latest.timestamp == base + (warm_up + n - 1) * panel.interval
    rows = len(panel.rows)
    panel.close()
    return durations, shown, rows

assert {BACKEND_ENV!r} in __import__("os").environ
"""


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class PanelCost:
    idle: Pooled
    panel: Pooled
    comm_per_s: float
    thread_updates: list[float]
    direct: list[float]
    comm_per_update: float
    rows: int


def panel_cost(kernel: Kernel, seconds: float, rounds: int, updates: int) -> PanelCost:
    idle, panel = Pooled(), Pooled()
    comm_msgs = 0
    window = seconds / rounds
    for index in range(rounds):
        for with_panel in ((True, False) if index % 2 == 0 else (False, True)):
            if with_panel:
                kernel.run("_bench_panel = %gpupanel -o")
            kernel.idle(SETTLE_S)
            before = kernel.counts["comm_msg"]
            kernel.run("_bench_mark = (time.process_time(), time.perf_counter())")
            kernel.idle(window)
            cpu, wall = kernel.run("", "(time.process_time() - _bench_mark[0], time.perf_counter() - _bench_mark[1])")
            if with_panel:
                comm_msgs += kernel.counts["comm_msg"] - before
                panel.add(cpu, wall)
                kernel.run("%gpupanel --close")
            else:
                idle.add(cpu, wall)
    thread_updates = kernel.run("", "_bench_thread_updates")
    before = kernel.counts["comm_msg"]
    direct, shown, rows = kernel.run(f"_bench_result = _bench_direct({updates}, 60)", "_bench_result")
    if not shown:
        raise RuntimeError("The direct updates did not all reach the panel; the timing would be of nothing.")
    # The warm-up calls send messages too; every call is an update here.
    comm_per_update = (kernel.counts["comm_msg"] - before) / (updates + 60)
    return PanelCost(idle, panel, comm_msgs / panel.wall, thread_updates, direct, comm_per_update, rows)


@dataclass
class Blocking:
    loop_n: int
    walls: dict[str, list[float]]
    comm_msgs: dict[str, int]


BLOCKING_CONFIGS: dict[str, list[str]] = {
    "no panel": [],
    "1 panel, 1 s": ["%gpupanel"],
    f"{PANELS} panels, 0.2 s": ["%gpupanel --interval 0.2"] * PANELS,
}


LOOPS_PER_ROUND = 3


def blocking(kernel: Kernel, rounds: int, loop_seconds: float) -> Blocking:
    probe = 10**6
    rate = min(kernel.run(f"_bench_wall = _bench_timed_spin({probe})", "_bench_wall") for _ in range(3))
    loop_n = max(probe, round(probe * loop_seconds / rate))
    walls: dict[str, list[float]] = {name: [] for name in BLOCKING_CONFIGS}
    comm_msgs: Counter[str] = Counter()
    names = list(BLOCKING_CONFIGS)
    for index in range(rounds):
        for name in names[index % len(names):] + names[:index % len(names)]:
            for magic in BLOCKING_CONFIGS[name]:
                kernel.run(magic)  # one cell each: a cell re-run replaces the panel it opened
            kernel.idle(1.0)  # the hub settles on the fastest interval and the panels are updating
            before = kernel.counts["comm_msg"]
            # Several loops per opening: the machine's other load comes and goes within a round too.
            walls[name] += [kernel.run(f"_bench_wall = _bench_timed_spin({loop_n})", "_bench_wall")
                            for _ in range(LOOPS_PER_ROUND)]
            comm_msgs[name] += kernel.counts["comm_msg"] - before
            if BLOCKING_CONFIGS[name]:
                kernel.run("%gpupanel --close")
    return Blocking(loop_n, walls, dict(comm_msgs))


# -- report ----------------------------------------------------------------------------------------------


def report_sampler(results: dict[str, Pooled], read_s: float, seconds: float, rounds: int) -> None:
    labels = {
        "a": f"ours: 1 shared hub, {PANELS} leases at 1 s",
        "b": f"{PANELS} independent Samplers at 1 s",
        "c": f"{PANELS} independent Samplers at 0.1 s",
    }
    print(f"1. Sampler cost in this process, simulated:{SCENARIO} ({PANELS} panels open), "
          f"{seconds:g} s each over {rounds} interleaved rounds")
    # A timed loop keeps caches hot; a read once a second after an idle sleep starts cold, so costs more.
    print(f"   one backend.read() of 8 GPUs, back to back: {read_s * 1e6:.0f} µs")
    for name, label in labels.items():
        result = results[name]
        rate = result.reads / result.wall
        print(f"   {name}. {label:38s} {result.threads:2d} thread{'s' if result.threads != 1 else ' '} "
              f"{rate:5.1f} reads/s  {result.percent:7.3f}% of a core  (rounds {result.spread}%)  "
              f"reads x read cost {100 * rate * read_s:.3f}%, CPU per read {result.cpu / result.reads * 1e6:.0f} µs")
    print(f"   ratio b/a {results['b'].percent / results['a'].percent:.1f}x, "
          f"c/a {results['c'].percent / results['a'].percent:.1f}x")


def report_panel(cost: PanelCost, seconds: float, rounds: int) -> None:
    print(f"2. A panel in a real kernel (panel = %gpupanel -o: 1 s, {cost.rows} GPUs), "
          f"{seconds:g} s each over {rounds} interleaved rounds")
    print(f"   idle kernel, no panel       {cost.idle.percent:7.3f}% of a core  (rounds {cost.idle.spread}%)")
    print(f"   idle kernel, panel open     {cost.panel.percent:7.3f}% of a core  (rounds {cost.panel.spread}%)  "
          f"{cost.comm_per_s:.1f} comm_msg/s reached the client")
    print(f"   the panel's cost            {cost.panel.percent - cost.idle.percent:7.3f}% of a core")
    threaded = cost.thread_updates
    print(f"   one update on the sampler thread: median {statistics.median(threaded) * 1e3:.2f} ms, "
          f"max {max(threaded) * 1e3:.2f} ms (n={len(threaded)})")
    print(f"   one update, direct calls:         median {statistics.median(cost.direct) * 1e3:.2f} ms, "
          f"p99 {_percentile(cost.direct, 0.99) * 1e3:.2f} ms (n={len(cost.direct)}), "
          f"{cost.comm_per_update:.1f} comm_msg per update")


def report_blocking(result: Blocking, rounds: int) -> dict[str, float]:
    # The ratio is of the fastest rounds, as timeit advises: other processes on the machine only ever slow a
    # round down, while the panel's share of the GIL is in every round. The medians' ratio is shown too.
    best, typical = min(result.walls["no panel"]), statistics.median(result.walls["no panel"])
    print(f"3. A pure-Python loop in the kernel ({result.loop_n:,} iterations), {rounds} interleaved rounds "
          f"of {LOOPS_PER_ROUND} loops each")
    ratios = {}
    for name, walls in result.walls.items():
        ratios[name] = min(walls) / best
        print(f"   {name:16s} best {min(walls):6.3f} s  median {statistics.median(walls):6.3f} s  "
              f"ratio {ratios[name]:.3f} (medians {statistics.median(walls) / typical:.3f})  "
              f"{result.comm_msgs[name] / sum(walls):5.0f} comm_msg/s during the loops")
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="per configuration in parts 1 and 2")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds in parts 1 and 2")
    parser.add_argument("--updates", type=int, default=200, help="direct panel updates timed in part 2")
    parser.add_argument("--loop-seconds", type=float, default=1.0, help="length of part 3's loop")
    parser.add_argument("--loop-rounds", type=int, default=4, help="interleaved rounds in part 3")
    args = parser.parse_args()
    if SCENARIO not in SCENARIOS:
        parser.error(f"this jupyter_gpu has no simulated scenario {SCENARIO!r}")
    started = time.perf_counter()

    # Part 1 runs before the kernel client exists: its channel threads would add to this process's CPU time.
    sampler, read_s = sampler_cost(args.seconds, args.rounds)
    report_sampler(sampler, read_s, args.seconds, args.rounds)

    kernel = Kernel()
    try:
        kernel.run(KERNEL_SETUP)
        cost = panel_cost(kernel, args.seconds, args.rounds, args.updates)
        report_panel(cost, args.seconds, args.rounds)
        block = blocking(kernel, args.loop_rounds, args.loop_seconds)
        ratios = report_blocking(block, args.loop_rounds)
    finally:
        kernel.shutdown()
    if kernel.stderr:
        print("kernel stderr (should be empty):\n" + "".join(kernel.stderr)[-2000:])

    print(f"\nSummary (simulated:{SCENARIO}, {os.cpu_count()} CPUs, {time.perf_counter() - started:.0f} s in all)")
    print("| what | figure | ratio |")
    print("|---|---|---|")
    a = sampler["a"].percent
    print(f"| sampler, 1 shared hub, {PANELS} leases at 1 s | {a:.3f}% of a core | 1 |")
    for name, label in (("b", "1 s"), ("c", "0.1 s")):
        print(f"| {PANELS} independent samplers at {label} | {sampler[name].percent:.3f}% of a core "
              f"| {sampler[name].percent / a:.1f} |")
    print(f"| one read of 8 GPUs | {read_s * 1e6:.0f} µs | |")
    print(f"| kernel idle, no panel / 1 panel at 1 s | {cost.idle.percent:.3f}% / {cost.panel.percent:.3f}% "
          f"(panel {cost.panel.percent - cost.idle.percent:.3f}%) | |")
    threaded, p99 = statistics.median(cost.thread_updates), _percentile(cost.direct, 0.99)
    print(f"| one panel update, 8 GPUs: median on the sampler thread / p99 of direct calls "
          f"| {threaded * 1e3:.2f} ms / {p99 * 1e3:.2f} ms | |")
    for name, ratio in ratios.items():
        print(f"| Python loop, {name} (best of {len(block.walls[name])}) | {min(block.walls[name]):.3f} s "
              f"| {ratio:.3f} |")


if __name__ == "__main__":
    main()
