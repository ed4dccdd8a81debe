"""What `%dataprobe` checks before it starts any worker: the pitfalls of the settings its sweep would start.

Probe ring: reads the user's DataLoader by its attributes (`facts.loader`), never iterates it, and reads
/dev/shm and the hosting through the `ProbeContext` readers of `facts.system`. The rules themselves are
`%gpucheck`'s (`gpucheck.diagnose.worker_rules`), judged here on the largest worker count and prefetch the sweep
plans, so a pitfall is named before the setting that would meet it runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jupyter_gpu.dataprobe.settings import LoaderSettings
from jupyter_gpu.facts import system
from jupyter_gpu.facts.context import ProbeContext
from jupyter_gpu.facts.loader import loader_facts, loader_types
from jupyter_gpu.gpucheck.diagnose import worker_rules
from jupyter_gpu.kernel_torch import loaded_torch
from jupyter_gpu.models import Finding


@dataclass(frozen=True)
class Pitfalls:
    """The worker pitfalls of one loader's sweep, found before any worker started."""

    findings: list[Finding]          # from worker_findings, in its order
    workers_blocked: str | None      # one sentence when no worker setting can run; None otherwise
    shm_bytes: int | None            # the size of /dev/shm; None when unknown (Windows, no /dev/shm)
    batch_bytes: int | None = None   # one batch's bytes: measured, else sample bytes x batch size; None if unknown

    def fits_shm(self, settings: LoaderSettings, batch_bytes: int | None = None) -> bool:
        """False when the batches this setting keeps in flight, with SHM_TOO_SMALL's headroom, overflow /dev/shm.

        `batch_bytes` defaults to the one found by `check_pitfalls`. True whenever it cannot be known to
        overflow: no workers (batches stay in the main process), /dev/shm's size or the batch's unknown."""
        batch = batch_bytes if batch_bytes is not None else self.batch_bytes
        if settings.num_workers == 0 or self.shm_bytes is None or batch is None:
            return True
        return worker_rules.fits_shm(settings.num_workers, settings.prefetch_factor, batch, self.shm_bytes)


def check_pitfalls(
    loader: Any,
    name: str,
    planned: Sequence[LoaderSettings],
    *,
    ctx: ProbeContext | None = None,
    batch_bytes: int | None = None,
    batch_cuda: str | None = None,
) -> Pitfalls:
    """The worker pitfalls of `loader` (bound to `name`) under the settings the sweep plans to start.

    The rules judge the loader with the largest planned `num_workers` and `prefetch_factor` (the loader's own
    settings when nothing is planned). `batch_bytes`, one batch's bytes measured by the caller, sizes the
    batches in flight in place of the sample bytes x batch size read from a TensorDataset. `batch_cuda` is the
    CUDA device of a batch the caller loaded in this process ("cuda:0"), when it has one: a dataset whose
    `__getitem__` returns CUDA tensors fails in forked workers as surely as one holding them."""
    torch = loaded_torch()
    if torch is None:  # a DataLoader cannot exist without torch imported
        raise TypeError(f"`{name}` is not a DataLoader: torch is not imported in this kernel")
    ctx = ctx if ctx is not None else ProbeContext.from_environment()
    facts = _as_planned(loader_facts(name, loader, loader_types(torch)), planned)
    if batch_bytes is not None:
        facts["batch_bytes"] = batch_bytes
    if batch_cuda is not None and not facts.get("dataset_cuda"):
        facts["dataset_cuda"] = f"a batch it yields, on {batch_cuda}"
    shm_bytes = system.shm_bytes(ctx)
    findings = worker_rules.worker_findings([facts], shm_bytes=shm_bytes, hosting=system.hosting_facts(ctx))
    known_batch = batch_bytes if batch_bytes is not None else _batch_bytes(facts)
    return Pitfalls(findings, worker_rules.workers_blocked(findings), shm_bytes, known_batch)


def _as_planned(facts: dict[str, Any], planned: Sequence[LoaderSettings]) -> dict[str, Any]:
    """The loader's facts with the most workers and the deepest prefetch any planned setting starts."""
    if not planned:
        return facts
    with_workers = [s for s in planned if s.num_workers > 0]
    prefetch = max((s.prefetch_factor or 0 for s in with_workers), default=0)
    return {**facts, "num_workers": max(s.num_workers for s in planned), "prefetch_factor": prefetch or None}


def _batch_bytes(facts: dict[str, Any]) -> int | None:
    sample, batch = facts.get("sample_bytes"), facts.get("batch_size")
    return sample * batch if sample is not None and batch else None
