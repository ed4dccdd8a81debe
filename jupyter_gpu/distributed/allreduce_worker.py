"""One rank of `jupyter-gpu allreduce`, run as `python -m jupyter_gpu.distributed.allreduce_worker PLAN`.

A module, not a function of the caller: ranks started from a notebook cannot unpickle functions defined there.
Each rank reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT from the environment, as torchrun sets
them; PLAN is JSON: {"backend": "gloo"|"nccl", "sizes": [bytes, ...], "iterations": N, "warmup": W}. Rank 0 prints
one JSON line per event on stdout (the caller streams them); the other ranks print nothing.

Two more modes, each a single process: `--inspect` prints what this torch offers (NCCL, how many GPUs), so the
caller never initialises CUDA itself; `--p2p PLAN` ({"size": bytes, "iterations": N}) copies a patterned tensor
between every ordered pair of GPUs and counts the elements that arrived wrong (nccl-tests #117: broken P2P
returns zeros without an error).

Imports nothing of jupyter_gpu: it starts once per rank, and torch's import is cost enough.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from datetime import timedelta
from typing import Any

ELEMENT_BYTES = 4  # float32: every pattern below, and its sum over up to thousands of ranks, is exact
PATTERN_PERIOD = 7  # x[i] = (rank + 1) * (i % 7 + 1): never 0, so a transfer that returns zeros is counted wrong


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def inspect() -> None:
    import torch
    import torch.distributed as dist

    nccl = dist.is_available() and dist.is_nccl_available()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    emit("inspect", torch=torch.__version__, nccl=bool(nccl), gpus=gpus,
         names=[torch.cuda.get_device_name(i) for i in range(gpus)])


def pattern(elements: int, device: Any, scale: int) -> Any:
    import torch

    base = torch.arange(elements, dtype=torch.int32, device=device) % PATTERN_PERIOD + 1
    return (base * scale).to(torch.float32)


def synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rank_main(plan: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    backend = plan["backend"]
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        description = f"cuda:{local_rank} {torch.cuda.get_device_name(device)}"
    else:
        device = torch.device("cpu")
        description = "cpu"
        # Ranks share the CPU cores: torch's default of one thread per core in every rank oversubscribes them.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    started = time.perf_counter()
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=plan.get("timeout_s", 600)))
    try:
        devices: list[Any] = [None] * world
        dist.all_gather_object(devices, description)
        dist.barrier(**({"device_ids": [local_rank]} if backend == "nccl" else {}))
        if rank == 0:
            emit("ready", devices=devices, init_process_group_s=time.perf_counter() - started)
        for size_bytes in plan["sizes"]:
            measure_size(rank, world, device, size_bytes, plan["iterations"], plan["warmup"])
        if rank == 0:
            emit("done")
    finally:
        dist.destroy_process_group()


def measure_size(rank: int, world: int, device: Any, size_bytes: int, iterations: int, warmup: int) -> None:
    import torch
    import torch.distributed as dist

    elements = max(1, size_bytes // ELEMENT_BYTES)
    if rank == 0:
        emit("start", size_bytes=elements * ELEMENT_BYTES)
    # Zeros for timing: sums of zeros stay zero however many iterations run (ones would overflow to inf).
    buffer = torch.zeros(elements, dtype=torch.float32, device=device)
    for _ in range(warmup):
        dist.all_reduce(buffer)
    synchronize(device)
    dist.barrier()  # every rank starts the timed loop together, so no rank's time includes waiting for a late peer
    times = []
    for _ in range(iterations):
        begun = time.perf_counter()
        dist.all_reduce(buffer)
        synchronize(device)
        times.append(time.perf_counter() - begun)
    # The check is its own iteration with a known exact sum: timing never includes the comparison.
    checked = pattern(elements, device, rank + 1)
    dist.all_reduce(checked)
    expected = pattern(elements, device, world * (world + 1) // 2)
    wrong = int((checked != expected).sum().item())
    del checked, expected, buffer
    # Rank 0 reports the sum of every rank's wrong count and the slowest rank's median, as nccl-tests does.
    summary = torch.tensor([float(wrong)], dtype=torch.float64, device=device)
    dist.all_reduce(summary)
    slowest = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        emit("size", size_bytes=elements * ELEMENT_BYTES, elements=elements, dtype="float32", iterations=iterations,
             time_s=float(slowest.item()), wrong=int(summary.item()))


def p2p_main(plan: dict[str, Any]) -> None:
    import torch

    gpus = torch.cuda.device_count()
    elements = max(1, plan["size"] // ELEMENT_BYTES)
    for src in range(gpus):
        for dst in range(gpus):
            if src == dst:
                continue
            emit("start", src=f"cuda:{src}", dst=f"cuda:{dst}")
            source, target = torch.device("cuda", src), torch.device("cuda", dst)
            sent = pattern(elements, source, 1)
            expected = pattern(elements, target, 1)
            times = []
            for _ in range(max(1, plan["iterations"])):
                synchronize(source)
                begun = time.perf_counter()
                received = sent.to(target, non_blocking=False)
                synchronize(source)
                synchronize(target)
                times.append(time.perf_counter() - begun)
            wrong = int((received != expected).sum().item())  # the last copy, as a user's `.to()` would get it
            emit("p2p", src=f"cuda:{src}", dst=f"cuda:{dst}", size_bytes=elements * ELEMENT_BYTES, wrong=wrong,
                 time_s=statistics.median(times))
            del sent, expected, received
    emit("done")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--inspect"]:
        inspect()
    elif argv[:1] == ["--p2p"] and len(argv) == 2:
        p2p_main(json.loads(argv[1]))
    elif len(argv) == 1:
        rank_main(json.loads(argv[0]))
    else:
        print("usage: python -m jupyter_gpu.distributed.allreduce_worker PLAN | --p2p PLAN | --inspect",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
