"""What this device reaches, measured here: a big matmul in the step's compute format and a big copy.

A datasheet peak exists only for the GPUs in `peaks.py` and says nothing of a CPU; the measured ceiling applies
to every device, so the profile can always say "x% of what this device reaches on a big matmul". Inputs are
filled with a constant (no random generator is touched), TF32 is switched on only for a tf32 step and put back.
The whole measurement takes the budget the caller gives it (at most 0.35 s in a profile), after one warm-up call each.
"""

from __future__ import annotations

import time
from typing import Any

from jupyter_gpu.gpuprofile.peaks import BF16, FP16, TF32

MATMUL_SECONDS = 0.25
COPY_SECONDS = 0.1


def measure_ceiling(torch: Any, device: str, compute: str, budget: float = MATMUL_SECONDS + COPY_SECONDS
                    ) -> tuple[float, float | None, float]:
    """(matmul FLOP/s, copy bytes/s or None, seconds spent) on `device` in `compute`, timing each for its share of
    `budget` seconds (at least one call each, after a warm-up call)."""
    matmul_seconds = budget * MATMUL_SECONDS / (MATMUL_SECONDS + COPY_SECONDS)
    from jupyter_gpu.speedprobe.flags import GlobalFlags, enable_tf32

    began = time.perf_counter()
    dtype = {BF16: torch.bfloat16, FP16: torch.float16}.get(compute, torch.float32)
    on_cuda = device.startswith("cuda")
    size = (8192 if compute in (BF16, FP16) else 4096) if on_cuda else 1024
    flags = GlobalFlags.take(torch)
    try:
        if compute == TF32:
            enable_tf32(torch)
        out = torch.empty(size, size, dtype=dtype, device=device)
        matmul = _rate(torch, device, lambda a, b: torch.mm(a, b, out=out), size, dtype, matmul_seconds,
                       work=2 * size ** 3)

        bandwidth = _copy_rate(torch, device, budget - matmul_seconds)
    finally:
        flags.restore(torch)
    return matmul, bandwidth, time.perf_counter() - began


def _synchronize(torch: Any, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _rate(torch: Any, device: str, run: Any, size: int, dtype: Any, seconds: float, work: int) -> float:
    a = torch.full((size, size), 0.5, dtype=dtype, device=device)
    b = torch.full((size, size), 0.25, dtype=dtype, device=device)
    run(a, b)  # warm-up: the library picks its kernel, the allocator grows
    _synchronize(torch, device)
    calls, began = 0, time.perf_counter()
    while True:
        run(a, b)
        calls += 1
        if calls % 4 == 0 or not device.startswith("cuda"):
            _synchronize(torch, device)
            elapsed = time.perf_counter() - began
            if elapsed >= seconds:
                return calls * work / elapsed


def _copy_rate(torch: Any, device: str, seconds: float) -> float | None:
    """Bytes read plus written per second by a large device-to-device copy."""
    elements = (256 if device.startswith("cuda") else 32) * 1024 * 1024 // 4
    try:
        source = torch.full((elements,), 1.0, dtype=torch.float32, device=device)
        target = torch.empty_like(source)
    except RuntimeError:  # not enough memory for the probe: no measured bandwidth
        return None
    target.copy_(source)
    _synchronize(torch, device)
    calls, began = 0, time.perf_counter()
    while True:
        target.copy_(source)
        calls += 1
        _synchronize(torch, device)
        elapsed = time.perf_counter() - began
        if elapsed >= seconds:
            return calls * 2 * source.numel() * source.element_size() / elapsed
