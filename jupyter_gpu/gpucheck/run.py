"""Run a check end to end: gather (or load) facts, diagnose, optionally save. Shared by every surface."""

from __future__ import annotations

import argparse
from typing import Any

from jupyter_gpu.gpucheck.diagnose.engine import diagnose
from jupyter_gpu.gpucheck.facts.context import DEFAULT_PROBE_TIMEOUT_S, ProbeContext
from jupyter_gpu.gpucheck.facts.gather import TorchProbeCache, gather_facts, load_snapshot, save_snapshot
from jupyter_gpu.gpucheck.report import GpuCheckReport


def run_check(
    options: argparse.Namespace,
    *,
    notebook: dict[str, Any] | None = None,
    cache: TorchProbeCache | None = None,
    context: ProbeContext | None = None,
) -> GpuCheckReport:
    if options.facts:
        snapshot = load_snapshot(options.facts)
    else:
        ctx = context or ProbeContext.from_environment(
            root=options.root, probe_timeout_s=options.timeout or DEFAULT_PROBE_TIMEOUT_S)
        snapshot = gather_facts(ctx, notebook=notebook, cache=cache, refresh=options.refresh)
    if options.save:
        save_snapshot(snapshot, options.save)
    return diagnose(snapshot, verbose=options.verbose)


def check_this_environment(cache: TorchProbeCache | None = None) -> GpuCheckReport:
    """`%gpucheck` with its default options, for surfaces that show a verdict (panels, the server).

    Takes seconds (torch is probed in a child process): call it off any event loop or kernel thread.
    """
    from jupyter_gpu.options import check_parser

    return run_check(check_parser("%gpucheck", magic=True).parse_args([]), cache=cache)
