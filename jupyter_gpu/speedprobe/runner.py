"""Run `%speedprobe`: the baseline twice (its time and how repeatable its update is), how much each format's
rounding alone moves the update, every option alone, then the options that helped and agreed together, with
the user's state, global flags and compiled-code caches put back after each and at the end.

Order matters for fairness: every configuration starts from the same snapshot (same weights; with the random
generators restored, the same batch), and the baseline runs first, so it also pays the step's one-off costs
(allocator growth, cuDNN handles, lazy modules) that would otherwise flatter the options.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from jupyter_gpu.probekit.clock import eager_op_floor
from jupyter_gpu.probekit.cpu_contention import ContentionWatch
from jupyter_gpu.probekit.fingerprint import GLOBAL_RNG, Custom, Fingerprint, Verdict, object_claims, reach_of
from jupyter_gpu.probekit.kernel_trace import GpuTimeline, trace_kernels
from jupyter_gpu.probekit.saved_files import SavedFiles, probe_leftover_notes
from jupyter_gpu.probekit.schedules import restarted_note, restarting_schedules
from jupyter_gpu.probekit.step_failure import argument_mismatch, first_line
from jupyter_gpu.probekit.ticker import Ticker
from jupyter_gpu.probekit.training_state import StateSnapshot, find_training_objects
from jupyter_gpu.rendering.units import format_seconds
from jupyter_gpu.speedprobe import decide, variants
from jupyter_gpu.speedprobe.catalog import BY_NAME, FP32, OPTION_NAMES, CodeContext, OptimizerCode, loosest_format
from jupyter_gpu.speedprobe.flags import GlobalFlags, conv_tf32_line
from jupyter_gpu.speedprobe.measure import (
    MIN_TIMED_STEPS,
    RoundedRun,
    Run,
    StepRunner,
    null_gradients,
    relative_difference,
    update_scale,
)
from jupyter_gpu.speedprobe.result import Agreement, LaunchProfile, OptionTrial, SpeedProbeResult
from jupyter_gpu.speedprobe.step_code import forward_code
from jupyter_gpu.speedprobe.variants import StepSetting, why_not

DEFAULT_STEPS = 20
# Two baseline runs from the same state whose first updates differ by more than this are not the same
# computation: the step takes a new batch per call (next(iterator)) or draws from a generator we do not restore.
NOT_REPEATABLE = 0.05
# The baseline at the start and at the end differing by more than this factor: the machine's speed changed.
BASELINE_DRIFT = 1.25
# The baseline's slowest timed step over its fastest beyond this: the steps were held up, not the step's own spread.
UNSTEADY = 3.0

Progress = Callable[[str], None]


class SpeedProbeError(RuntimeError):
    """The probe cannot run; the message is one sentence for the user."""


@dataclass(frozen=True)
class SpeedProbeRequest:
    options: tuple[str, ...] | None = None  # None: every option that applies to this step and device
    steps: int = DEFAULT_STEPS


def probe_speed(step: Callable[[], Any], *, options: Sequence[str] | None = None, steps: int = DEFAULT_STEPS,
                namespace: dict[str, Any] | None = None, progress: Progress | None = None) -> SpeedProbeResult:
    """Measure what AMP, TF32, channels_last, cudnn.benchmark, fused optimizers and torch.compile buy on
    `step()`, one training step (its own batch, forward, backward, optimizer step) that may return the loss,
    and check that each one's numbers still agree with the step as it is.

    `namespace` is where the model and optimizer live (a script's `globals()`); the step's own globals, closure
    and bound object are searched as well. Everything is put back afterwards, also after Ctrl-C.
    """
    request = SpeedProbeRequest(tuple(options) if options is not None else None, steps)
    result = run_speedprobe(step, request, namespace=namespace, progress=progress)
    if result.interrupted:
        raise KeyboardInterrupt
    return result


def run_speedprobe(step: Callable[[], Any], request: SpeedProbeRequest | None = None, *,
                   step_name: str | None = None, namespace: dict[str, Any] | None = None,
                   progress: Progress | None = None) -> SpeedProbeResult:
    """`probe_speed` for the magic: on Ctrl-C what was measured comes back with `interrupted=True`."""
    try:
        import torch
    except ImportError:
        raise SpeedProbeError("%speedprobe needs PyTorch, and torch is not installed in this kernel.") from None
    request = request or SpeedProbeRequest()
    name = step_name or getattr(step, "__name__", None) or type(step).__name__
    _check_step(torch, step, name)
    if request.steps < 1:
        raise SpeedProbeError(f"--steps must be at least 1, not {request.steps}")
    unknown = [option for option in request.options or () if option not in BY_NAME]
    if unknown:
        raise SpeedProbeError(f"unknown option {unknown[0]!r}; choose from {', '.join(OPTION_NAMES)}")
    # Everything in the notebook is protected (a step may touch more than it names), but the options apply only
    # to what the step itself reaches: compiling or converting another model in the notebook would time nothing.
    protected = find_training_objects(namespace or {}, step)
    objects = find_training_objects({}, step)
    if not objects.modules and not objects.optimizers:
        objects = protected
    for key, label in protected.labels.items():  # the notebook's names for what the step reaches through others
        objects.labels.setdefault(key, label)  # (the `model` a compiled `cmodel` wraps)
    if not objects.modules and not objects.optimizers:
        raise SpeedProbeError(f"no model or optimizer was found in the notebook or in what `{name}` refers to; "
                              "define them as notebook variables (model = ..., opt = ...) so they can be put back "
                              "after each trial.")
    setting = StepSetting(torch, objects, objects.device() or torch.device("cpu"))
    snapshot = StateSnapshot.take(protected if protected.objects() else objects, step)
    flags = GlobalFlags.take(torch)
    # Checksums of all the probe will claim to put back and all the walk reaches: the report says what compared equal.
    claimed = protected if protected.objects() else objects
    switches = Custom("TF32, cuDNN and anomaly switches", lambda: GlobalFlags.take(torch))
    check = Fingerprint.take([*object_claims(claimed), ("RNG", GLOBAL_RNG), ("global flags", switches)],
                             reach_of(step, None, namespace), namespace)
    user_compiled = _user_compiled_code()
    probe = _Probe(step, name, setting, request, snapshot, flags, progress)
    interrupted = False
    restarted: list[str] = []
    saves = SavedFiles(torch)  # a lifted loop body's periodic checkpoint would overwrite the user's, call after call
    contention = ContentionWatch(torch)
    try:
        with restarting_schedules((protected if protected.objects() else objects).schedulers) as restarted, saves, \
                contention:
            probe.run()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        probe.ticker.stop()
        probe.put_back()
        (progress or _silent)("")
        gc.collect()
    probe.notes += [restarted_note(name) for name in restarted]
    probe.notes += probe_leftover_notes(saves, snapshot.advanced_iterators)
    shared_cpu = contention.note if contention.note is not None and probe.timings_disturbed() else None
    if contention.note is not None and shared_cpu is None:
        probe.notes.append(f"{contention.note}; the baseline's steps were steady all the same")
    verdict = check.verify([*claimed.names(), *snapshot.changed_variables, "RNG", "global flags"])
    return probe.result(interrupted, verdict, user_compiled, shared_cpu=shared_cpu)


def _check_step(torch: Any, step: Any, name: str) -> None:
    """A zero-argument callable that is not the model itself, or one sentence saying what to write instead."""
    if isinstance(step, torch.nn.Module | torch.optim.Optimizer):
        raise SpeedProbeError(f"`{name}` is a {type(step).__name__}, not a function that runs a training step; "
                              "define def train_step(): ... (batch, forward, loss, backward, optimizer step).")
    if not callable(step):
        raise SpeedProbeError(f"`{name}` is a {type(step).__name__}, not a function; it must be callable as "
                              f"{name}() and run one training step.")
    mismatch = argument_mismatch(step, name, 0, "%speedprobe calls it with no arguments")
    if mismatch is not None:
        raise SpeedProbeError(f"{mismatch}; wrap it with its own batch, e.g. def step(): return {name}(batch).")


def _user_compiled_code() -> bool:
    """Whether torch.compile has compiled anything in this process yet (the probe's resets then reach it too)."""
    if "torch._dynamo" not in sys.modules:
        return False
    try:
        from torch._dynamo.convert_frame import input_codes
        return bool(input_codes.seen)
    except (ImportError, AttributeError):
        return True


def reset_compiled_code(torch: Any) -> None:
    """Drop every compiled graph (and CUDA graph pool) after a compiled trial.

    Otherwise each trial's graphs stay cached on the forward's code object, which every instance of the class
    shares, and after a few trials torch.compile hits its recompile limit: later trials, and the user's own
    compiled model, would silently run eagerly. A reset costs the user's own compiled code one recompilation.
    """
    torch._dynamo.reset()


def _silent(_: str) -> None:
    pass


class _Probe:
    def __init__(self, step: Callable[[], Any], name: str, setting: StepSetting, request: SpeedProbeRequest,
                 snapshot: StateSnapshot, flags: GlobalFlags, progress: Progress | None) -> None:
        self.step_name = name
        self.step = step
        self.setting = setting
        self.request = request
        self.snapshot = snapshot
        self.flags = flags
        self.started = time.perf_counter()
        show = progress or _silent
        self.ticker = Ticker(lambda text: show(f"{text}, {format_seconds(time.perf_counter() - self.started)} "
                                               "elapsed"))
        self.runner = StepRunner.for_step(step, setting, setting.objects.parameters(),
                                          progress=lambda text: self.ticker.resume(f"speedprobe {name}: {text}"))
        self.baseline_run: Run | None = None
        self.baseline: OptionTrial | None = None
        self.repeat_noise: float | None = None
        self.sensitivity: dict[str, float | None] = {}
        self.null_gradients: set[int] = set()  # parameters whose update is rounding noise: left out of comparisons
        self.drift: float | None = None  # the baseline's median step at the end over the start's, or the inverse
        self.rounded_drift: dict[str, float | None] = {}  # the loss's drift over the steps from rounded weights
        self.single_runs: list[tuple[str, str | None, Run | None]] = []
        self.judged_singles: list[OptionTrial] | None = None  # the singles once both baselines are in
        self.combination: OptionTrial | None = None
        self.compiled = False
        self.notes: list[str] = []
        self.timeline: GpuTimeline | None = None  # one traced call of the step (CUDA only)

    # -- the sequence ---------------------------------------------------------------------------------------------

    def run(self) -> None:
        # Two more warm-up calls than the other runs: the step's first calls grow the allocator's pools and fill
        # the kernels' caches, costs no later configuration pays.
        first = self._measure((), "baseline (1 of 2)", inspect_step=True, extra_warmup=2)
        if first.error is not None:
            raise SpeedProbeError(f"`{self.step_name}` raised {first.error} (everything it changed was put back)")
        self.baseline_run = first
        self._leave_out_null_gradients(first)
        self.baseline = self._trial("baseline", (), first)
        self._trace()
        # Planned after the baseline: its counted step shows the formats the step computes in (its own autocast)
        # and whether it trains at all (an evaluation step has no update to compare, and fp16 needs no scaler).
        self.setting.compute_dtypes = first.compute_dtypes
        self.setting.random_in_forward = first.random_in_forward
        self.setting.forward_only = first.trained is False
        planned = self._plan()
        applicable = [option for option, reason in planned if reason is None]
        for format_name in dict.fromkeys(BY_NAME[option].format for option in applicable):
            self._calibrate(format_name, first)
        for count, (option, reason) in enumerate(planned, 1):
            run = None if reason is not None else self._measure((option,), f"{option} ({count} of {len(planned)})")
            self.single_runs.append((option, reason, run))
        # The baseline again, after the options: a machine that slowed down or sped up meanwhile shows as a
        # difference between the two, and the pooled baseline favours neither the early nor the late options.
        second = self._measure((), "baseline again (2 of 2)")
        self.repeat_noise = relative_difference(self._compared(second), self._compared(first))
        self.baseline = self._trial("baseline", (), first, extra_times=second.times)
        self._note_drift(first, second)
        # Judged once, with the pooled baseline and the repeatability: agreements compare every parameter.
        self.judged_singles = self.singles()
        members = decide.combination_members(self.judged_singles)
        if len(members) >= 2:
            run = self._measure(members, "the combination")
            self.combination = self._trial("+".join(members), members, run)

    def _calibrate(self, format_name: str, first: Run) -> None:
        """How far rounding the weights to `format_name` alone moves the first update, and (for a reduced format)
        the loss over the steps: the scale of the differences correct arithmetic in that format makes here."""
        self.ticker.resume(f"speedprobe {self.step_name}: how {format_name} rounding alone moves the {self.compared}")
        steps = 1 if format_name == FP32 else self.request.steps  # float32 reorderings drift nowhere near 1%
        rounded = self.runner.rounded_run(format_name, steps)
        self.put_back()
        self.sensitivity[format_name] = relative_difference(self._compared(rounded), self._compared(first))
        self.rounded_drift[format_name] = decide.loss_drift(rounded.losses[:steps], first.losses[:steps])[0]
        if format_name == FP32 and self.sensitivity[format_name] is not None:
            # How many ReLUs or signs a perturbation this small flips is chance (0 or 3 of a million): one draw
            # called correct channels_last wrong once in 72 CPU cases, the larger of two in none.
            again = self.runner.rounded_run(format_name, steps, draw=1)
            self.put_back()
            second = relative_difference(self._compared(again), self._compared(first))
            if second is not None:
                self.sensitivity[format_name] = max(self.sensitivity[format_name], second)

    @property
    def compared(self) -> str:
        """What the agreement compares: the first update, or for a step that trains nothing the models' outputs."""
        return "outputs" if self.setting.forward_only else "update"

    def _compared(self, run: Run | RoundedRun) -> list[Any] | None:
        if self.setting.forward_only:
            return run.outputs
        if run.update is None or not self.null_gradients:
            return run.update
        return [change for index, change in enumerate(run.update) if index not in self.null_gradients]

    def _leave_out_null_gradients(self, first: Run) -> None:
        """Parameters whose first gradient is rounding noise (a bias before BatchNorm) make updates of noise in every
        configuration: compared, they called correct fp16 autocast wrong on a trained MLP (update 0.22-0.27 off, all
        of it in two such biases). They are left out of the update's comparison and named."""
        params = self.runner.params
        null = null_gradients(first.gradient_rms, [param.numel() for param in params])
        if not null or len(null) == len(params):
            return
        self.null_gradients = null
        names = _parameter_names(self.setting.objects)
        named = [names.get(id(params[index]), f"parameter {index}") for index in sorted(null)]
        shown = ", ".join(named[:4]) + (f" and {len(named) - 4} more" if len(named) > 4 else "")
        self.notes.append(f"{shown}: gradient zero up to rounding in the first step (a bias that feeds BatchNorm, "
                          "whose batch mean cancels it), so its update is rounding noise in any format (Adam makes "
                          "full steps of it); left out of the update's comparison")

    def singles(self) -> list[OptionTrial]:
        return [OptionTrial(option, (option,), skipped=reason) if run is None else self._trial(option, (option,), run)
                for option, reason, run in self.single_runs]

    def timings_disturbed(self) -> bool:
        """The baseline's step changed speed between its two runs, or within one by more than UNSTEADY times: what
        other processes holding the cores do to the timings (42.6x read off a baseline of 4.2 ms - 508 ms)."""
        times = self.baseline.times if self.baseline is not None else []
        unsteady = bool(times) and min(times) > 0 and max(times) / min(times) > UNSTEADY
        return unsteady or (self.drift is not None and self.drift > BASELINE_DRIFT)

    def _note_drift(self, first: Run, second: Run) -> None:
        if not first.times or not second.times:
            return
        start, end = statistics.median(first.times), statistics.median(second.times)
        self.drift = max(start, end) / min(start, end) if min(start, end) > 0 else None
        if max(start, end) > BASELINE_DRIFT * min(start, end):
            self.notes.append(f"the machine's speed changed while the probe ran: the baseline step took "
                              f"{format_seconds(start)} at the start and {format_seconds(end)} at the end, so the "
                              "speed-ups are uncertain by about that much (other work on this machine?)")

    def _plan(self) -> list[tuple[str, str | None]]:
        names = self.request.options or OPTION_NAMES
        return [(option, why_not(option, self.setting)) for option in OPTION_NAMES if option in names]

    def _measure(self, names: tuple[str, ...], label: str, inspect_step: bool = False,
                 extra_warmup: int = 0) -> Run:
        compiled = any(name.startswith("compile") for name in names)
        self.compiled = self.compiled or compiled
        timed = self._measure_once(names, label, inspect_step, extra_warmup, same_random_numbers=False)
        other_numbers = (compiled and self.setting.draws_random_numbers()) or (
            "channels-last" in names and self.setting.has_dropout())
        if not other_numbers or timed.error is not None:
            return timed
        # Compiled dropout, and dropout on channels_last activations, draw other masks than the baseline's from the
        # same seed, so the updates cannot be compared: the agreement comes from a second run that draws the
        # baseline's masks (slower, so it is not the timing).
        checked = self._measure_once(names, f"{label}, checking its numbers", False, 0, same_random_numbers=True)
        how = ("a second compilation whose random numbers (dropout's masks, randn_like) are eager's "
               "(torch._inductor.config.fallback_random)"
               if compiled else "a second run whose dropout draws its masks in the baseline's order (on "
                                "channels_last activations it draws them in memory order)")
        return replace(timed, update=checked.update, outputs=checked.outputs, losses=checked.losses,
                       scaling=checked.scaling,
                       first_step_skipped=checked.first_step_skipped, loss_note=checked.loss_note, error=checked.error,
                       notes=[*timed.notes, f"its numbers were checked on {how}"])

    def _measure_once(self, names: tuple[str, ...], label: str, inspect_step: bool, extra_warmup: int,
                      same_random_numbers: bool) -> Run:
        run = self._run_once(names, label, inspect_step, extra_warmup, same_random_numbers)
        scaling = run.scaling
        if run.error is not None or scaling is None or not run.first_step_skipped or decide.scaler_failure(
                scaling.initial_scale, float(scaling.scaler.get_scale()), scaling.skipped_steps, scaling.steps,
                scaling.scaled_backwards > 0) is not None:
            return run
        # The GradScaler skipped its first steps while it found its scale, so this run lags the baseline by those
        # steps and has no first update to compare. Training gets past that in its first steps: run again from the
        # scale it found, as the rest of training runs.
        found = float(scaling.scaler.get_scale())
        settled = self._run_once(names, f"{label}, from the GradScaler's scale {found:g}", False, extra_warmup,
                                 same_random_numbers, fp16_init_scale=found)
        note = (f"the GradScaler skipped {scaling.skipped_steps} of its first steps (float16 gradients overflowed at "
                f"its initial scale {scaling.initial_scale:g}) and settled at {found:g}; measured again from "
                f"{found:g}, as training runs once the scale is found")
        return replace(settled, notes=[*settled.notes, note])

    def _run_once(self, names: tuple[str, ...], label: str, inspect_step: bool, extra_warmup: int,
                  same_random_numbers: bool, fp16_init_scale: float | None = None) -> Run:
        try:
            return self.runner.run(names, self.request.steps, label, inspect_step=inspect_step,
                                   extra_warmup=extra_warmup, same_random_numbers=same_random_numbers,
                                   fp16_init_scale=fp16_init_scale)
        finally:
            self.ticker.pause()
            self.put_back()
            if any(name.startswith("compile") for name in names):
                reset_compiled_code(self.setting.torch)

    def put_back(self) -> None:
        self.snapshot.restore()
        self.flags.restore(self.setting.torch)

    # -- one configuration's trial --------------------------------------------------------------------------------

    def _trial(self, name: str, members: tuple[str, ...], run: Run, extra_times: Sequence[float] = ()) -> OptionTrial:
        if run.refused is not None:
            return OptionTrial(name, members, skipped=run.refused, forward_only=self.setting.forward_only)
        times = [*run.times, *extra_times]
        seconds = statistics.median(times) if times else None
        baseline_seconds = self.baseline.seconds if self.baseline is not None else seconds
        speedup = baseline_seconds / seconds if seconds and baseline_seconds and run.error is None else None
        compile_seconds = None
        if any(member.startswith("compile") for member in members) and run.warmup_seconds and seconds:
            compile_seconds = max(0.0, sum(run.warmup_seconds) - len(run.warmup_seconds) * seconds)
        cuda = self.setting.device_type == "cuda"
        return OptionTrial(
            name=name, members=members, times=times, warmup_seconds=list(run.warmup_seconds),
            compile_seconds=compile_seconds, peak_bytes=run.cuda_peak_bytes if cuda else run.cpu_peak_bytes,
            ops=sum(run.ops.values()) if run.ops else None,
            agreement=self._agreement(members, run) if members else None,
            speedup=speedup if members else 1.0, error=run.error, forward_only=self.setting.forward_only)

    def _agreement(self, members: tuple[str, ...], run: Run) -> Agreement | None:
        if run.error is not None:
            return None
        baseline = self.baseline_run
        assert baseline is not None
        format_name = loosest_format(members)
        failure = unjudged = update_note = None
        update = self._compared(run)
        if run.scaling is not None:
            scaling = run.scaling
            failure = decide.scaler_failure(scaling.initial_scale, float(scaling.scaler.get_scale()),
                                            scaling.skipped_steps, scaling.steps, scaling.scaled_backwards > 0)
            if scaling.unplaced_change:
                unjudged = decide.UNPLACED_UNSCALE
            elif run.first_step_skipped:
                update, update_note = None, decide.first_step_skipped_note(scaling.initial_scale)
        if self.repeat_noise is not None and self.repeat_noise > NOT_REPEATABLE:
            unjudged = (f"two baseline runs from the same state differ by {self.repeat_noise:.2g}: the step is not "
                        "the same computation twice (a new batch per call, e.g. next(iterator)?); give it a fixed "
                        "batch to compare numbers")
        tolerance = decide.tolerance(format_name, self.sensitivity.get(format_name), self.repeat_noise,
                                     compared=self.compared)
        steps = self.request.steps
        reference = self._compared(baseline)
        return decide.judge(format_name, relative_difference(update, reference), tolerance,
                            run.losses[:steps], baseline.losses[:steps], failure=failure, unjudged=unjudged,
                            update_scale=update_scale(update, reference),
                            drift_limit=decide.loss_limit(self.rounded_drift.get(format_name), format_name),
                            update_note=update_note, compared=self.compared)

    # -- the result -------------------------------------------------------------------------------------------------

    def result(self, interrupted: bool, verdict: Verdict, user_compiled: bool,
               shared_cpu: str | None = None) -> SpeedProbeResult:
        baseline = self.baseline or OptionTrial("baseline", ())
        singles_measured = self.judged_singles if self.judged_singles is not None else self.singles()
        # Timings taken while other processes held the cores say nothing about the options: none is recommended.
        best = decide.choose_best(singles_measured, self.combination) if shared_cpu is None else None
        run = self.baseline_run
        # A variant switches every optimizer the notebook holds; only those the step stepped are worth a note.
        _, used_optimizers = self._used()
        unused = {variants.optimizer_note(self.setting.objects.labels.get(id(opt), "opt"), opt, flag)
                  for opt in self.setting.objects.optimizers if opt not in used_optimizers
                  for flag in ("fused", "foreach")}
        notes = [f"{option}: {note}" for option, _, single in self.single_runs if single is not None
                 for note in single.notes if note not in unused]
        notes += self.notes
        if self.setting.forward_only:
            notes.append(f"`{self.step_name}` trains nothing (no optimizer step, no gradient: an evaluation or "
                         "inference step): agreement is judged on its models' outputs, fp16 runs without a "
                         "GradScaler and the fused optimizer is not tried")
        elif run is not None and run.loss_note is None and all(loss is None for loss in run.losses):
            notes.append(f"`{self.step_name}` returns no loss: agreement is judged on the parameter update alone "
                         f"(return the loss to compare it over {self.request.steps} steps too)")
        elif run is not None and run.loss_note is not None:
            notes.append(f"{run.loss_note}: agreement is judged on the parameter update alone")
        if self.compiled and user_compiled:
            notes.append("torch.compile's caches were reset after each compiled trial (torch._dynamo.reset()), so "
                         "the trials do not use up the recompile limit of your own compiled code; it recompiles on "
                         "its next call")
        if len(baseline.times) < MIN_TIMED_STEPS and not interrupted:
            notes.append(f"only {len(baseline.times)} timed steps")
        printed = self.runner.output.note(self.step_name)
        if printed is not None:
            notes.append(printed)
        notes += self.runner.output.warning_notes()
        return SpeedProbeResult(
            step_name=self.step_name, device=str(self.setting.device),
            batch_size=run.batch_size if run is not None else None,
            batches_per_step=run.batches if run is not None else 1, baseline=baseline, options=singles_measured,
            combination=self.combination, best=best, launch=self._launch(baseline, run),
            code_context=self._code_context(), repeatability=self.repeat_noise, steps=self.request.steps,
            notes=notes, restored=verdict.restored, not_restored=verdict.not_restored,
            seconds=time.perf_counter() - self.started, interrupted=interrupted, shared_cpu=shared_cpu)

    def _launch(self, baseline: OptionTrial, run: Run | None) -> LaunchProfile | None:
        if run is None or baseline.seconds is None or not run.ops:
            return None
        device_type = self.setting.device_type
        ops = int(run.ops.get(device_type, 0))
        timeline = self.timeline.at_step(baseline.seconds) if self.timeline is not None else None
        busy = timeline.busy if timeline is not None else None
        floor = eager_op_floor(self.setting.torch) if device_type == "cpu" and timeline is None else None
        return LaunchProfile(device=str(self.setting.device), ops=ops, step_seconds=baseline.seconds,
                             launch_bound=decide.launch_bound(device_type, ops, baseline.seconds,
                                                              timeline.launch_bound if timeline is not None else None,
                                                              op_floor=floor),
                             gpu_busy=busy, kernels=timeline.kernels_per_step if timeline is not None else None,
                             op_floor=floor)

    def _trace(self) -> None:
        """On CUDA, one more call of the step under torch.profiler: how long its kernels run, for the launch-bound
        verdict. A trace that fails is a note, never the probe's failure."""
        if self.setting.device_type != "cuda":
            return
        self.ticker.resume(f"speedprobe {self.step_name}: tracing one step's kernels")
        try:
            with self.runner.output.hidden():
                self.timeline = trace_kernels(self.setting.torch, self.runner.step)
        except Exception as exc:  # CUPTI missing, a profiler already running: judged without it
            self.notes.append(f"the step's kernels could not be traced ({type(exc).__name__}: {first_line(exc)}); "
                              "launch-bound is judged from the time per operator")
        finally:
            self.put_back()

    def _used(self) -> tuple[list[Any], list[Any]]:
        """The notebook's models the step called and the optimizers it stepped, as the baseline's counted step saw
        them; all of them where it saw none (a step that calls a model's submodule, say)."""
        objects, run = self.setting.objects, self.baseline_run
        models, optimizers = objects.models(), list(objects.optimizers)
        if run is not None and run.called_models:
            models = [module for module in models if id(module) in run.called_models] or models
        if run is not None and run.stepped_optimizers:
            optimizers = [opt for opt in optimizers if id(opt) in run.stepped_optimizers] or optimizers
        return models, optimizers

    def _code_context(self) -> CodeContext:
        objects = self.setting.objects
        notes = {note for _, _, run in self.single_runs if run is not None for note in run.notes}
        # Each model with parameters the step called gets its layout and compile line (a loss module has nothing to
        # change; a model the notebook holds for something else is not the step's).
        models, used_optimizers = self._used()
        model_names = tuple(objects.labels.get(id(module), "model") for module in models) or ("model",)
        optimizers = tuple(
            OptimizerCode(name=label, class_path=_class_path(optimizer),
                          parameters=_parameters_expression(optimizer, models, objects.labels),
                          fused=variants.optimizer_note(label, optimizer, "fused") in notes)
            for optimizer in used_optimizers
            for label in [objects.labels.get(id(optimizer), "opt")]) or (OptimizerCode(),)
        conv_line = conv_tf32_line(self.setting.torch) if self.setting.device_type == "cuda" else None
        clips = any(run is not None and run.scaling is not None and run.scaling.unscaled_for_clipping
                    for _, _, run in self.single_runs)
        try:
            forward = forward_code(self.step, model_names, self.setting.forward_only)
        except Exception:  # source the reader did not foresee: the template says the same, in general words
            forward = None
        return CodeContext(device_type=self.setting.device_type, models=model_names, optimizers=optimizers,
                           conv_tf32_line=conv_line, unscale_before_clipping=clips,
                           forward_only=self.setting.forward_only, forward=forward)


def _parameter_names(objects: Any) -> dict[int, str]:
    """id(parameter) -> how the notebook reaches it ("model.net.0.bias")."""
    names: dict[int, str] = {}
    for module in objects.modules:
        label = objects.labels.get(id(module), type(module).__name__)
        for name, param in module.named_parameters():
            names.setdefault(id(param), f"{label}.{name}")
    return names


def _parameters_expression(optimizer: Any, models: list[Any], labels: dict[int, str]) -> str | None:
    """"model.parameters()" when the optimizer holds exactly that model's parameters in one group; None otherwise
    (parameter groups, part of a model, several models), so the line keeps what the user wrote."""
    if len(optimizer.param_groups) != 1:
        return None
    held = {id(param) for param in optimizer.param_groups[0]["params"]}
    for module in models:
        if {id(param) for param in module.parameters()} == held:
            # torch.compile's wrapper holds the model it wraps: `opt = Adam(model.parameters())` was written before
            # `cmodel = torch.compile(model)`, so the line names the model, as the user's own line does.
            for named in (getattr(module, "_orig_mod", None), module):
                if named is not None and id(named) in labels:
                    return f"{labels[id(named)]}.parameters()"
    return None


def _class_path(optimizer: Any) -> str:
    """How the user would name the optimizer's class: torch.optim.AdamW for torch's own (defined in
    torch.optim.adamw), the bare class name for a notebook's or another library's."""
    kind = type(optimizer)
    return f"torch.optim.{kind.__name__}" if kind.__module__.startswith("torch.optim") else kind.__name__
