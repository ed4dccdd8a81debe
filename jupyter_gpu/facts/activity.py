"""The GPU readings taken while the notebook's last cells ran, for `LOW_GPU_UTILIZATION` (facts, not verdicts).

Read from the process's shared sampler only when something already keeps it running (an open `%gpupanel`, the
kernel-start watch): `%gpucheck` never starts NVML for this. The result goes into the facts snapshot, so the
diagnosis stays a pure function of it.
"""

from __future__ import annotations

import os
from typing import Any

from jupyter_gpu.metrics.hub import shared_hub
from jupyter_gpu.metrics.sample import Sample


def reading(sample: Sample) -> dict[str, Any]:
    """One sampler reading as the snapshot keeps it (and `cell_usage` reads it)."""
    return {"t": sample.timestamp,
            "devices": [{"index": d.index, "uuid": d.uuid, "name": d.name, "utilization_gpu": d.utilization_gpu,
                         "pids": None if d.processes is None else [p.pid for p in d.processes]}
                        for d in sample.devices]}


def running_samples() -> list[Sample]:
    """The shared sampler's kept readings when something keeps it running; [] otherwise (nothing is started)."""
    sampler = shared_hub().sampler
    return sampler.history() if sampler is not None else []


def gather_activity(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """`cells`: [{"execution_count", "started", "ended", ...}] (wall clock; `%gpucells`' GPU figures ride along).
    Keys: `cells`, `pid`, `backend`, `simulated`, `samples`: [`reading`], only the readings inside a recorded cell;
    empty when no sampler was running."""
    samples = running_samples()
    windows = [(c["started"], c["ended"]) for c in cells]
    kept = [s for s in samples if s.status == "ok" and any(a < s.timestamp <= b for a, b in windows)]
    return {
        "cells": cells,
        "pid": os.getpid(),
        "backend": samples[-1].backend if samples else None,
        "simulated": bool(samples and samples[-1].simulated),
        "samples": [reading(s) for s in kept],
    }
