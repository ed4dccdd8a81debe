"""Run the checked all-reduce: one `allreduce_worker` process per rank, rank 0's JSON lines streamed back, and
no process ever left behind.

Ranks are `python -m jupyter_gpu.distributed.allreduce_worker` children, each in its own session, so this works
from a notebook (whose functions a spawned child cannot unpickle) and a hung rank can be killed with whatever it
started. Nothing here imports torch or initialises CUDA: a child answers what this torch offers.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jupyter_gpu.distributed.collective import (
    DEFAULT_ITERATIONS,
    DEFAULT_SIZES,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WARMUP,
    P2P_FIX,
    P2P_SIZE,
    AllReduceResult,
    PeerCopy,
    SizeResult,
)
from jupyter_gpu.distributed.links import LinkPeak
from jupyter_gpu.probekit.child_processes import Children, free_port, tail
from jupyter_gpu.rendering.units import format_bytes, format_seconds

WORKER = "jupyter_gpu.distributed.allreduce_worker"
GLOO_PROCESSES = 2  # enough to exercise the launch, the collective and the check on any CPU
P2P_ITERATIONS = 5
NCCL_DEBUG_HINT = "Rerun with `NCCL_DEBUG=WARN jupyter-gpu allreduce`: NCCL then says why."
POLL_S = 0.05

Progress = Callable[[str], None]


class AllReduceError(RuntimeError):
    """A rank failed or hung; the message says which, where, what it printed, and what to try."""


def run_allreduce(
    *,
    backend: str = "auto",
    processes: int | None = None,
    sizes: Sequence[int] = DEFAULT_SIZES,
    iterations: int = DEFAULT_ITERATIONS,
    warmup: int = DEFAULT_WARMUP,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    peak: LinkPeak | None = None,
    on_progress: Progress | None = None,
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
) -> AllReduceResult:
    """All-reduce every size across `processes` ranks, check every element, and (NCCL, two GPUs or more) copy
    between every pair of GPUs. `backend="auto"`: NCCL with one process per GPU when this torch has NCCL and a
    GPU, else gloo with two processes on the CPU. `timeout_s` bounds the whole run, imports included.

    ValueError for a plan that cannot run here; AllReduceError when a rank fails or hangs."""
    _validate(backend, processes, sizes, iterations, warmup, timeout_s)
    progress = on_progress or (lambda _text: None)
    started = time.monotonic()
    deadline = started + timeout_s
    base_env = dict(os.environ if env is None else env)
    offer = _inspect(python, base_env, deadline) if backend in ("auto", "nccl") else None
    chosen = _choose_backend(backend, offer)
    gpus = int(offer["gpus"]) if offer else 0
    world = processes or (gpus if chosen == "nccl" else GLOO_PROCESSES)
    if chosen == "nccl" and world > gpus:
        raise ValueError(f"NCCL needs one GPU per process, and {gpus} GPU{'s are' if gpus != 1 else ' is'} visible: "
                         f"use --processes {gpus} or fewer (or --backend gloo).")
    notes: list[str] = []
    peak = _comparable_peak(chosen, peak, notes)

    p2p: tuple[PeerCopy, ...] = ()
    if chosen == "nccl" and gpus >= 2:
        # First: a hung all-reduce is then explained by the copies (nccl-tests #117: P2P returns zeros, NCCL hangs).
        p2p = _run_p2p(python, base_env, deadline, progress)
    progress(f"starting {world} {chosen} process{'es' if world != 1 else ''}…")
    plan = {"backend": chosen, "sizes": list(sizes), "iterations": iterations, "warmup": warmup,
            "timeout_s": max(1, int(timeout_s))}
    try:
        devices, rows, init_s = _run_ranks(python, base_env, plan, world, deadline, timeout_s, peak, progress)
    except AllReduceError as exc:
        wrong = [copy for copy in p2p if copy.wrong]
        if not wrong:
            raise
        raise AllReduceError(f"{exc}\nBefore it, the P2P copy {wrong[0].src} -> {wrong[0].dst} returned wrong "
                             f"values: P2P between these GPUs is broken; `{P2P_FIX}` avoids it.") from None
    return AllReduceResult(backend=chosen, world_size=world, devices=tuple(devices), rows=tuple(rows), p2p=p2p,
                           peak=peak, init_s=init_s, wall_s=time.monotonic() - started, notes=tuple(notes))


def _validate(backend: str, processes: int | None, sizes: Sequence[int], iterations: int, warmup: int,
              timeout_s: float) -> None:
    if backend not in ("auto", "nccl", "gloo"):
        raise ValueError(f"backend must be auto, nccl or gloo, not {backend!r}.")
    if processes is not None and processes < 1:
        raise ValueError(f"processes must be at least 1, not {processes}.")
    if not sizes or any(size < 1 for size in sizes):
        raise ValueError("sizes must be one or more positive byte counts.")
    if iterations < 1 or warmup < 0:
        raise ValueError("iterations must be at least 1 and warmup at least 0.")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, not {timeout_s}.")


def _choose_backend(backend: str, offer: Mapping[str, Any] | None) -> str:
    if backend == "gloo":
        return "gloo"
    assert offer is not None
    usable = bool(offer["nccl"]) and int(offer["gpus"]) >= 1
    if backend == "auto":
        return "nccl" if usable else "gloo"
    if not offer["nccl"]:
        raise AllReduceError(f"This torch ({offer.get('torch')}) has no NCCL (a CPU build, or a platform without "
                             "it): use --backend gloo, or install a CUDA build of torch.")
    if not usable:
        raise AllReduceError("NCCL needs a CUDA GPU, and this torch sees none (CUDA_VISIBLE_DEVICES, the driver, "
                             "or no GPU): `jupyter-gpu check` says why; --backend gloo runs on the CPU.")
    return "nccl"


def _comparable_peak(backend: str, peak: LinkPeak | None, notes: list[str]) -> LinkPeak | None:
    if peak is None or backend != "nccl":
        return None  # gloo reduces through the CPU: a GPU link's peak says nothing about its figures
    if peak.simulated:
        notes.append(f"The link peak given ({peak.description}) is simulated and describes GPUs this machine lacks: "
                     "not compared.")
        return None
    return peak


def _inspect(python: str, env: Mapping[str, str], deadline: float) -> dict[str, Any]:
    """What the interpreter's torch offers, asked of a child so CUDA is never initialised here."""
    try:
        done = subprocess.run([python, "-m", WORKER, "--inspect"], env=dict(env), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=max(deadline - time.monotonic(), 0.1),
                              start_new_session=True)
    except subprocess.TimeoutExpired:
        raise AllReduceError("The child asked which backend this torch offers did not answer in time "
                             "(importing torch); raise --timeout.") from None
    except OSError as exc:
        raise AllReduceError(f"Cannot start {python}: {exc.strerror or exc}.") from None
    for line in done.stdout.splitlines():
        record = _json_line(line)
        if record and record.get("event") == "inspect":
            return record
    raise AllReduceError(f"{python} could not say which backend its torch offers (exit code {done.returncode}):\n"
                         + tail(done.stderr))


def _json_line(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None  # a library's own print on stdout
    return record if isinstance(record, dict) else None


def _rank_env(base: Mapping[str, str], rank: int, world: int, port: int) -> dict[str, str]:
    return {**base, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world)}


def _events(children: Children, stream: queue.Queue[str | None], deadline: float,
            on_failure: Callable[[list[int]], AllReduceError],
            on_timeout: Callable[[], AllReduceError]) -> Any:
    """Rank 0's JSON records as they arrive; raises what `on_failure` makes as soon as any child fails (a dead peer
    can leave the others blocked for NCCL's or gloo's own timeout) and what `on_timeout` makes at the deadline."""
    ended = False
    while True:
        failed = children.failed()
        if failed:
            raise on_failure(failed)
        if ended:
            if children.wait_all(min(deadline, time.monotonic() + POLL_S)):
                failed = children.failed()
                if failed:
                    raise on_failure(failed)
                return
            if time.monotonic() >= deadline:
                raise on_timeout()
            continue
        if time.monotonic() >= deadline:
            raise on_timeout()
        try:
            line = stream.get(timeout=POLL_S)
        except queue.Empty:
            continue
        if line is None:
            ended = True  # rank 0 closed stdout: it is exiting; the others are checked above
            continue
        record = _json_line(line)
        if record is not None:
            yield record


def _blame_order(code: int | None) -> int:
    """How likely a rank's exit is the cause rather than a consequence: killed by a signal from outside or by its
    own crash (0), aborted after a peer went away (1), exited (2)."""
    if code is not None and code < 0:
        return 1 if -code == signal.SIGABRT else 0
    return 2


def _run_ranks(python: str, base_env: Mapping[str, str], plan: dict[str, Any], world: int, deadline: float,
               timeout_s: float, peak: LinkPeak | None,
               progress: Progress) -> tuple[list[str], list[SizeResult], float]:
    backend = plan["backend"]
    sizes = plan["sizes"]
    children = Children(AllReduceError)
    stream: queue.Queue[str | None] = queue.Queue()
    where = ["while the ranks were starting (importing torch, init_process_group)"]
    devices: list[str] = []
    rows: list[SizeResult] = []
    init_s = 0.0
    launched = time.monotonic()

    def failure(failed: list[int]) -> AllReduceError:
        # The rank a signal killed, else the lowest: the others usually only report that their peer went away. An
        # abort counts last among signals: a gloo rank whose peer was killed aborts itself ("terminate called
        # without an active exception"), and a clean clone's CI once named that rank 0 instead of the killed rank 1.
        first = min(failed, key=lambda index: _blame_order(children.processes[index].returncode))
        others = "".join(f"\n(rank {index} {children.exit_text(index)} too)" for index in failed if index != first)
        hint = f"\n{NCCL_DEBUG_HINT}" if backend == "nccl" else ""
        return AllReduceError(f"Rank {first} of {world} ({backend}) {children.exit_text(first)} {where[0]}; its last "
                              f"stderr lines:\n{children.stderr_tail(first)}{others}{hint}")

    def timeout() -> AllReduceError:
        advice = (f"\nA hang at one size is what broken P2P looks like (nccl-tests #117): try `{P2P_FIX}`; "
                  f"{NCCL_DEBUG_HINT}") if backend == "nccl" else \
            "\nEvery rank was stopped; on a slow or busy machine a longer --timeout may be all it needs."
        return AllReduceError(f"The all-reduce did not finish within {timeout_s:g} s: it hung {where[0]} "
                              f"({len(rows)} of {len(sizes)} sizes done).{advice}")

    try:
        command = [python, "-m", WORKER, json.dumps(plan)]
        port = free_port()
        for rank in range(world):
            children.start(command, _rank_env(base_env, rank, world, port), stream=stream if rank == 0 else None)
        for record in _events(children, stream, deadline, failure, timeout):
            event = record.get("event")
            if event == "ready":
                init_s = time.monotonic() - launched
                devices = [str(device) for device in record.get("devices") or []]
                progress(f"{world} ranks ready in {init_s:.1f} s")
            elif event == "start":
                where[0] = f"at {format_bytes(record['size_bytes'])}"
            elif event == "size":
                row = SizeResult.measured(size_bytes=record["size_bytes"], elements=record["elements"],
                                          dtype=record["dtype"], iterations=record["iterations"],
                                          time_s=record["time_s"], wrong=record["wrong"], world_size=world, peak=peak)
                rows.append(row)
                # Until rank 0 says it started the next size, a rank that dies did so between the two: "at 4.0 KiB"
                # would name a size that was done (a rank killed right after the first size's line said so).
                where[0] = f"after {format_bytes(row.size_bytes)}, before the next size started"
                progress(f"{format_bytes(row.size_bytes)}: {format_seconds(row.time_s)}, busbw {row.busbw / 1e9:.2f} "
                         f"GB/s, {row.wrong:,} wrong ({len(rows)}/{len(sizes)})")
            elif event == "done":
                where[0] = "while the ranks were shutting down (destroy_process_group)"
        if len(rows) != len(sizes):
            raise AllReduceError(f"Rank 0 stopped after {len(rows)} of {len(sizes)} sizes without an error; its last "
                                 f"stderr lines:\n{children.stderr_tail(0)}")
    finally:
        children.stop()
    return devices, rows, init_s


def _run_p2p(python: str, base_env: Mapping[str, str], deadline: float, progress: Progress) -> tuple[PeerCopy, ...]:
    children = Children(AllReduceError)
    stream: queue.Queue[str | None] = queue.Queue()
    where = ["while starting"]
    copies: list[PeerCopy] = []

    def failure(_failed: list[int]) -> AllReduceError:
        return AllReduceError(f"The peer-to-peer copy check {children.exit_text(0)} {where[0]}; its last stderr "
                              f"lines:\n{children.stderr_tail(0)}")

    def timeout() -> AllReduceError:
        return AllReduceError(f"The peer-to-peer copy hung {where[0]} and was stopped; broken P2P hangs or returns "
                              f"zeros (nccl-tests #117): try `{P2P_FIX}`.")

    try:
        plan = {"size": P2P_SIZE, "iterations": P2P_ITERATIONS}
        children.start([python, "-m", WORKER, "--p2p", json.dumps(plan)], base_env, stream=stream)
        for record in _events(children, stream, deadline, failure, timeout):
            if record.get("event") == "start":
                where[0] = f"at {record['src']} -> {record['dst']}"
            elif record.get("event") == "p2p":
                time_s = float(record["time_s"])
                copy = PeerCopy(record["src"], record["dst"], int(record["size_bytes"]), int(record["wrong"]),
                                record["size_bytes"] / time_s if time_s > 0 else 0.0)
                copies.append(copy)
                progress(f"P2P {copy.src} -> {copy.dst}: {copy.bytes_per_s / 1e9:.1f} GB/s, {copy.wrong:,} wrong")
    finally:
        children.stop()
    return tuple(copies)
