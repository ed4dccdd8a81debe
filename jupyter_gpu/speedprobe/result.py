"""`SpeedProbeResult`: plain data about one `%speedprobe` run, shaped like IPython's `TimeitResult`."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from jupyter_gpu.models import RichResult
from jupyter_gpu.speedprobe.catalog import CodeContext, adopt_lines, title_of


@dataclass(frozen=True)
class Agreement:
    """How a configuration's numbers compare with the baseline's, from the same weights and the same batch."""

    format: str                    # the number format the configuration rounds to (bfloat16, float16, tf32, float32)
    # ||update - baseline update|| / ||baseline update|| after the first step (for a forward-only step: of the
    # models' outputs on the first call; `compared` says which)
    update_rel_l2: float | None
    tolerance: float | None        # the most that difference may be (decide.tolerance)
    loss_drift: float | None       # the largest relative difference of the returned loss over the steps compared
    steps: int                     # steps whose losses were compared (0 when the step returns no loss)
    failure: str | None = None     # what went wrong: NaN or inf, a collapsing GradScaler, fp16 without a scaler
    agrees: bool | None = None     # None: could not be judged (the reason is in `note`)
    note: str | None = None        # why it could not be judged, or what was left out of the judgement
    update_scale: float | None = None  # the first update's size along the baseline's direction (1 when equal)
    loss_limit: float = 0.01       # the most the loss may drift (1%, or more where training amplifies rounding)
    compared: str = "update"       # what update_rel_l2 compares: "update", or "outputs" for a forward-only step

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class OptionTrial:
    """One configuration (the baseline, one option, or the combination), run on the user's step."""

    name: str                              # "baseline", an option name, or "a+b" for the combination
    members: tuple[str, ...]               # the options applied (empty for the baseline)
    times: list[float] = field(default_factory=list)   # seconds of each timed step, synchronised
    warmup_seconds: list[float] = field(default_factory=list)  # the untimed first calls (compilation in them)
    compile_seconds: float | None = None   # warm-up time beyond the steady step time, for compiled options
    peak_bytes: int | None = None          # peak memory the step used (CUDA allocator, or CPU tensors)
    ops: int | None = None                 # operators one step dispatched (compiled regions count as one call each)
    agreement: Agreement | None = None
    speedup: float | None = None           # baseline median over this median; None when not measured
    skipped: str | None = None             # why the option cannot apply here; None when it ran
    error: str | None = None               # what the step raised under this option
    forward_only: bool = False             # the step trains nothing: fp16 needs no GradScaler

    @property
    def title(self) -> str:
        return title_of(self.members, self.forward_only)

    @property
    def seconds(self) -> float | None:
        """The median timed step: a slow outlier (another process, a page fault) does not decide."""
        return statistics.median(self.times) if self.times else None

    @property
    def spread(self) -> tuple[float, float] | None:
        return (min(self.times), max(self.times)) if self.times else None

    @property
    def agrees(self) -> bool | None:
        return self.agreement.agrees if self.agreement is not None else None

    @property
    def measured(self) -> bool:
        return bool(self.times) and self.skipped is None and self.error is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "members": list(self.members), "title": self.title, "seconds": self.seconds,
            "spread": list(self.spread) if self.spread else None, "times": list(self.times),
            "warmup_seconds": list(self.warmup_seconds), "compile_seconds": self.compile_seconds,
            "peak_bytes": self.peak_bytes, "ops": self.ops, "speedup": self.speedup, "agrees": self.agrees,
            "agreement": self.agreement.to_dict() if self.agreement else None,
            "skipped": self.skipped, "error": self.error,
        }


@dataclass(frozen=True)
class LaunchProfile:
    """Whether the step's time goes to launching operators rather than to their arithmetic."""

    device: str                  # "cuda:0" or "cpu"
    ops: int                     # operators one baseline step dispatched on that device
    step_seconds: float          # the baseline's median step
    launch_bound: bool
    # CUDA: the share of a baseline step the GPU ran kernels, from one call traced under torch.profiler and set
    # against the untraced step; None where no trace was taken (the CPU, or the profiler failed).
    gpu_busy: float | None = None
    kernels: float | None = None  # kernels one traced call launched
    # CPU: seconds this host took for a one-element eager operator (probekit.clock.eager_op_floor), the yardstick
    # the verdict used; None where it was not measured.
    op_floor: float | None = None

    @property
    def seconds_per_op(self) -> float:
        return self.step_seconds / self.ops if self.ops else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seconds_per_op": self.seconds_per_op}


@dataclass(frozen=True, repr=False)
class SpeedProbeResult(RichResult):
    renderer: ClassVar[str] = "jupyter_gpu.speedprobe.render"

    step_name: str
    device: str                            # where the model lives ("cuda:0", "cpu")
    batch_size: int | None                 # the first dimension of the model's input, seen on the baseline's step
    baseline: OptionTrial
    options: list[OptionTrial]             # each option alone, in the catalogue's order (skipped ones too)
    combination: OptionTrial | None        # the options that helped and agreed, together; None when fewer than two
    best: OptionTrial | None               # the fastest configuration that agrees and helps; None: keep the step as is
    launch: LaunchProfile | None
    code_context: CodeContext = field(default_factory=CodeContext)
    repeatability: float | None = None     # how much two baseline runs from the same state differ (relative L2)
    steps: int = 20                        # steps each configuration ran for the loss comparison
    notes: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)  # put back, checked equal: "model", "opt", "global flags", ...
    # What moved and was not put back, each "path (kind): what moved, not restored" (probekit.fingerprint).
    not_restored: list[str] = field(default_factory=list)
    seconds: float = 0.0                   # wall time of the whole probe
    interrupted: bool = False
    # Batches one call of the step trains on: the calls of the model the batch size was read from (gradient
    # accumulation calls it once per micro-batch).
    batches_per_step: int = 1
    # Other processes held the CPU cores the timings needed (probekit/cpu_contention): why nothing is recommended.
    shared_cpu: str | None = None

    @property
    def baseline_seconds(self) -> float | None:
        return self.baseline.seconds

    def option(self, name: str) -> OptionTrial:
        for trial in [*self.options, *([self.combination] if self.combination else [])]:
            if trial.name == name:
                return trial
        raise KeyError(name)

    def samples_per_second(self, trial: OptionTrial) -> float | None:
        seconds = trial.seconds
        return self.batch_size * self.batches_per_step / seconds if self.batch_size and seconds else None

    def code(self) -> list[str]:
        """The lines to adopt the best configuration; empty when nothing tried beats the step as it is."""
        return adopt_lines(self.best.members, self.code_context) if self.best is not None else []

    def summary(self) -> str:
        if self.shared_cpu is not None:
            return f"speedprobe {self.step_name}: no recommendation, the CPU was shared while it ran"
        if self.best is None:
            return f"speedprobe {self.step_name}: nothing tried is faster and agrees"
        return f"speedprobe {self.step_name}: {self.best.title} {self.best.speedup:.2f}x"

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_name": self.step_name, "device": self.device, "batch_size": self.batch_size,
            "baseline_seconds": self.baseline_seconds, "baseline": self.baseline.to_dict(),
            "options": [trial.to_dict() for trial in self.options],
            "combination": self.combination.to_dict() if self.combination else None,
            "best": self.best.name if self.best else None, "code": self.code(),
            "launch": self.launch.to_dict() if self.launch else None,
            "repeatability": self.repeatability, "steps": self.steps, "notes": list(self.notes),
            "restored": list(self.restored), "not_restored": list(self.not_restored), "seconds": self.seconds,
            "interrupted": self.interrupted,
            "shared_cpu": self.shared_cpu,
        }
