"""`BatchProbeResult`: plain data about one `%batchprobe` run, shaped like IPython's `TimeitResult`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from jupyter_gpu.models import RichResult

# Why a trial was run: the search chose it, the answer was re-run after a failure, or the recommendation.
SEARCH, VERIFY, RECOMMEND = "search", "verify", "recommend"
# --amp choices and the torch dtype each runs the step in (under autocast).
AMP_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class Trial:
    """One batch size tried: `steps` real training steps at that size, or fewer if it failed."""

    batch_size: int
    fitted: bool
    peak_bytes: int | None            # what the budget compares: live tensor bytes, or CUDA reserved
    step_seconds: float | None        # steady-state step time (median after the first step)
    samples_per_second: float | None
    purpose: str = SEARCH             # search / verify / recommend
    how: str = ""                     # how the search chose the size: start, double, predict, gallop, bisect
    failure: str | None = None        # what stopped it: "out of memory (CUDA caching allocator)", …
    failure_kind: str | None = None   # "out of memory", "size limit"
    allocated_peak_bytes: int | None = None  # CUDA: the allocated (not reserved) peak
    steps_run: int = 0
    seconds: float = 0.0              # wall time of the whole trial, cleanup included
    needed_bytes: int | None = None   # a trial the memory budget refused: what it would have held then
    # Batches of `batch_size` one call of the step trains on: the model's calls per optimizer step (a step that
    # accumulates gradients over 4 micro-batches: 4); samples_per_second counts them all.
    batches: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, repr=False)
class BatchProbeResult(RichResult):
    renderer: ClassVar[str] = "jupyter_gpu.batchprobe.render"

    max_batch_size: int               # the largest size that ran within the budget (0: none)
    recommended: int                  # the largest size that keeps `margin` of the budget free, tried
    knee: int | None                  # the smallest size within 95% of the best samples/s seen
    trials: list[Trial]
    device: str                       # "cpu", "cuda:0"
    accounting: str                   # "live tensor bytes" or "CUDA caching allocator"
    budget_bytes: int
    budget_source: str                # "--max-memory", "free memory on cuda:0", …
    margin: float
    steps: int
    amp: str | None
    limited_by: str                   # "memory", "size limit", "--max", "nothing fits", "leak",
                                      # "ignores batch_size", "time limit" (--max-seconds: not the limit)
    memory_before: int                # bytes in use on the probed device before and after the probe
    memory_after: int
    restored: list[str]               # what was put back, checked equal: "model", "opt", "RNG", …
    snapshot_bytes: int               # host memory the restore copies took during the probe
    seconds: float
    memory_model: tuple[float, float] | None = None  # peak ≈ intercept + per_sample·size, from the trials
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False
    # What held the device memory before the first trial, largest first: {"name", "kind", "bytes", ...}.
    baseline: list[dict[str, Any]] = field(default_factory=list)
    # What trials left alive after their restore (a hook or global keeping outputs): {"batch_size", "bytes",
    # "holders": [...]}, one per batch size that left something.
    leftovers: list[dict[str, Any]] = field(default_factory=list)
    # A step that keeps more memory after every call: {"batch_size", "bytes_per_call", "holders": [...]}.
    leak: dict[str, Any] | None = None
    # The search stopped before a trial predicted to end past --max-seconds: {"seconds", "next_size",
    # "predicted_seconds", "fails_at"}; max_batch_size is then the largest size that ran, not the memory limit.
    time_limit: dict[str, Any] | None = None
    # What moved and was not put back, each "path (kind): what moved, not restored" (probekit.fingerprint).
    not_restored: list[str] = field(default_factory=list)

    @property
    def search_trials(self) -> int:
        """Trials that located the limit: the count to compare with other finders."""
        return sum(1 for t in self.trials if t.purpose == SEARCH)

    def trial(self, batch_size: int) -> Trial | None:
        """The last trial of this size."""
        found = [t for t in self.trials if t.batch_size == batch_size]
        return found[-1] if found else None

    def summary(self) -> str:
        if self.limited_by == "leak":
            return "the step leaks memory: no batch size measured"
        if self.limited_by == "ignores batch_size":
            return "the step apparently ignores batch_size: no batch size measured"
        if self.max_batch_size == 0:
            return f"no batch size fits in {self.budget_source}"
        if self.limited_by == "time limit":
            return (f"batch size {self.max_batch_size} runs (stopped at the time limit before finding the most), "
                    f"recommended {self.recommended} ({len(self.trials)} trials)")
        return (f"max batch size {self.max_batch_size}, recommended {self.recommended} "
                f"({len(self.trials)} trials)")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["search_trials"] = self.search_trials
        return data
