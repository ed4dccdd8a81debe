"""Run a check end to end: gather (or load) facts, diagnose, optionally save. Shared by every surface."""

from __future__ import annotations

from typing import Any

from jupyter_gpu.gpucheck.diagnose.engine import diagnose
from jupyter_gpu.gpucheck.facts.context import DEFAULT_PROBE_TIMEOUT_S, ProbeContext
from jupyter_gpu.gpucheck.facts.gather import TorchProbeCache, gather_facts, load_snapshot, save_snapshot
from jupyter_gpu.gpucheck.report import GpuCheckReport
from jupyter_gpu.gpucheck.request import CheckRequest


def run_check(
    request: CheckRequest,
    *,
    notebook: dict[str, Any] | None = None,
    cache: TorchProbeCache | None = None,
    context: ProbeContext | None = None,
) -> GpuCheckReport:
    if request.facts:
        snapshot = load_snapshot(request.facts)
    else:
        ctx = context or ProbeContext.from_environment(
            root=request.root, probe_timeout_s=request.timeout or DEFAULT_PROBE_TIMEOUT_S)
        snapshot = gather_facts(ctx, notebook=notebook, cache=cache, refresh=request.refresh)
    if request.save:
        save_snapshot(snapshot, request.save)
    return diagnose(snapshot, verbose=request.verbose)


def check_this_environment(cache: TorchProbeCache | None = None) -> GpuCheckReport:
    """`%gpucheck` with its default options, for surfaces that show a verdict (panels, the server).

    Takes seconds (torch is probed in a child process): call it off any event loop or kernel thread.
    """
    return run_check(CheckRequest(), cache=cache)
