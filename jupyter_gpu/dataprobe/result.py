"""`DataProbeResult`: plain data about one `%dataprobe` run, shaped like IPython's `TimeitResult`."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from jupyter_gpu.dataprobe.repeats import repeated
from jupyter_gpu.dataprobe.settings import LoaderSettings
from jupyter_gpu.models import Finding, RichResult

# Why a trial ran: the user's own settings, the sweep, the re-measurement of the runner-up (when the check of the
# recommendation fell behind it), the check of the recommendation.
CURRENT, SWEEP, RECHECK, VERIFY = "current", "sweep", "recheck", "verify"
# What a trial timed: the loader alone (no step), or the training loop (loader and step together).
LOADER, LOOP = "loader", "loop"
VERDICTS = ("input-bound", "compute-bound", "balanced")


@dataclass(frozen=True)
class WorkerMemory:
    """Memory of the loader's worker processes, read from /proc at the end of a trial."""

    workers: int
    rss_bytes: int                 # the largest worker's resident set
    private_bytes: int | None      # the largest worker's private bytes (copy-on-read growth shows here)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Trial:
    """One loader setting, measured in `rates` windows on a fresh DataLoader built from the user's."""

    settings: LoaderSettings
    stage: str                              # current / sweep / recheck / verify
    mode: str                               # loader (alone) / loop (with the step)
    rates: list[float]                      # samples/s of each timed window
    first_batch_seconds: float | None       # iter() to the first batch: worker start-up, dataset pickling
    wait_fraction: float | None = None      # loop: share of the loop the host spent blocked in next()
    gpu_idle_fraction: float | None = None  # loop on CUDA: share of the GPU's time idle between steps
    worker_memory: WorkerMemory | None = None
    batches: int = 0                        # batches timed, over all windows
    seconds: float = 0.0                    # wall time of the whole trial, start-up and shutdown included
    timed_seconds: float = 0.0              # of which in the timed windows
    error: str | None = None                # why it stopped, when it failed
    # IterableDataset with workers: how many times each batch came against num_workers=0 (2.0: two workers each
    # yielded the whole stream; 1.0: they split it); None where not checked or nothing tells.
    repeats: float | None = None
    epochs: int = 1                         # epochs begun: above 1, an epoch ended within the trial
    # At num_workers=0 (one process loads each batch in turn): each timed batch's load seconds; none with workers,
    # where next() times the queue, not the loading.
    loads: tuple[float, ...] = ()

    @property
    def load_variation(self) -> float | None:
        """How much the batches' load times varied in one process (`spread`), None with workers."""
        return spread(self.loads)

    @property
    def samples_per_second(self) -> float | None:
        """The median window: one slow window (another process, a page-cache miss) does not decide."""
        return statistics.median(self.rates) if self.rates else None

    @property
    def duplicates(self) -> bool:
        """Its workers yielded the same data more than once: its samples/s are not a speed of distinct data."""
        return repeated(self.repeats)

    @property
    def spread(self) -> tuple[float, float] | None:
        return (min(self.rates), max(self.rates)) if self.rates else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["settings"] = self.settings.to_dict()
        data["samples_per_second"] = self.samples_per_second
        data["load_variation"] = self.load_variation
        return data


def spread(values: tuple[float, ...] | list[float]) -> float | None:
    """Standard deviation over mean of `values` (three at least), None where there are fewer or they are 0."""
    if len(values) < 3:
        return None
    mean = statistics.fmean(values)
    return statistics.pstdev(values) / mean if mean > 0 else None


@dataclass(frozen=True)
class StepAlone:
    """The step on one cached batch already on its device: the ceiling a perfect loader would reach."""

    rates: list[float]          # samples/s of each timed window
    step_seconds: float         # median seconds per step
    device: str

    @property
    def samples_per_second(self) -> float | None:
        return statistics.median(self.rates) if self.rates else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "samples_per_second": self.samples_per_second}


@dataclass(frozen=True, repr=False)
class DataProbeResult(RichResult):
    renderer: ClassVar[str] = "jupyter_gpu.dataprobe.render"

    loader_name: str
    step_name: str | None
    device: str                              # where the step ran ("cpu", "cuda:0"); "cpu" without a step
    current: LoaderSettings                  # the user's own loader's settings
    batch_size: int | None
    dataset_len: int | None
    cpus: int                                # CPUs this process may use (os.sched_getaffinity)
    loader_alone: Trial | None               # the user's settings, loader alone
    step_alone: StepAlone | None
    together: Trial | None                   # the user's settings, loader and step
    verdict: str | None                      # input-bound / compute-bound / balanced; None without a step
    wait_fraction: float | None              # share of the loop spent waiting for data (GPU idle on CUDA)
    perfect_loader_speedup: float | None     # step alone over together
    trials: list[Trial]                      # every trial, in the order run (the current ones too)
    recommended: dict[str, Any] | None       # DataLoader keyword arguments
    recommended_settings: LoaderSettings | None
    predicted: float | None                  # samples/s the sweep measured for the recommendation
    verified: float | None                   # samples/s measured when the recommendation was checked
    best: float | None                       # the best samples/s the sweep saw
    speedup: float | None                    # verified over the user's current setting
    pitfalls: list[Finding] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # settings not tried, each with why
    notes: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)  # what was put back, checked equal: "model", "opt", "RNG", ...
    # What moved and was not put back, each "path (kind): what moved, not restored" (probekit.fingerprint).
    not_restored: list[str] = field(default_factory=list)
    budget_seconds: float = 60.0
    seconds: float = 0.0
    interrupted: bool = False

    @property
    def mode(self) -> str:
        return LOOP if self.step_name is not None else LOADER

    def code(self) -> str | None:
        """The line to paste, or None when there is nothing to change."""
        if self.recommended_settings is None or self.recommended_settings == self.current:
            return None
        return self.recommended_settings.code(self.loader_name, self.current)

    def summary(self) -> str:
        parts = [f"dataprobe {self.loader_name}"]
        if self.verdict is not None:
            parts.append(self.verdict)
        if self.recommended_settings is not None:
            parts.append(f"recommended {self.recommended_settings.label()}")
        if self.speedup is not None:
            parts.append(f"{self.speedup:.2f}x")
        return ": ".join(parts[:2]) + ("; " + ", ".join(parts[2:]) if len(parts) > 2 else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "loader_name": self.loader_name, "step_name": self.step_name, "device": self.device,
            "current": self.current.to_dict(), "batch_size": self.batch_size, "dataset_len": self.dataset_len,
            "cpus": self.cpus,
            "loader_alone": self.loader_alone.to_dict() if self.loader_alone else None,
            "step_alone": self.step_alone.to_dict() if self.step_alone else None,
            "together": self.together.to_dict() if self.together else None,
            "verdict": self.verdict, "wait_fraction": self.wait_fraction,
            "perfect_loader_speedup": self.perfect_loader_speedup,
            "trials": [trial.to_dict() for trial in self.trials],
            "recommended": self.recommended,
            "recommended_settings": self.recommended_settings.to_dict() if self.recommended_settings else None,
            "code": self.code(), "predicted": self.predicted, "verified": self.verified, "best": self.best,
            "speedup": self.speedup, "pitfalls": [finding.to_dict() for finding in self.pitfalls],
            "skipped": list(self.skipped), "notes": list(self.notes), "restored": list(self.restored),
            "not_restored": list(self.not_restored),
            "budget_seconds": self.budget_seconds, "seconds": self.seconds, "interrupted": self.interrupted,
        }
