"""Run the readiness check end to end, for the magic and the command line: gather (or load) the facts, diagnose,
optionally save them, and with `--bench` run the checked all-reduce in child processes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from jupyter_gpu.distributed.gather import gather_readiness, load_readiness, save_readiness
from jupyter_gpu.distributed.report import ReadinessReport
from jupyter_gpu.distributed.topology import Topology
from jupyter_gpu.facts.context import DEFAULT_PROBE_TIMEOUT_S, ProbeContext
from jupyter_gpu.gpucheck.request import CheckRequest

BENCH_TIMEOUT_S = 120.0


def check_distributed(
    request: CheckRequest,
    *,
    user_ns: Mapping[str, Any] | None = None,
    context: ProbeContext | None = None,
    bench: bool = False,
    on_progress: Callable[[str], None] | None = None,
) -> ReadinessReport:
    if request.facts:
        facts = load_readiness(request.facts)
    else:
        ctx = context or ProbeContext.from_environment(
            root=request.root, probe_timeout_s=request.timeout or DEFAULT_PROBE_TIMEOUT_S)
        facts = gather_readiness(ctx, user_ns=user_ns)
    if request.save:
        save_readiness(facts, request.save)
    report = ReadinessReport.from_facts(facts)
    if not bench:
        return report
    return _with_bench(report, on_progress)


def _with_bench(report: ReadinessReport, on_progress: Callable[[str], None] | None) -> ReadinessReport:
    from jupyter_gpu.distributed.allreduce import AllReduceError, run_allreduce
    from jupyter_gpu.distributed.collective import DEFAULT_SIZES

    torch = report.facts.get("torch") or {}
    nccl = bool(torch.get("nccl_available")) and int(torch.get("device_count") or 0) >= 1
    # run_allreduce decides whether the peak applies (never for gloo, never a simulated one): one rule, there.
    peak = Topology.from_dict(report.facts["topology"]).link_peak()
    try:
        result = run_allreduce(backend="nccl" if nccl else "gloo", processes=None, sizes=list(DEFAULT_SIZES),
                               peak=peak, on_progress=on_progress, timeout_s=BENCH_TIMEOUT_S)
    except AllReduceError as exc:
        return replace(report, bench_error=str(exc))
    return replace(report, bench=result)
