"""Simulated GPU memory that real processes "hold": how a notebook takes memory on a simulated GPU.

A process on a real GPU shows up in NVML's process list once it allocates. On a machine without a GPU,
a process (a notebook's kernel, a helper started by a test) calls `claim_memory("22GB", device=0)`; the
simulated backend then lists that real pid with that memory, for as long as the process lives. This is
what lets the server's attribution (pid -> kernel -> notebook) run for real in demos and browser tests.

Claims live in the directory `JUPYTER_GPU_SIMULATED_CLAIMS` names, one JSON file per process; without
that variable nothing is claimed and the simulated backend behaves as before.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from jupyter_gpu.metrics.sample import DeviceSample, GpuProcess
from jupyter_gpu.rendering.units import parse_bytes

CLAIMS_ENV = "JUPYTER_GPU_SIMULATED_CLAIMS"


def _directory(directory: str | os.PathLike[str] | None) -> Path:
    value = directory if directory is not None else os.environ.get(CLAIMS_ENV)
    if not value:
        raise ValueError(f"Set {CLAIMS_ENV} to a directory (the simulated server's claims) before claiming memory.")
    return Path(value)


def claim_memory(amount: int | str, device: int = 0, *, directory: str | os.PathLike[str] | None = None,
                 pid: int | None = None) -> Path:
    """Make `pid` (this process by default) hold `amount` bytes ("22GB", "512MiB") on simulated GPU `device`."""
    nbytes = parse_bytes(amount) if isinstance(amount, str) else int(amount)
    if nbytes < 0 or device < 0:
        raise ValueError(f"A claim needs a non-negative amount and device, got {amount!r} on GPU {device}.")
    folder = _directory(directory)
    folder.mkdir(parents=True, exist_ok=True)
    pid = os.getpid() if pid is None else pid
    path = folder / f"{pid}.json"
    claims = _read_file(path)
    claims[str(device)] = nbytes
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(claims))
    temporary.replace(path)  # atomic: the sampler never reads half a file
    return path


def release_memory(*, directory: str | os.PathLike[str] | None = None, pid: int | None = None) -> None:
    path = _directory(directory) / f"{os.getpid() if pid is None else pid}.json"
    path.unlink(missing_ok=True)


def _read_file(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def read_claims(directory: Path) -> dict[int, list[GpuProcess]]:
    """device index -> the live processes claiming memory on it."""
    by_device: dict[int, list[GpuProcess]] = {}
    try:
        files = sorted(directory.glob("*.json"))
    except OSError:
        return by_device
    for path in files:
        if not path.stem.isdigit() or not _alive(int(path.stem)):
            continue
        for device, nbytes in _read_file(path).items():
            if device.isdigit():
                by_device.setdefault(int(device), []).append(GpuProcess(int(path.stem), nbytes))
    return by_device


def apply_claims(devices: tuple[DeviceSample, ...], claims: dict[int, list[GpuProcess]]) -> tuple[DeviceSample, ...]:
    """The devices with the claiming processes listed and their memory counted (never beyond the total)."""
    result = []
    for device in devices:
        extra = claims.get(device.index)
        if not extra or device.status != "ok":
            result.append(device)
            continue
        used = (device.memory_used or 0) + sum(p.memory_used or 0 for p in extra)
        if device.memory_total:
            used = min(used, device.memory_total)
        processes = tuple(sorted((*(device.processes or ()), *extra), key=lambda p: (-(p.memory_used or 0), p.pid)))
        result.append(replace(device, memory_used=used, processes=processes))
    return tuple(result)
