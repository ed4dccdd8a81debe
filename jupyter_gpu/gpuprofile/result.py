"""`ProfileResult`: plain data about one `%%gpuprofile` run: where each step's time went, how far from the device's
limit, and what to fix first. Pure Python."""

from __future__ import annotations

import os
import re
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar

from jupyter_gpu.models import RichResult
from jupyter_gpu.probekit.kernel_trace import GpuTimeline

# What a profile counts as its steps (`ProfileResult.counted`).
OPTIMIZER_STEPS, BATCHES, ONE_RUN = "optimizer steps", "DataLoader batches", "one run of the cell"


def middle_half(values: list[float]) -> list[int]:
    """Indices of the middle half of `values` by size (all of them below four values)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    cut = len(values) // 4
    return order[cut:len(values) - cut] if len(values) >= 4 else order


def typical(values: list[float]) -> float:
    """The interquartile mean."""
    chosen = middle_half(values)
    return statistics.fmean(values[i] for i in chosen)


# The buckets, in the order a step meets them; their per-step times add up to the step.
DATA, COPIES, FORWARD, BACKWARD, OPTIMIZER, SYNC, GC, OTHER = (
    "data", "copies", "forward", "backward", "optimizer", "sync", "gc", "other")
BUCKETS = (DATA, COPIES, FORWARD, BACKWARD, OPTIMIZER, SYNC, GC, OTHER)
BUCKET_TITLES = {DATA: "waiting for data", COPIES: "host→device copies", FORWARD: "forward",
                 BACKWARD: "backward", OPTIMIZER: "optimizer step", SYNC: "syncs (host waits for the device)",
                 GC: "garbage collection", OTHER: "other host time (Python, logging, metrics, progress bars)"}


@dataclass(frozen=True)
class Bucket:
    """One kind of work: its seconds in a typical step, the spread over the profiled steps and its share of the step.

    "Typical" is the interquartile mean: the mean over the middle half of the steps (ranked by step time), robust
    to a stalled step like a median, and additive: the buckets' typical seconds add up to the typical step.
    """

    key: str
    seconds: float
    low: float
    high: float
    share: float                      # seconds / the typical step
    gpu_seconds: float | None = None  # CUDA-event time of the phase's GPU work (forward, backward, optimizer)

    @property
    def title(self) -> str:
        return BUCKET_TITLES[self.key]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "title": self.title}


def how_often(per_step: float, noun: str = "", plural: str = "") -> str:
    """A count per profiled step as a person says it: "2 syncs/step", "1 sync every 6 steps", "0.4 syncs/step" (a
    read logged every 6th step, or a copy per batch with gradient accumulation, is a fraction per optimizer step)."""
    many = plural or (noun + "s" if noun else "")
    name = f" {noun if per_step == 1 else many}" if noun else ""
    if 0 < per_step < 1:
        every = 1 / per_step
        if abs(every - round(every)) <= 0.05 * every:
            return f"1{' ' + noun if noun else ''} every {round(every)} steps"
    return f"{per_step:.3g}{name}{'/step' if noun else ' per step'}"


@dataclass(frozen=True)
class Sync:
    """A line of the user's code where the host read a tensor's value (and so waited for the device)."""

    file: str
    line: int
    source: str               # the line's text, stripped
    kinds: tuple[str, ...]    # what read it: ".item()", ".cpu()", "print(tensor)", "boolean mask", ...
    per_step: float           # how many times per profiled step
    seconds: float            # seconds per step blocked there (0 on the CPU, where a read waits for nothing)
    function: str = ""        # the function the line is in ("train_kd"); "" at a cell's top level

    @property
    def where(self) -> str:
        """"line 14" in a notebook cell (IPython's `<ipython-input-...>`, ipykernel's `/tmp/ipykernel_<pid>/<hash>.py`),
        "train.py:14" in a file; "line 32 in train_kd()" inside a function, whose cell is not the profiled one's
        (two cells' "line 10" were one report's two different lines)."""
        in_cell = self.file.startswith("<") or re.search(r"ipykernel_\d+[/\\]\d+\.py$", self.file) is not None
        place = f"line {self.line}" if in_cell else f"{os.path.basename(self.file)}:{self.line}"
        return f"{place} in {self.function}()" if self.function.isidentifier() else place

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "where": self.where}


@dataclass(frozen=True)
class OtherLine:
    """A line of the loop and the host time outside every named bucket it took per step, the user's functions it
    called included: where "other host time" went."""

    file: str
    line: int
    source: str                          # the line's text, stripped
    seconds: float                       # per step
    function: str = ""                   # the function the line is in; "" at a cell's top level
    inside: tuple[OtherLine, ...] = ()   # the costliest lines of the user's functions it called

    where = Sync.where  # named as a sync's line is: "line 41", "line 12 in get_batch()", "train.py:14"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "where": self.where, "inside": [line.to_dict() for line in self.inside]}


@dataclass(frozen=True)
class Copies:
    """Host→device copies per profiled step."""

    count: float
    bytes: float
    pageable: float          # copies from pageable (not pinned) host memory
    blocking: float          # copies made without non_blocking=True
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Operator:
    """One aten operator over the census step: its time, FLOPs and bytes moved, and which limit it runs into."""

    name: str
    calls: int
    seconds: float
    flops: int
    bytes: int
    bound: str | None         # "compute" or "memory" against the ridge point; None when no ridge point is known
    # CUDA: its kernels' time per step in the kernel timeline's steps (torch.profiler); None where there is none.
    # `seconds` is then the host's time dispatching and launching it, not what it costs the GPU.
    gpu_seconds: float | None = None
    optimizer: bool = False  # its calls ran inside an optimizer's step (the update), not the model's forward/backward

    @property
    def label(self) -> str:
        return f"{self.name} (optimizer)" if self.optimizer else self.name

    @property
    def time(self) -> float:
        """What the operator costs a step: its kernels' time where the timeline has it, else its host time."""
        return self.gpu_seconds if self.gpu_seconds is not None else self.seconds

    @property
    def intensity(self) -> float | None:
        return self.flops / self.bytes if self.bytes else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "intensity": self.intensity}


@dataclass(frozen=True)
class Ceiling:
    """What this device reaches on a big matmul and a big copy in the step's compute format, measured here."""

    device: str
    compute: str                   # fp32, tf32, bf16, fp16
    matmul_flops: float            # FLOP/s of the matmul
    bandwidth: float | None        # bytes/s of the copy (read + write)
    seconds: float                 # what measuring it took
    datasheet_name: str | None = None
    datasheet_flops: float | None = None   # dense peak for `compute`, from gpuprofile.peaks
    datasheet_bandwidth: float | None = None
    datasheet_source: str | None = None

    @property
    def ridge_point(self) -> float | None:
        """FLOPs per byte above which an operator is compute-bound: the datasheet's where known, else measured."""
        if self.datasheet_flops and self.datasheet_bandwidth:
            return self.datasheet_flops / self.datasheet_bandwidth
        return self.matmul_flops / self.bandwidth if self.bandwidth else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ridge_point": self.ridge_point}


@dataclass(frozen=True)
class PlanItem:
    """One cause, with the time it costs per step, the speed-up if that time went to zero, and what to type."""

    cause: str
    seconds: float                 # per step
    ceiling: float | None          # step / (step - seconds): the most fixing it can buy
    command: str                   # the exact next thing to type
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunFigures:
    """One run of the loop, as --apply compares two."""

    seconds: float | None                  # the typical step
    samples_per_second: float | None
    mfu: float | None
    of_ceiling: float | None
    peak_memory: int | None
    data_share: float | None
    sync_share: float | None
    losses: list[float] = field(default_factory=list)  # the loss at each profiled step, as backward() saw it
    step_seconds: list[float] = field(default_factory=list)  # each profiled step (of every run pooled)
    run_seconds: list[float] = field(default_factory=list)   # each run's typical step, in the order they ran
    stalls_included: bool = False  # seconds is the mean step: stalls recurred, and the typical step leaves them out
    # What its MFU and ceiling share are against, so --apply's table sets both runs against one ceiling per row: a
    # bf16 run's share of the bf16 ceiling beside an fp32 run's of the fp32 one read "34% -> 18%" at a 2.1x speed-up.
    achieved_flops: float | None = None
    compute: str | None = None                # the format its matmuls ran in
    ceiling_flops: float | None = None        # the big matmul in that format, measured in this run
    peak_name: str | None = None              # the datasheet's device, for MFU
    peak_flops: float | None = None           # its dense peak in `compute`

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def fastest(runs: list[RunFigures]) -> RunFigures:
        """Several runs of one configuration as one: the figures of its fastest run (on a shared machine noise only
        ever slows a run down, so the faster one is the better measure of the configuration, as `timeit` takes its
        best), with every run's steps and typical step kept."""
        best = min(runs, key=lambda run: run.seconds if run.seconds else float("inf"))
        return replace(best, step_seconds=[step for run in runs for step in run.step_seconds],
                       run_seconds=[second for run in runs for second in run.run_seconds])


@dataclass(frozen=True)
class AppliedFixes:
    """--apply: what was applied, what was left out and why, and the loop before and after."""

    applied: list[str]
    left_out: list[tuple[str, str]]
    checked: list[str]
    code: list[str]
    before: RunFigures
    after: RunFigures | None
    runs_each: int = 1  # how many times each was run, back to back (before, after, after, before for 2)
    interrupted: str | None = None  # where Ctrl-C stopped --apply ("%speedprobe", "the runs"): nothing applied
    not_tried: list[tuple[str, str]] = field(default_factory=list)  # (fix, why --apply could not try it)

    @property
    def speedup(self) -> float | None:
        if self.after is None or not self.before.seconds or not self.after.seconds:
            return None
        return self.before.seconds / self.after.seconds

    @property
    def pair_speedups(self) -> list[float]:
        """The speed-up of each back-to-back pair (the first run before with the first after, and so on): how much
        the measurement moved between them."""
        if self.after is None:
            return []
        return [before / after for before, after in zip(self.before.run_seconds, self.after.run_seconds,
                                                         strict=False) if after]

    @property
    def reproducible(self) -> bool:
        """The back-to-back pairs agree on the speed-up within REPRODUCIBLE times (one pair: nothing to compare).
        On a shared machine the pairs gave 1.21x and 0.22x, and 1.21x had been shown as what the fixes buy."""
        pairs = self.pair_speedups
        return len(pairs) < 2 or max(pairs) <= REPRODUCIBLE * min(pairs)

    @property
    def loss_difference(self) -> float | None:
        """The largest relative difference between the two runs' losses, step by step (same state, same batches)."""
        if self.after is None or not self.before.losses or not self.after.losses:
            return None
        pairs = list(zip(self.before.losses, self.after.losses, strict=False))
        return max(abs(a - b) / max(abs(a), 1e-12) for a, b in pairs)

    def to_dict(self) -> dict[str, Any]:
        return {"applied": list(self.applied), "left_out": [list(item) for item in self.left_out],
                "checked": list(self.checked), "code": list(self.code), "before": self.before.to_dict(),
                "after": self.after.to_dict() if self.after else None, "speedup": self.speedup,
                "loss_difference": self.loss_difference, "runs_each": self.runs_each,
                "pair_speedups": self.pair_speedups, "reproducible": self.reproducible,
                "interrupted": self.interrupted}


# --apply's pairs of runs (before, after) may differ in their speed-up by this factor before the speed-up is called
# not reproducible (the goal in bench/, on an idle machine, is 10%).
REPRODUCIBLE = 1.25


@dataclass(frozen=True)
class ReadyStep:
    """A step function the profile defined in the notebook for a probe, or the wrapper to fill in and why."""

    probe: str                     # "%dataprobe", "%speedprobe", "%batchprobe"
    name: str | None               # the name defined in the namespace; None when it could not be lifted
    command: str                   # what to type next
    code: str                      # the function's source (defined, or to fill in)
    reason: str | None = None      # why it could not be lifted

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


CEILING_SLACK = 1.1  # a step this much faster than the measured matmul ceiling shows it is no ceiling
# A step this many times the typical one stalled; two or more such steps in a profile are a pattern (a slow sample
# every few batches, workers that cannot keep up), whose cost the typical step leaves out by design.
STALL_FACTOR = 1.5
RECURRING_STALLS = 2
STALLS_COST = 1.2  # ... and they are worth a plan item where they make the mean step this much above the typical one


@dataclass(frozen=True, repr=False)  # RichResult's short repr, not every field
class ProfileResult(RichResult):
    renderer: ClassVar[str] = "jupyter_gpu.gpuprofile.render"

    device: str                                  # "cpu", "cuda:0"
    device_name: str                             # "NVIDIA H200", or the CPU's model
    counted: str                                 # "optimizer steps", "DataLoader batches", "one run of the cell"
    step_seconds: list[float] = field(default_factory=list)     # each profiled step, wall time
    step_buckets: list[dict[str, float]] = field(default_factory=list)  # each profiled step's seconds per bucket
    warmup_seconds: list[float] = field(default_factory=list)   # each warm-up step
    requested: int = 0                           # steps asked for (--steps); 0 with --seconds
    breakdown: list[Bucket] = field(default_factory=list)
    syncs: list[Sync] = field(default_factory=list)
    copies: Copies | None = None
    flops: int | None = None                     # per step, forward and backward together
    compute: str = "fp32"                        # the format the step's matmuls ran in
    ceiling: Ceiling | None = None
    operators: list[Operator] = field(default_factory=list)
    memory_bound_share: float | None = None      # share of the model's operator time in memory-bound ops
    optimizer_share: float | None = None         # share of all operator time in the optimizer step's operators
    optimizer_fused: bool = False                # the optimizer's step ran fused kernels (_fused_adamw_, ...)
    plan: list[PlanItem] = field(default_factory=list)
    ready_steps: list[ReadyStep] = field(default_factory=list)
    gpu_busy: float | None = None                # share of the timeline steps the GPU ran kernels (CUDA only)
    gpu_timeline: GpuTimeline | None = None      # the kernel timeline over a few steps after the profiled ones
    overhead_seconds: float | None = None        # instrumentation cost per step, measured
    peak_memory: int | None = None               # bytes, over the profiled steps
    batch_size: int | None = None                # samples per batch, where the batches told
    batches_per_step: int = 1                    # DataLoader batches per optimizer step (gradient accumulation)
    not_measured: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False
    error: str | None = None                     # what the cell raised, as "Type: message"
    applied: AppliedFixes | None = None          # --apply's before and after
    losses: list[float] = field(default_factory=list)  # the loss at each profiled step
    models: list[str] = field(default_factory=list)    # the notebook's names of the models the loop called
    compiled_models: list[str] = field(default_factory=list)  # those of them already torch.compile'd
    defined_in: str = "the notebook"                   # where the ready steps were defined
    anomaly_detection: bool = False                    # the loop's backward ran under autograd anomaly detection
    other_lines: list[OtherLine] = field(default_factory=list)  # other host time by line, the costliest first

    @property
    def steps(self) -> int:
        return len(self.step_seconds)

    @property
    def uncompiled_models(self) -> list[str]:
        """The models the loop called that are not compiled yet: what a torch.compile fix names."""
        return [model for model in self.models if model not in self.compiled_models]

    @property
    def all_models_compiled(self) -> bool:
        """Every model the loop called is already compiled (none known: False)."""
        return bool(self.models) and not self.uncompiled_models

    @property
    def seconds(self) -> float | None:
        """The typical profiled step: the mean of the middle half of the steps (what the buckets add up to)."""
        return typical(self.step_seconds) if self.step_seconds else None

    @property
    def achieved_flops(self) -> float | None:
        return self.flops / self.seconds if self.flops and self.seconds else None

    @property
    def mfu(self) -> float | None:
        """Achieved FLOP/s over the datasheet's dense peak for the compute format; None where no peak is known."""
        achieved = self.achieved_flops
        peak = self.ceiling.datasheet_flops if self.ceiling else None
        return achieved / peak if achieved and peak else None

    @property
    def of_ceiling(self) -> float | None:
        """Achieved FLOP/s over what this device reached on a big matmul in the same format; None where the step ran
        faster than that matmul (`beyond_ceiling`), which then was no ceiling."""
        achieved = self.achieved_flops
        if not achieved or not self.ceiling or self.beyond_ceiling:
            return None
        return achieved / self.ceiling.matmul_flops

    @property
    def beyond_ceiling(self) -> bool:
        """The step computed faster than the big matmul in its format did (by more than the 10% two timings may
        differ): a device without a fast path for that format (fp16 on a CPU: 0.0004 TFLOP/s on a 2048 matmul,
        while the step's small ones ran 400 times faster) has no ceiling to compare with."""
        achieved = self.achieved_flops
        return bool(achieved and self.ceiling and achieved > CEILING_SLACK * self.ceiling.matmul_flops)

    @property
    def samples_per_second(self) -> float | None:
        """Samples trained per second: every batch of a step counts (with gradient accumulation a step is several)."""
        if not self.batch_size or not self.seconds:
            return None
        return self.batch_size * self.batches_per_step / self.seconds

    def bucket(self, key: str) -> Bucket | None:
        return next((b for b in self.breakdown if b.key == key), None)

    @property
    def mean_seconds(self) -> float | None:
        """The mean profiled step: what the run took per step, stalls included."""
        return statistics.fmean(self.step_seconds) if self.step_seconds else None

    @property
    def stalled_steps(self) -> list[int]:
        """Indices of the profiled steps that took STALL_FACTOR times the typical step or more."""
        step = self.seconds
        return [i for i, seconds in enumerate(self.step_seconds) if step and seconds >= STALL_FACTOR * step]

    @property
    def recurring_stalls(self) -> bool:
        mean, step = self.mean_seconds, self.seconds
        return (len(self.stalled_steps) >= RECURRING_STALLS and bool(self.step_buckets) and bool(mean and step)
                and mean >= STALLS_COST * step)

    @property
    def mean_samples_per_second(self) -> float | None:
        """Samples per second over all the profiled steps, stalls included (samples_per_second is the typical
        step's)."""
        rate, mean = self.samples_per_second, self.mean_seconds
        return rate * self.seconds / mean if rate is not None and mean and self.seconds else None

    def over_typical(self, buckets: Mapping[str, float]) -> dict[str, float]:
        """Each bucket's seconds in `buckets` (a step's, or a mean over steps) less the typical step's."""
        typical_seconds = {bucket.key: bucket.seconds for bucket in self.breakdown}
        return {key: buckets.get(key, 0.0) - typical_seconds.get(key, 0.0) for key in BUCKETS}

    def stall_cause(self) -> str | None:
        """The bucket the stalls add the most to, averaged over every profiled step (None without stalls)."""
        if not self.recurring_stalls:
            return None
        excess = self.over_typical({key: statistics.fmean(buckets.get(key, 0.0) for buckets in self.step_buckets)
                                    for key in BUCKETS})
        cause = max(excess, key=lambda key: excess[key])
        return cause if excess[cause] > 0 else None

    @property
    def compute_phases(self) -> str:
        """The phases the step computed in, as the report names them: "forward+backward+optimizer", or "forward"
        for an evaluation loop (no backward, no optimizer step took time)."""
        phases = [name for key, name in ((FORWARD, "forward"), (BACKWARD, "backward"), (OPTIMIZER, "optimizer"))
                  if (bucket := self.bucket(key)) is not None and bucket.seconds > 0]
        return "+".join(phases) or "forward+backward+optimizer"

    def figures(self) -> RunFigures:
        """This run as --apply compares it: its typical step, or its mean step where stalls recur (a loader fix that
        ends them would leave the typical step, which leaves them out, as it was)."""
        data, sync = self.bucket(DATA), self.bucket(SYNC)
        stalls = self.recurring_stalls
        seconds = self.mean_seconds if stalls else self.seconds
        rate = self.mean_samples_per_second if stalls else self.samples_per_second
        return RunFigures(seconds=seconds, samples_per_second=rate, mfu=self.mfu,
                          of_ceiling=self.of_ceiling, peak_memory=self.peak_memory,
                          data_share=data.share if data else None, sync_share=sync.share if sync else None,
                          losses=list(self.losses), step_seconds=list(self.step_seconds),
                          run_seconds=[seconds] if seconds else [], stalls_included=stalls,
                          achieved_flops=self.flops / seconds if self.flops and seconds else None,
                          compute=self.compute if self.flops else None,
                          ceiling_flops=self.ceiling.matmul_flops if self.ceiling and not self.beyond_ceiling else None,
                          peak_name=self.ceiling.datasheet_name if self.ceiling else None,
                          peak_flops=self.ceiling.datasheet_flops if self.ceiling else None)

    def to_dict(self) -> dict[str, Any]:
        plain = {name: getattr(self, name) for name in self.__dataclass_fields__}
        nested = ("breakdown", "syncs", "operators", "plan", "ready_steps", "other_lines")
        out = {k: v for k, v in plain.items() if k not in (*nested, "copies", "ceiling", "applied", "gpu_timeline")}
        out["applied"] = self.applied.to_dict() if self.applied else None
        out.update({k: [item.to_dict() for item in plain[k]] for k in nested})
        out["copies"] = self.copies.to_dict() if self.copies else None
        out["ceiling"] = self.ceiling.to_dict() if self.ceiling else None
        out["gpu_timeline"] = self.gpu_timeline.to_dict() if self.gpu_timeline else None
        out.update(steps=self.steps, seconds=self.seconds, achieved_flops=self.achieved_flops, mfu=self.mfu,
                   of_ceiling=self.of_ceiling, samples_per_second=self.samples_per_second,
                   mean_seconds=self.mean_seconds, stalled_steps=self.stalled_steps)
        return out
