"""Run the batch-size search for real: trials of the user's step under a memory budget, state put back.

Each trial restores the training state first, so every size starts from the same model, optimizer and
RNG state and measures the same thing; the state is restored once more at the end, also when a trial
failed half-way or the user interrupted. Out-of-memory errors are recognised in the `except` block but
cleaned up after it: inside it, the exception's traceback still holds the failed trial's tensors.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from jupyter_gpu.batchprobe.budget import AllocatorBudget, Budget, BudgetError, TensorBudget
from jupyter_gpu.batchprobe.holders import Holder, memory_holders
from jupyter_gpu.batchprobe.oom import FailureKind, classify, describe
from jupyter_gpu.batchprobe.result import AMP_DTYPES, RECOMMEND, SEARCH, VERIFY, BatchProbeResult, Trial
from jupyter_gpu.batchprobe.search import (
    BatchSizeSearch,
    CurveModel,
    Outcome,
    flat_check_size,
    flat_in_batch_size,
    memory_line,
    recommended_size,
    throughput_knee,
)
from jupyter_gpu.batchprobe.time_limit import TimeLimit, affordable_size, predicted_seconds, worth_trying
from jupyter_gpu.kernel_torch import cuda_initialized
from jupyter_gpu.probekit.cpu_contention import ContentionWatch
from jupyter_gpu.probekit.fingerprint import GLOBAL_RNG, Fingerprint, object_claims, reach_of
from jupyter_gpu.probekit.release import release_last_error
from jupyter_gpu.probekit.saved_files import SavedFiles, probe_leftover_notes
from jupyter_gpu.probekit.schedules import restarted_note, restarting_schedules
from jupyter_gpu.probekit.step_census import StepCensus
from jupyter_gpu.probekit.step_failure import argument_mismatch, raised_sentence
from jupyter_gpu.probekit.step_output import StepOutput
from jupyter_gpu.probekit.ticker import Ticker
from jupyter_gpu.probekit.training_state import StateSnapshot, TrainingObjects, find_training_objects
from jupyter_gpu.rendering.units import format_bytes, format_seconds

# Without --max the search stops here: a tiny model "fits" a million samples, and running a step that
# large only to say so would take minutes. The report says when this cap, not memory, was the limit.
DEFAULT_MAX_BATCH = 65536
# The probe stops before a trial that would end past this many seconds from its start. On a GPU a search takes
# seconds; on a CPU, where a step takes as long as its batch is big, a search to the machine's free memory ran past
# 18 minutes on a small language model (each trial near batch 9,000 took minutes) before this limit existed.
DEFAULT_MAX_SECONDS = 300.0

# A step keeps memory between calls (a leak) when what is live after a call grew since the call before by at
# least LEAK_FLOOR bytes and by enough to take 1% of the budget within LEAK_HORIZON calls (an epoch or so). A
# scalar loss kept per call (`losses.append(loss.detach())`) is a few bytes and no reason to stop; a kept
# output of a few KiB per call fills a card within a long run.
LEAK_FLOOR = 1024
LEAK_HORIZON = 1000
# The report names at most this many holders of the starting memory.
BASELINE_HOLDERS = 4

Progress = Callable[[str], None]


class ProbeError(RuntimeError):
    """The probe cannot run (no torch, no budget for this device)."""


class StickyCudaError(RuntimeError):
    """A trial hit an error that leaves the CUDA context unusable: only a kernel restart recovers."""


@dataclass(frozen=True)
class ProbeRequest:
    start: int = 2  # as Lightning: batch size 1 breaks BatchNorm in training mode
    maximum: int = DEFAULT_MAX_BATCH
    max_memory: int | None = None
    margin: float = 0.1
    steps: int = 2
    amp: str | None = None
    max_seconds: float | None = DEFAULT_MAX_SECONDS  # None: no time limit


def probe_batch_size(step: Callable[[int], Any], request: ProbeRequest | None = None, *,
                     namespace: dict[str, Any] | None = None, progress: Progress | None = None
                     ) -> BatchProbeResult:
    """Find the largest batch size `step(batch_size)` runs with in the budget; the state is put back.

    `namespace` is where the model and optimizer live (a script's `globals()`; the step's own globals,
    closure and bound object are searched as well). Ctrl-C stops the probe after putting the state back.
    """
    result = run_probe(step, request, namespace=namespace, progress=progress)
    if result.interrupted:
        raise KeyboardInterrupt
    return result


def run_probe(step: Callable[[int], Any], request: ProbeRequest | None = None, *,
              namespace: dict[str, Any] | None = None, shell: Any = None,
              progress: Progress | None = None) -> BatchProbeResult:
    """`probe_batch_size` for the magic: on Ctrl-C the finished trials come back with `interrupted=True`."""
    try:
        import torch
    except ImportError:
        raise ProbeError("%batchprobe needs PyTorch, and torch is not installed in this kernel.") from None
    request = request or ProbeRequest()
    mismatch = argument_mismatch(step, getattr(step, "__name__", "step"), 1,
                                 "%batchprobe calls it with one argument, the batch size: step(batch_size)")
    if mismatch is not None:
        raise ProbeError(f"{mismatch}; write def step(batch_size): ... that builds a batch of that size and trains "
                         "on it.")
    started = time.perf_counter()
    release_last_error(shell)  # an OOM in an earlier cell may still hold its tensors
    namespace = namespace or {}
    objects = find_training_objects(namespace, step)
    # Where the model lives decides what to count; with no model found the step decides.
    budget = _budget_for(torch, request.max_memory, objects.device())
    notes: list[str] = []
    try:
        # release_last_error has just run the cycle collector; a second full collection would find nothing more.
        budget.release_cache()
        memory_before = budget.in_use()
        baseline = _holders(torch, namespace, objects, budget)
        snapshot = StateSnapshot.take(objects, step)
        # Checksums of what the probe will claim to put back and all the walk reaches: the report says what compared
        # equal. They hold no tensor, so the budget has nothing of theirs to exclude.
        check = Fingerprint.take([*object_claims(objects), ("RNG", GLOBAL_RNG)], reach_of(step, None, namespace),
                                 namespace)
        budget.exclude(snapshot.host_tensors())
        runner = _Runner(torch, step, request, budget, snapshot, progress or _silent, namespace, objects)
        # A OneCycleLR the step calls starts over at its end instead of raising (probekit/schedules.py).
        saves = SavedFiles(torch)  # a step that checkpoints would overwrite the user's file, trial after trial
        contention = ContentionWatch(torch)  # the trials' step times, measured on a CPU others share
        with restarting_schedules(objects.schedulers) as restarted, saves, contention:
            try:
                runner.run()
                if runner.switch_to is not None:  # the first trial showed the work is on another device
                    budget.close()
                    budget = _budget_for(torch, request.max_memory, runner.switch_to)
                    budget.exclude(snapshot.host_tensors())
                    notes.append(f"The step put its tensors on {budget.device}: the probe started again there.")
                    budget.release_cache()
                    memory_before = budget.in_use()
                    baseline = _holders(torch, namespace, objects, budget)
                    runner = _Runner(torch, step, request, budget, snapshot, progress or _silent, namespace, objects)
                    runner.run()
            finally:
                runner.ticker.stop()
                if not runner.broken:
                    snapshot.restore()
                (progress or _silent)("")
        snapshot_bytes = snapshot.host_bytes
        changed = snapshot.changed_variables
        verdict = check.verify([*objects.names(), *changed, "RNG"])  # before the "after" figure: its temporaries go
        advanced = snapshot.advanced_iterators  # read before the snapshot goes
        del snapshot, runner.snapshot  # the host copies go now: the "after" figure must not count them
        release_last_error(shell)  # collects, too
        budget.release_cache()
        memory_after = budget.in_use()
    finally:
        budget.close()
    notes += [restarted_note(name) for name in restarted]
    notes += probe_leftover_notes(saves, advanced)
    if contention.note is not None:
        notes.append(f"The step times: {contention.note}.")
    printed = runner.output.note(getattr(step, "__name__", "the step"))
    if printed is not None:
        notes.append(printed)
    notes += runner.output.warning_notes()
    return _result(runner, request, budget, verdict.restored, notes, memory_before, memory_after,
                   snapshot_bytes, time.perf_counter() - started, baseline, verdict.not_restored)


def _holders(torch: Any, namespace: dict[str, Any], objects: TrainingObjects, budget: Budget,
             only: set[int] | None = None) -> list[Holder]:
    return memory_holders(torch, namespace, objects, budget.device.split(":")[0], only=only)


def _budget_for(torch: Any, max_memory: int | None, device: Any) -> Budget:
    if device is None:
        # No model to go by: a kernel that already uses CUDA most likely probes a CUDA step. If the step's
        # tensors turn out to live elsewhere, the first trial says so and the probe starts again there.
        # cuda_initialized asks is_initialized() alone: is_available() would initialise the driver (cuInit, which
        # breaks fork) in a kernel that never used CUDA.
        device = torch.device("cuda" if cuda_initialized(torch) else "cpu")
    device = torch.device(device)
    try:
        if device.type == "cuda":
            return AllocatorBudget(torch, max_memory, device.index)
        return TensorBudget(torch, device.type, max_memory)
    except BudgetError as exc:
        raise ProbeError(str(exc)) from None


def _silent(_: str) -> None:
    return None


@dataclass(frozen=True)
class Leak:
    """A step that keeps more memory after every call at the same size."""

    batch_size: int
    bytes_per_call: int
    holders: list[Holder]


class _Runner:
    """The trial loop for one budget."""

    def __init__(self, torch: Any, step: Callable[[int], Any], request: ProbeRequest, budget: Budget,
                 snapshot: StateSnapshot, progress: Progress, namespace: dict[str, Any],
                 objects: TrainingObjects) -> None:
        self.torch = torch
        self.step = step
        self.output = StepOutput()  # what the step printed in its trials, kept out of the notebook
        self.request = request
        self.budget = budget
        self.snapshot = snapshot
        self.progress = progress
        self.namespace = namespace
        self.objects = objects
        self.search = BatchSizeSearch(start=request.start, maximum=request.maximum,
                                      budget_bytes=budget.limit_bytes, margin=request.margin)
        self.trials: list[Trial] = []
        self.recommended = 0
        self.interrupted = False
        self.broken = False
        self.switch_to: str | None = None
        self.leak: Leak | None = None
        self.time_limit: TimeLimit | None = None
        # What trials left alive after the restore, by the batch size of the trial that made it.
        self.leftovers: dict[int, list[Holder]] = {}
        self.leftover_bytes: dict[int, int] = {}
        self._started = time.perf_counter()
        self.ticker = Ticker(self._show)

    def run(self) -> None:
        try:
            while (size := self.search.next_size()) is not None:
                how = self.search.last_step
                if self._past_time_limit(size):
                    if self._trial_in_time_left(size):
                        continue  # the search chooses again, knowing how a larger step scales
                    break
                self._trial(size, VERIFY if how == "re-run" else SEARCH, how)
                if self.switch_to is not None or self.leak is not None:
                    return
            if self.time_limit is None:
                self._check_flat_top()
            if self.switch_to is not None or self.leak is not None:
                return
            self.recommended = self._recommend()
        except KeyboardInterrupt:
            self.interrupted = True

    def _check_flat_top(self) -> None:
        """At --max, run the size the "ignores batch_size" verdict needs at the top of the range, if it is missing
        (the search jumped there from the smallest sizes)."""
        if not self.search.capped:
            return
        size = flat_check_size(_peak_points(self.trials), self.request.start)
        if size is not None:
            self._trial(size, SEARCH, "flat check")

    def _recommend(self) -> int:
        answer = self.search.answer
        if answer <= 0 or _ignores_batch_size(self.trials, self.search):
            return 0
        outcomes = self.search.outcomes
        # A memory model the step contradicted says nothing about the real limit: the margin goes on the size.
        budget = None if self.search.discredited else self.budget.limit_bytes
        # Never below --start: a smaller size may not run at all (BatchNorm at 1), whatever the margin says.
        size = max(self.request.start, recommended_size(outcomes, answer, budget, self.request.margin))
        if size <= 0 or any(t.fitted and t.batch_size == size for t in self.trials):
            return size
        smaller = [t.batch_size for t in self.trials if t.fitted and t.batch_size < size]
        if self.time_limit is not None or self._past_time_limit(size, stop=False):
            return max(smaller, default=0)  # out of time: the largest size that ran within the margin
        trial = self._trial(size, RECOMMEND, "margin")
        return size if trial.fitted else max(smaller, default=0)

    def _past_time_limit(self, size: int, stop: bool = True) -> bool:
        """Whether a trial at `size` is predicted to end past --max-seconds (time_limit.predicted_seconds; the
        first trial always runs). `stop`: record the limit, which ends the search unless a smaller trial fits in
        the time left."""
        limit = self.request.max_seconds
        predicted = predicted_seconds(self.trials, size, self.request.steps) if limit is not None else None
        if limit is None or predicted is None or self._elapsed() + predicted <= limit:
            return False
        if stop:
            self.time_limit = TimeLimit(limit, size, predicted, self.search.lowest_failure)
        return True

    def _trial_in_time_left(self, next_size: int) -> bool:
        """Instead of `next_size`, try the largest size the time left affords, where that says more than the
        largest that ran; False when there is none (the search stops). The prediction scales the largest step in
        proportion, which from the small sizes a search starts at overestimates many times (their fixed cost is
        nearly all of the step; a step that ignores batch_size costs the same at any size): the trial measures
        how a larger step really scales, and the search goes on with that."""
        assert self.request.max_seconds is not None
        size = affordable_size(self.trials, self.request.max_seconds - self._elapsed(), self.request.steps)
        if not worth_trying(size, self.search.largest_fit, next_size):
            self.search.instead("not tried")
            return False
        assert size is not None
        self.search.instead("time left")
        self._trial(size, SEARCH, "time left")
        self.time_limit = None
        return True

    def _elapsed(self) -> float:
        return time.perf_counter() - self._started

    def _trial(self, size: int, purpose: str, how: str) -> Trial:
        self._show(f"trial {len(self.trials) + 1}: batch {size} ({how}) …", ticking=True)
        self.snapshot.restore(variables=False)  # the variables once, at the end: see StateSnapshot.restore
        started = time.perf_counter()
        times: list[float] = []
        live_after: list[int] = []  # what each call left live
        failure = None
        census = StepCensus(self.torch, self.objects.modules, self.objects.parameters())
        try:
            with self.budget.trial(), self._autocast(), census, self.output.hidden():
                for _ in range(self.request.steps):
                    self.budget.synchronize()
                    step_started = time.perf_counter()
                    self.step(size)
                    self.budget.synchronize()
                    times.append(time.perf_counter() - step_started)
                    live_after.append(self.budget.live_after_step())
        except Exception as error:
            failure = classify(error)
            if failure is None:  # not a lack of memory: the step is broken at every size
                raise ProbeError(f"the step raised {raised_sentence(self.torch, error)} at batch size {size} "
                                 "(everything it changed was put back)") from None
            if failure.kind is FailureKind.STICKY:
                self.broken = True
                raise StickyCudaError(f"%batchprobe stopped at batch size {size}: {describe(failure)}. "
                                      "The model's state could not be put back.") from error
        finally:
            self.ticker.pause()
        # Cleanup happens here, outside the except block: the exception and its frames are gone now.
        peak = self.budget.peak()
        needed = self.budget.refused_at() if failure is not None else None
        self.budget.end_trial()
        self.snapshot.restore(variables=False)  # the variables once, at the end: see StateSnapshot.restore
        if failure is not None and (self.budget.leftovers() or not self.budget.tracks_every_storage):
            # A failed step can leave reference cycles (half-built autograd graphs, frames) that hold tensors; a
            # successful one frees by reference counting. A full collection costs a large notebook ~0.3 s, the
            # costliest part of a trial, so where the budget tracks every storage it runs only when storages the
            # trials made are still alive. The CUDA ledger cannot see a storage held by an autograd node alone.
            gc.collect()
        self.budget.release_cache()
        self._note_other_device()
        trial = _trial_record(size, purpose, how, failure, peak, times, time.perf_counter() - started, needed,
                              census.batches)
        self.trials.append(trial)
        if purpose != RECOMMEND and self.switch_to is None:
            fitted = trial.fitted
            self.search.record(size, fitted, trial.peak_bytes if fitted else None,
                               curve=peak.curve if fitted else None)
        self._check_leftovers(size)
        if trial.fitted and len(live_after) >= 2:
            self._check_leak(size, live_after)
        self._show(_progress_line(len(self.trials), trial, self.search, self.budget.limit_bytes))
        return trial

    def _check_leak(self, size: int, live_after: list[int]) -> None:
        kept = live_after[-1] - live_after[-2]
        if kept >= max(LEAK_FLOOR, 0.01 * self.budget.limit_bytes / LEAK_HORIZON):
            self.leak = Leak(size, kept, self.leftovers.get(size, []))

    def _check_leftovers(self, size: int) -> None:
        """Name what a trial left alive after the restore: a hook, a global or a list keeps its tensors."""
        leftovers = self.budget.leftovers()
        kept = sum(leftovers.values())
        if kept < LEAK_FLOOR:  # a scalar a closure kept (32 B) is not worth a row
            return
        self.leftover_bytes[size] = kept
        self.leftovers[size] = _holders(self.torch, self.namespace, self.objects, self.budget,
                                        only=set(leftovers))

    def _autocast(self) -> Any:
        if self.request.amp is None:
            return nullcontext()
        dtype = getattr(self.torch, AMP_DTYPES[self.request.amp])
        return self.torch.autocast(device_type=self.budget.device.split(":")[0], dtype=dtype)

    def _note_other_device(self) -> None:
        # A CPU budget that saw the step's tensors on an accelerator is counting the wrong memory.
        if not self.trials and isinstance(self.budget, TensorBudget) and self.budget.device == "cpu":
            others = sorted(self.budget.devices_seen - {"cpu", "meta"})
            if others:
                self.switch_to = others[0]

    def _show(self, text: str, ticking: bool = False) -> None:
        self.progress(f"%batchprobe  {text}  [{format_seconds(time.perf_counter() - self._started)}]")
        if ticking:
            self.ticker.resume(text)


def _trial_record(size: int, purpose: str, how: str, failure: Any, peak: Any, times: list[float],
                  seconds: float, needed: int | None, batches: int = 1) -> Trial:
    fitted = failure is None
    steady = statistics.median(times[1:]) if len(times) > 1 else (times[0] if times else None)
    return Trial(
        batch_size=size, fitted=fitted, peak_bytes=peak.bytes if fitted else None,
        step_seconds=steady if fitted else None,
        samples_per_second=size * batches / steady if fitted and steady else None, batches=batches,
        purpose=purpose, how=how,
        failure=None if failure is None else describe(failure),
        failure_kind=None if failure is None else str(failure.kind),
        allocated_peak_bytes=peak.allocated_bytes if fitted else None,
        steps_run=len(times), seconds=seconds, needed_bytes=needed)


def _progress_line(number: int, trial: Trial, search: BatchSizeSearch, budget: int) -> str:
    verdict = (f"fits, peak {format_bytes(trial.peak_bytes)} of {format_bytes(budget)}" if trial.fitted
               else f"does not fit: {trial.failure}")
    known = f"fits ≤ {search.largest_fit or '—'}"
    if search.lowest_failure is not None:
        known += f", fails ≥ {search.lowest_failure}"
    return f"trial {number}: batch {trial.batch_size} {verdict}  │ {known}"


def _result(runner: _Runner, request: ProbeRequest, budget: Budget, restored: list[str], notes: list[str],
            memory_before: int, memory_after: int, snapshot_bytes: int, seconds: float,
            baseline: list[Holder], not_restored: list[str] | None = None) -> BatchProbeResult:
    search = runner.search
    ignores = runner.leak is None and _ignores_batch_size(runner.trials, search)
    answer = 0 if runner.leak is not None or ignores else search.answer
    fitted_rates = [(t.batch_size, t.samples_per_second) for t in runner.trials
                    if t.fitted and t.samples_per_second is not None]
    best_per_size: dict[int, float] = {}
    for size, rate in fitted_rates:
        best_per_size[size] = max(rate, best_per_size.get(size, 0.0))
    line = _memory_model(search.outcomes, answer) if answer else None
    off = off_the_line(line, search.outcomes) if line is not None else None
    if off is not None:
        notes.append(off)
        line = None
    if search.contradiction is not None and answer:
        size, predicted = search.contradiction
        notes.append(f"The step ran out of memory at batch {size}, where the memory the probe counts predicted a peak "
                     f"of {format_bytes(int(predicted))} of the {format_bytes(budget.limit_bytes)} budget: something "
                     "the budget does not see limits it (another process's memory, fragmentation, a cap). The search "
                     "went on by doubling from the largest size that fitted, then bisection, and the margin is "
                     "applied to the size itself.")
    elif line is None and answer:
        notes.append("Peak memory did not grow with the batch size, so the margin is applied to the size itself.")
    if request.steps == 1:
        notes.append("--steps 1: step times include the first step (warm-up, lazy optimizer state), and a step "
                     "that keeps memory between calls cannot be told from one call.")
    return BatchProbeResult(
        max_batch_size=answer, recommended=runner.recommended if answer else 0,
        knee=throughput_knee(sorted(best_per_size.items())) if answer else None,
        trials=runner.trials, device=budget.device, accounting=budget.accounting,
        budget_bytes=budget.limit_bytes, budget_source=budget.source, margin=request.margin,
        steps=request.steps, amp=request.amp, limited_by=_limited_by(runner, ignores),
        memory_before=memory_before, memory_after=memory_after, restored=restored,
        not_restored=list(not_restored or []),
        snapshot_bytes=snapshot_bytes, seconds=seconds, memory_model=line, notes=notes,
        interrupted=runner.interrupted,
        time_limit=runner.time_limit.to_dict() if runner.time_limit is not None else None,
        baseline=[holder.to_dict() for holder in baseline[:BASELINE_HOLDERS]],
        leftovers=[{"batch_size": size, "bytes": runner.leftover_bytes[size],
                    "holders": [holder.to_dict() for holder in holders]}
                   for size, holders in runner.leftovers.items()],
        leak=None if runner.leak is None else {
            "batch_size": runner.leak.batch_size, "bytes_per_call": runner.leak.bytes_per_call,
            "holders": [holder.to_dict() for holder in runner.leak.holders]})


def _memory_model(outcomes: list[Outcome], answer: int) -> tuple[float, float] | None:
    """The line the report shows: the curve's event that peaks at the answer, else the peaks' line."""
    below = answer + 1 if answer else None
    curves = [o for o in outcomes if o.fitted and o.curve and (below is None or o.batch_size < below)]
    by_size = {o.batch_size: o for o in curves}
    if len(by_size) >= 2:
        small, large = (by_size[size] for size in sorted(by_size)[-2:])
        model = CurveModel.through(small, large)
        if model is not None:
            intercept, per_sample = model.binding_line(max(answer, large.batch_size))
            return (intercept, per_sample) if per_sample > 0 else None
    return memory_line(outcomes, below=below)


def off_the_line(line: tuple[float, float], outcomes: list[Outcome]) -> str | None:
    """Why the memory model is left out, when its line misses the smallest fitted trial's peak by more than 2x;
    None when it holds there. On the H200 a ResNet's peaks went 128 MiB at 2, 117 GiB at 22,116 and 139 GiB at
    65,536 (the GPU's libraries took more of the memory left free as the batch grew), and the line through the
    largest two read "118.0 GiB + 334.1 KiB per sample", which describes no batch a user would run."""
    fitted = sorted({o.batch_size: o.peak_bytes for o in outcomes if o.fitted and o.peak_bytes}.items())
    if len(fitted) < 3:
        return None
    size, peak = fitted[0]
    predicted = line[0] + line[1] * size
    if peak / 2 <= predicted <= 2 * peak:
        return None
    shown = ", ".join(f"{format_bytes(p)} at {s:,}" for s, p in (fitted[0], fitted[len(fitted) // 2], fitted[-1]))
    return (f"No memory model: the peaks do not grow along a line with the batch ({shown}); the sizes shown are "
            "measured, not predicted.")


def _ignores_batch_size(trials: list[Trial], search: BatchSizeSearch) -> bool:
    """The search reached --max with peak memory flat at the top of the range: the cap is no capacity."""
    return search.capped and flat_in_batch_size(_peak_points(trials))


def _peak_points(trials: list[Trial]) -> list[tuple[int, int]]:
    """(size, peak) of the fitted trials, the latest of each size, as the "ignores batch_size" rule reads them."""
    # CUDA's reserved peak moves in 2 MiB segments; its allocated peak shows growth to the 512-byte block.
    latest = {t.batch_size: t.allocated_peak_bytes or t.peak_bytes for t in trials
              if t.fitted and t.peak_bytes is not None}
    return [(size, int(peak)) for size, peak in latest.items() if peak is not None]


def _limited_by(runner: _Runner, ignores: bool) -> str:
    search = runner.search
    if runner.leak is not None:
        return "leak"
    if ignores:
        return "ignores batch_size"
    if search.answer == 0:
        return "nothing fits"
    if search.capped:
        return "--max"
    if runner.time_limit is not None:
        return "time limit"
    above = [t for t in runner.trials if not t.fitted and t.batch_size == search.answer + 1]
    if above and above[-1].failure_kind == str(FailureKind.SIZE_LIMIT):
        return "size limit"
    return "memory"
