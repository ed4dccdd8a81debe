"""Run a check end to end: gather (or load) facts, diagnose, optionally save. Shared by every surface."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from jupyter_gpu.facts.context import DEFAULT_PROBE_TIMEOUT_S, ProbeContext
from jupyter_gpu.facts.gather import gather_facts, load_snapshot, save_snapshot
from jupyter_gpu.facts.probe_cache import TorchProbeCache
from jupyter_gpu.gpucheck.request import CheckRequest

if TYPE_CHECKING:
    from jupyter_gpu.gpucheck.report import GpuCheckReport


def load_diagnosis() -> None:
    """Import the rules once the probe children are started: the import then overlaps their run instead of
    delaying the torch child's start (tens of ms of a check that is one `import torch` long)."""
    from jupyter_gpu.gpucheck.diagnose import engine  # noqa: F401


def run_check(
    request: CheckRequest,
    *,
    notebook: dict[str, Any] | None = None,
    cache: TorchProbeCache | None = None,
    context: ProbeContext | None = None,
) -> GpuCheckReport:
    if request.facts:
        try:
            snapshot = load_snapshot(request.facts)
        except OSError as exc:  # one sentence for every surface, not "[Errno 2] No such file or directory: ..."
            raise ValueError(f"--facts {request.facts} cannot be read: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"--facts {request.facts} is not a JSON facts snapshot ({exc.msg}, line "
                             f"{exc.lineno})") from None
    else:
        ctx = context or ProbeContext.from_environment(
            root=request.root, probe_timeout_s=request.timeout or DEFAULT_PROBE_TIMEOUT_S)
        # One cache for every surface: the torch child's answer on disk, shared by kernels and the CLI.
        cache = cache if cache is not None else TorchProbeCache.for_context(ctx)
        snapshot = gather_facts(ctx, notebook=notebook, cache=cache, refresh=request.refresh,
                                while_waiting=load_diagnosis)
    if request.save:
        try:
            save_snapshot(snapshot, request.save)
        except OSError as exc:
            raise ValueError(f"--save {request.save} cannot be written: {exc.strerror or exc}") from None
    from jupyter_gpu.gpucheck.diagnose.engine import diagnose  # already loaded: see load_diagnosis

    return diagnose(snapshot, verbose=request.verbose)


def check_this_environment() -> GpuCheckReport:
    """`%gpucheck` with its default options, for surfaces that show a verdict (panels, the server), with the
    on-disk torch-probe cache every check shares.

    Takes seconds (torch is probed in a child process): call it off any event loop or kernel thread.
    """
    return run_check(CheckRequest())
