"""Gather every fact the multi-GPU readiness check needs into one JSON-serialisable snapshot.

The torch side (NCCL, the visible GPUs) is read in a child of the kernel's interpreter, the topology from NVML
(or the simulated backend JUPYTER_GPU_BACKEND names), the host from files under the context's root, and the
launch facts in this process without touching CUDA.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jupyter_gpu.atomic_write import write_text_atomically
from jupyter_gpu.distributed.host_facts import gather_host_facts
from jupyter_gpu.distributed.launch_facts import gather_launch_facts
from jupyter_gpu.distributed.nvml_topology import read_nvml_topology, topology_for_backend
from jupyter_gpu.facts.context import ProbeContext
from jupyter_gpu.facts.probe import start_probe
from jupyter_gpu.version import __version__

SCHEMA_NAME = "jupyter-gpu/distributed-facts"
SCHEMA_VERSION = 1


def gather_readiness(ctx: ProbeContext, *, user_ns: Mapping[str, Any] | None = None, nvml: Any | None = None) -> dict:
    """`user_ns`: the notebook's namespace (None from the command line). `nvml`: a pynvml-like module to read
    the topology from instead of the backend the environment names (tests)."""
    started = time.monotonic()
    child = start_probe(ctx, ("distributed",))  # importing torch takes seconds: read the rest meanwhile
    topology = read_nvml_topology(nvml) if nvml is not None else topology_for_backend(ctx.env)
    host, launch = gather_host_facts(ctx), gather_launch_facts(user_ns)
    probe = child.result()
    torch_facts = probe.get("distributed") or {}
    if not probe.get("run", {}).get("ok"):
        torch_facts = {"probe_error": _probe_failure(probe.get("run") or {})}
    snapshot = readiness_snapshot(torch_facts, topology.to_dict(), host, launch)
    snapshot["duration_s"] = round(time.monotonic() - started, 3)
    return snapshot


def readiness_snapshot(torch: dict, topology: dict, host: dict, launch: dict) -> dict:
    """The snapshot from its four parts, each as its probe read it."""
    return {
        "schema": {"name": SCHEMA_NAME, "version": SCHEMA_VERSION},
        "jupyter_gpu_version": __version__,
        "gathered_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "torch": torch,
        "topology": topology,
        "host": host,
        "launch": launch,
    }


def _probe_failure(run: Mapping[str, Any]) -> str:
    if run.get("timed_out"):
        return f"the child that imports torch did not answer within {run.get('timeout_s')} s"
    tail = (run.get("stderr_tail") or "").strip().splitlines()
    return (run.get("error") or (tail[-1] if tail else None)
            or f"the child that imports torch exited with code {run.get('returncode')}")


def save_readiness(facts: dict, path: str) -> None:
    write_text_atomically(Path(path), json.dumps(facts, indent=2, default=str) + "\n")


def load_readiness(path: str) -> dict:
    """A snapshot `--save` wrote; ValueError with one sentence when the file is not one."""
    try:
        with open(path, encoding="utf-8") as handle:
            facts = json.load(handle)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON ({exc.msg} at line {exc.lineno}).") from None
    if not isinstance(facts, dict) or (facts.get("schema") or {}).get("name") != SCHEMA_NAME:
        raise ValueError(f"{path} is not a distributed readiness snapshot (saved by --distributed --save).")
    return facts
