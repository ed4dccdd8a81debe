"""What does `jupyter-gpu allreduce` measure, and cost, beside the all-reduce benchmark users write themselves?

Two contestants, each a fresh process per round, on the same sizes (1 KiB .. 16 MiB by x4 unless --sizes), the
same timed iterations and warm-up per size:

1. **ours**: `python -m jupyter_gpu allreduce --backend B --sizes ... --iterations N --json -q`: one
   `allreduce_worker` process per rank, each iteration timed alone, the slowest rank's median; then a separate
   iteration whose exact sum is known, every element checked (#wrong).
2. **hand-rolled**: what a user writes from the torch.distributed tutorial, in a .py module so that
   `torch.multiprocessing.spawn` can import its function: `init_process_group`, per size `torch.ones` all-reduced
   warm-up times, a barrier, then the timed loop on rank 0 (`perf_counter` around the N calls, divided by N, a
   `torch.cuda.synchronize()` before each reading with NCCL); nothing is checked.

Per size: the median busbw of each over the rounds (busbw = algbw x 2(n-1)/n, nccl-tests' formula, applied to both)
and ours / hand-rolled; per contestant the median wall time of the whole process (torch imports included) and
ours' init (starting the ranks to the first collective ready). gloo with 2 processes on the CPU always; NCCL with
one process per GPU too when this torch has NCCL and sees a GPU. Rounds alternate which contestant goes first.

    .venv/bin/python bench/bench_allreduce.py [--rounds 3] [--sizes 1K:16M:4] [--iterations 10] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from tables import print_report

from jupyter_gpu.distributed.collective import (
    DEFAULT_ITERATIONS,
    DEFAULT_SIZES,
    DEFAULT_WARMUP,
    bandwidths,
    parse_sizes,
)
from jupyter_gpu.rendering.units import format_bytes

HAND_ROLLED = '''
import json, os, sys, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, world, backend, sizes, iterations, warmup, port, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    times = []
    for size in sizes:
        x = torch.ones(size // 4, device=device)
        for _ in range(warmup):
            dist.all_reduce(x)
        if backend == "nccl":
            torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            dist.all_reduce(x)
        if backend == "nccl":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / iterations)
    if rank == 0:
        with open(out, "w") as handle:
            json.dump(times, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    world, backend, sizes, iterations, warmup, port, out = json.loads(sys.argv[1])
    mp.spawn(run, args=(world, backend, sizes, iterations, warmup, port, out), nprocs=world)
'''


@dataclass
class Runs:
    busbw: dict[int, list[float]] = field(default_factory=dict)  # size -> one figure per round
    wall: list[float] = field(default_factory=list)
    init: list[float] = field(default_factory=list)
    wrong: int = 0  # ours only: the hand-rolled script checks nothing

    def add(self, sizes: list[int], busbw: list[float], wall: float) -> None:
        for size, figure in zip(sizes, busbw, strict=True):
            self.busbw.setdefault(size, []).append(figure)
        self.wall.append(wall)


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def ours(backend: str, world: int, sizes: list[int], iterations: int, runs: Runs) -> None:
    command = [sys.executable, "-m", "jupyter_gpu", "allreduce", "--backend", backend, "--processes", str(world),
               "--sizes", ",".join(str(size) for size in sizes), "--iterations", str(iterations), "--json", "-q"]
    begun = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - begun
    if done.returncode not in (0, 1) or not done.stdout:
        raise SystemExit(f"ours failed ({done.returncode}):\n{done.stderr}")
    result = json.loads(done.stdout)
    runs.add(sizes, [row["busbw"] for row in result["rows"]], wall)
    runs.init.append(result["init_s"])
    runs.wrong += sum(row["wrong"] for row in result["rows"])


def hand_rolled(script: Path, backend: str, world: int, sizes: list[int], iterations: int, runs: Runs) -> None:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        plan = json.dumps([world, backend, sizes, iterations, DEFAULT_WARMUP, free_port(), out.name])
        begun = time.perf_counter()
        done = subprocess.run([sys.executable, str(script), plan], capture_output=True, text=True, timeout=600)
        wall = time.perf_counter() - begun
        if done.returncode != 0:
            raise SystemExit(f"the hand-rolled script failed ({done.returncode}):\n{done.stderr}")
        times = json.loads(Path(out.name).read_text())
    runs.add(sizes, [bandwidths(size, t, world)[1] for size, t in zip(sizes, times, strict=True)], wall)


def gpu_backend() -> tuple[str, int] | None:
    """("nccl", GPUs) when this torch has NCCL and sees a GPU; asked of a child, as ours does."""
    probe = ("import json, torch, torch.distributed as d; print(json.dumps([d.is_available() and "
             "d.is_nccl_available(), torch.cuda.device_count() if torch.cuda.is_available() else 0]))")
    nccl, gpus = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                           check=True).stdout)
    return ("nccl", gpus) if nccl and gpus >= 1 else None


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


HEADINGS = ("backend", "size", "ours busbw GB/s", "hand-rolled busbw GB/s", "ours / hand-rolled")


def table_rows(results: list[tuple[str, int, list[int], Runs, Runs]]) -> list[list[str]]:
    rows = []
    for backend, world, sizes, mine, theirs in results:
        for size in sizes:
            a, b = median(mine.busbw[size]), median(theirs.busbw[size])
            rows.append([f"{backend} x{world}", format_bytes(size), f"{a / 1e9:.3g}", f"{b / 1e9:.3g}",
                         f"{a / b:.2f}" if b > 0 else "n/a"])
        rows.append([f"{backend} x{world}", "wall (s)", f"{median(mine.wall):.2f}", f"{median(theirs.wall):.2f}",
                     f"{median(mine.wall) / median(theirs.wall):.2f}"])
    return rows


def summary(results: list[tuple[str, int, list[int], Runs, Runs]]) -> None:
    print()
    for backend, world, sizes, mine, theirs in results:
        elements = sum(size // 4 for size in sizes) * world * len(mine.wall)
        print(f"{backend} x{world}: ours checked {elements:,} elements, {mine.wrong:,} wrong (the hand-rolled "
              f"script checks none); ours' init (ranks started to first collective ready) median "
              f"{median(mine.init):.2f} s; wall per round ours {', '.join(f'{w:.2f}' for w in mine.wall)} s, "
              f"hand-rolled {', '.join(f'{w:.2f}' for w in theirs.wall)} s")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", type=parse_sizes, default=list(DEFAULT_SIZES))
    parser.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS)
    parser.add_argument("--markdown", action="store_true", help="the table as Markdown, to paste in docs")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    sizes = [max(4, size // 4 * 4) for size in args.sizes]  # whole float32 elements, as both contestants send
    setups = [("gloo", 2)]
    gpu = gpu_backend()
    if gpu is not None:
        setups.append(gpu)
    import torch

    print(f"torch {torch.__version__}, Python {platform.python_version()}, {os.cpu_count()} CPUs; {args.rounds} "
          f"rounds; {args.iterations} timed iterations and {DEFAULT_WARMUP} warm-up per size; "
          f"{'NCCL on ' + str(gpu[1]) + ' GPU(s)' if gpu else 'no NCCL GPU: gloo only'}\n", flush=True)
    begun = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "hand_rolled_allreduce.py"
        script.write_text(HAND_ROLLED)
        for backend, world in setups:
            mine, theirs = Runs(), Runs()
            for round_index in range(args.rounds):
                contestants = [partial(ours, backend, world, sizes, args.iterations, mine),
                               partial(hand_rolled, script, backend, world, sizes, args.iterations, theirs)]
                for contestant in contestants if round_index % 2 == 0 else reversed(contestants):
                    contestant()
                print(f"done: {backend} round {round_index + 1}", flush=True)
            results.append((backend, world, sizes, mine, theirs))
    print_report(HEADINGS, table_rows(results), args.markdown, [lambda: summary(results)], begun)


if __name__ == "__main__":
    main()
