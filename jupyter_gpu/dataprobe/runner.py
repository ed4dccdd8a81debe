"""Run `%dataprobe`: pitfalls first, then the three measurements, the sweep, the recommendation and its check (and
the runner-up's, when the check falls behind it), all within the time budget and with the user's state put back.

Order matters for safety: one batch is loaded in the kernel's own process (num_workers=0) before any worker
starts, so the pitfalls can be judged on its real size, and a setting whose workers cannot start (a notebook
class under spawn, CUDA under fork, a small /dev/shm) is named and skipped instead of failing in a worker.
"""

from __future__ import annotations

import gc
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from jupyter_gpu.dataprobe import decide
from jupyter_gpu.dataprobe.loaders import (
    LoaderError,
    SamplerStates,
    batch_bytes,
    batch_cuda_device,
    recipe_of,
    usable_cpus,
)
from jupyter_gpu.dataprobe.measure import StepFailed, StepTarget, TrialRunner
from jupyter_gpu.dataprobe.pitfalls import Pitfalls, check_pitfalls
from jupyter_gpu.dataprobe.result import (
    CURRENT,
    LOADER,
    LOOP,
    RECHECK,
    SWEEP,
    VERIFY,
    DataProbeResult,
    StepAlone,
    Trial,
)
from jupyter_gpu.dataprobe.settings import LoaderSettings
from jupyter_gpu.kernel_torch import cuda_initialized
from jupyter_gpu.probekit.cpu_contention import ContentionWatch
from jupyter_gpu.probekit.fingerprint import GLOBAL_RNG, Fingerprint, object_claims, reach_of, sampler_of
from jupyter_gpu.probekit.saved_files import SavedFiles, probe_leftover_notes
from jupyter_gpu.probekit.schedules import restarted_note, restarting_schedules
from jupyter_gpu.probekit.step_failure import argument_mismatch, first_parameter
from jupyter_gpu.probekit.step_output import warning_notes
from jupyter_gpu.probekit.ticker import Ticker
from jupyter_gpu.probekit.training_state import StateSnapshot, TrainingObjects, find_training_objects
from jupyter_gpu.rendering.units import format_bytes, format_rate, format_seconds

DEFAULT_SECONDS = 60.0
BASELINE_WINDOWS = 3
SWEEP_WINDOWS = 2
# The check of the recommendation, and of the runner-up when the check falls behind it.
VERIFY_WINDOWS = 3
MIN_WINDOW_SECONDS = 0.05
MAX_WINDOW_SECONDS = 2.0
FIRST_OVERHEAD_GUESS = 0.2  # seconds a trial spends outside its windows (start-up, shutdown) before any is seen
# Share of the budget the windows plan for; start-up, draining and shutdown take the rest.
PLANNED_SHARE = 0.8
# When the run is this far into its budget, the next phase is left out (and the result says so).
SKIP_SECOND_STAGE_AFTER = 0.75
SKIP_RECHECK_AFTER = 0.95
SKIP_VERIFY_AFTER = 1.15
# Of the budget, what loading an IterableDataset's first batches at num_workers=0 may take: the reference its
# worker settings are checked against (the same data, not every item once per worker).
REFERENCE_SHARE = 0.05

Progress = Callable[[str], None]
DUPLICATES = "this IterableDataset yields every item once per worker (more workers only repeat it)"


class DataProbeError(RuntimeError):
    """The probe cannot run; the message is one sentence for the user."""


@dataclass(frozen=True)
class DataProbeRequest:
    workers: tuple[int, ...] | None = None  # worker counts to try; None: 0, 1, 2, 4, ... up to the usable CPUs
    seconds: float = DEFAULT_SECONDS
    # A fixed length for every timed window (benchmarks compare sweeps at equal precision); None: the windows
    # share the budget.
    window_seconds: float | None = None


def probe_loader(loader: Any, step: Callable[[Any], Any] | None = None, *, workers: Sequence[int] | None = None,
                 seconds: float = DEFAULT_SECONDS, namespace: dict[str, Any] | None = None,
                 progress: Progress | None = None) -> DataProbeResult:
    """Measure `loader` (and `step(batch)`, one training step on a batch as the loader yields it) and the
    DataLoader settings that feed the step fastest; the loader is never iterated and the state is put back.

    `namespace` is where the model and optimizer live (a script's `globals()`); the step's own globals, closure
    and bound object are searched as well. Ctrl-C stops the probe after putting everything back.
    """
    request = DataProbeRequest(tuple(workers) if workers is not None else None, seconds)
    result = run_dataprobe(loader, step, request, namespace=namespace, progress=progress)
    if result.interrupted:
        raise KeyboardInterrupt
    return result


def run_dataprobe(loader: Any, step: Callable[[Any], Any] | None, request: DataProbeRequest | None = None, *,
                  loader_name: str = "loader", step_name: str | None = None,
                  namespace: dict[str, Any] | None = None, progress: Progress | None = None,
                  context: Any = None) -> DataProbeResult:
    """`probe_loader` for the magic: on Ctrl-C what was measured comes back with `interrupted=True`."""
    try:
        import torch
    except ImportError:
        raise DataProbeError("%dataprobe needs PyTorch, and torch is not installed in this kernel.") from None
    request = request or DataProbeRequest()
    if request.seconds <= 0:
        raise DataProbeError(f"the time budget must be positive, not {request.seconds:g} s")
    try:
        recipe = recipe_of(loader)
    except LoaderError as exc:
        raise DataProbeError(f"`{loader_name}` cannot be probed: {exc}.") from None
    if step is not None and not callable(step):
        raise DataProbeError(f"the step is a {type(step).__name__}, not a function step(batch).")
    if step is not None:
        _check_step_arguments(step, step_name or getattr(step, "__name__", "step"))
    objects = find_training_objects(namespace or {}, step) if step is not None else TrainingObjects([], [], [], [])
    snapshot = StateSnapshot.take(objects, step)
    samplers = SamplerStates.take(loader, namespace)
    # Checksums of all the probe will claim to put back and all the walk reaches: the report says what compared equal.
    check = Fingerprint.take([*object_claims(objects), ("RNG", GLOBAL_RNG), ("sampler", sampler_of(loader))],
                             reach_of(step, loader, namespace), namespace)

    def restore() -> None:
        snapshot.restore()
        samplers.restore()

    target = None
    if step is not None:
        device = objects.device() or torch.device("cpu")  # no model found: the batch stays where it is loaded
        target = StepTarget(step, device, device.type == "cuda")
        if step_name is None:
            step_name = getattr(step, "__name__", type(step).__name__)
    probe = _Probe(torch, recipe, target, restore, request, progress or _silent, loader, loader_name, context,
                   step_name or "step")
    memory_before = _cuda_allocated(torch)
    restarted: list[str] = []
    caught: list[warnings.WarningMessage] = []
    saves = SavedFiles(torch)  # a step that checkpoints would overwrite the user's file, trial after trial
    contention = ContentionWatch(torch)
    try:
        # Each loader the probe builds warns as the user's did (on a CPU machine, `pin_memory=True` warned four
        # times in one probe, above its report): kept, and named once each in the notes.
        # Its own DataLoader workers are this process's children: only other processes count as sharing the CPU.
        with (restarting_schedules(objects.schedulers) as restarted, warnings.catch_warnings(record=True) as caught,
              saves, contention):
            warnings.simplefilter("always")
            probe.run()
    finally:
        probe.ticker.stop()
        restore()
        (progress or _silent)("")
        gc.collect()  # the fresh loaders and their batches go now, not at some later collection
    probe.notes += [restarted_note(name) for name in restarted]
    probe.notes += warning_notes([*caught, *(target.output.caught if target is not None else [])])
    probe.notes += probe_leftover_notes(saves, snapshot.advanced_iterators)
    if contention.note is not None:
        probe.notes.append(f"The rates: {contention.note}.")
    printed = target.output.note(step_name or "the step") if target is not None else None
    if printed is not None:
        probe.notes.append(printed)
    memory_after = _cuda_allocated(torch)
    if memory_before is not None and memory_after is not None and memory_after > memory_before:
        probe.notes.append(f"CUDA memory in use is {format_bytes(memory_after - memory_before)} above where it was "
                           "before the probe: something the step created is still referenced.")
    verdict = check.verify([*objects.names(), *snapshot.changed_variables, "RNG", "sampler",
                            *check.reached_generators()])
    return probe.result(loader_name, step_name if step is not None else None, verdict.restored,
                        verdict.not_restored)


def _cuda_allocated(torch: Any) -> int | None:
    """Bytes the CUDA allocator has handed out on every device, read only where the kernel started CUDA."""
    if not cuda_initialized(torch):
        return None
    return sum(int(torch.cuda.memory_allocated(index)) for index in range(torch.cuda.device_count()))


def _silent(_: str) -> None:
    return None


# A step whose one parameter has one of these names is %batchprobe's kind, step(batch_size): called with a batch it
# fails deep in torch ("randn() received an invalid combination of arguments").
_BATCH_SIZE_NAMES = ("batch_size", "bs")


def _check_step_arguments(step: Callable[..., Any], name: str) -> None:
    mismatch = argument_mismatch(step, name, 1, "%dataprobe calls it with one batch from the loader, step(batch)")
    first = first_parameter(step)
    if mismatch is None and first in _BATCH_SIZE_NAMES:
        mismatch = (f"`{name}` takes {first}, a batch size (the step %batchprobe takes), and %dataprobe calls it "
                    "with one batch from the loader, step(batch)")
    if mismatch is not None:
        raise DataProbeError(f"{mismatch}; write def step(batch): ... that trains on the batch it is given.")


class _Probe:
    """The phases of one probe and what they measured."""

    def __init__(self, torch: Any, recipe: Any, target: StepTarget | None, restore: Callable[[], None],
                 request: DataProbeRequest, progress: Progress, loader: Any, loader_name: str,
                 context: Any, step_name: str = "step") -> None:
        self.step_name = step_name
        self.recipe = recipe
        self.target = target
        self.request = request
        self.progress = progress
        self.loader = loader
        self.loader_name = loader_name
        self.context = context
        self.runner = TrialRunner(torch, recipe, target, restore)
        self.ticker = Ticker(lambda text: progress(text + self._clock()))
        self.started = time.perf_counter()
        self.cpus = usable_cpus()
        self.mode = LOOP if target is not None else LOADER
        self.gpu = target is not None and target.cuda
        self.trials: list[Trial] = []
        self.loader_alone: Trial | None = None
        self.step_alone: StepAlone | None = None
        self.together: Trial | None = None
        self.pitfalls: Pitfalls | None = None
        self.skipped: list[str] = []
        self.notes: list[str] = []
        self.interrupted = False
        self.recommendation: tuple[LoaderSettings, float, float] | None = None
        self.verified: float | None = None
        self.current = recipe.current
        self.windows_left = 0
        self.measured_batch_bytes: int | None = None
        self.baseline_settings = recipe.current

    # -- budget ----------------------------------------------------------------------------------------------

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def _window_seconds(self, trials_left: int) -> float:
        """Share what is left of the budget among the windows still planned, after each trial's overhead."""
        if self.request.window_seconds is not None:
            return self.request.window_seconds
        done = [trial for trial in self.trials if trial.rates]
        overhead = FIRST_OVERHEAD_GUESS
        if done:
            overhead = sum(trial.seconds - trial.timed_seconds for trial in done) / len(done)
        left = self.request.seconds * PLANNED_SHARE - self.elapsed - overhead * trials_left
        share = left / max(1, self.windows_left)
        return min(MAX_WINDOW_SECONDS, max(MIN_WINDOW_SECONDS, share))

    # -- phases ----------------------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._run()
        except KeyboardInterrupt:
            self.interrupted = True
        except StepFailed as exc:
            raise DataProbeError(f"the step raised {exc} (everything it changed was put back); make "
                                 "step(batch) run on one batch from the loader, then probe again.") from None

    def _run(self) -> None:
        sample, first = self._prepare()
        self.loader_alone = self._trial(self.baseline_settings, CURRENT, LOADER, BASELINE_WINDOWS,
                                        "loader alone at your settings")
        if self.loader_alone.error is not None:
            raise DataProbeError(f"`{self.loader_name}` fails at its own settings ({self.baseline_settings.label()})"
                                 f": {self.loader_alone.error}")
        if self.target is not None:
            self._step_and_loop(*sample)
            del sample
            # A setting whose workers duplicate the data is not kept, however well it keeps up: sweep instead.
            if self._verdict() == "compute-bound" and not self._current_duplicates():
                # %speedprobe takes a step with its own batch: the note writes it from the user's own names.
                self.notes.append("The step is the bottleneck, not the loader: the sweep was not run. Time the "
                                  "step with %%gputime to see where its time goes, and measure what AMP, TF32, "
                                  "channels_last, fused optimizers and torch.compile buy on it with %speedprobe, "
                                  f"on a step with its own batch: batch = next(iter({self.loader_name})); "
                                  f"def whole_step(): return {self.step_name}(batch); then %speedprobe whole_step.")
                rate = self.together.samples_per_second if self.together is not None else None
                if rate is not None:  # keep what you have: it is what was measured keeping up
                    self.recommendation = (self.baseline_settings, rate, rate)
                return
        else:
            del sample
        self._sweep(first)

    def _current_duplicates(self) -> bool:
        return any(trial.duplicates for trial in (self.loader_alone, self.together) if trial is not None)

    def _prepare(self) -> tuple[tuple[Any, int], list[LoaderSettings]]:
        """One batch loaded in the kernel's process, the sweep planned, and the pitfalls judged on both, before
        any worker starts."""
        self.progress(f"dataprobe: loading one batch in the kernel's process (no workers yet){self._clock()}")
        try:
            sample = self.runner.sample_batch(LoaderSettings(0), REFERENCE_SHARE * self.request.seconds)
        except Exception as exc:
            raise DataProbeError(f"`{self.loader_name}` fails to load a batch in the kernel's own process: "
                                 f"{type(exc).__name__}: {exc}") from None
        counts = self.request.workers or tuple(decide.worker_counts(self.cpus, self.current.num_workers))
        over = [count for count in counts if count > self.cpus]
        if over:
            self.notes.append(f"{', '.join(map(str, over))} workers is more than the {self.cpus} CPUs this process "
                              "may use: they compete with the training step for the same cores.")
        first = decide.first_stage(counts, pin_memory=self.gpu)
        planned = [*first, self.current,
                   *decide.second_stage([max(first, key=lambda s: s.num_workers)], gpu=self.gpu)]
        self.measured_batch_bytes = batch_bytes(sample[0])
        self.pitfalls = check_pitfalls(self.loader, self.loader_name, planned, ctx=self.context,
                                       batch_bytes=self.measured_batch_bytes, batch_cuda=batch_cuda_device(sample[0]))
        current = self._runnable(self.current, self.measured_batch_bytes)
        if current is None:
            self.notes.append(f"Your setting ({self.current.label()}) cannot start its workers (see the pitfalls "
                              "above): the current figures are for num_workers=0.")
            current = LoaderSettings(0, pin_memory=self.current.pin_memory)
        self.baseline_settings = current
        self.windows_left = (BASELINE_WINDOWS * (3 if self.target else 1) + SWEEP_WINDOWS * (len(first) + 2)
                             + VERIFY_WINDOWS)
        return sample, first

    def _step_and_loop(self, batch: Any, samples: int) -> None:
        """The step alone on the cached batch, then the loop at the user's settings."""
        text = "dataprobe: the step alone on one cached batch"
        self.progress(text + self._clock())
        self.ticker.resume(text)
        try:
            self.step_alone = self.runner.step_alone(batch, samples, windows=BASELINE_WINDOWS,
                                                     window_seconds=self._window_seconds(1))
        finally:
            self.ticker.pause()
        self.windows_left -= BASELINE_WINDOWS
        self.together = self._trial(self.baseline_settings, CURRENT, LOOP, BASELINE_WINDOWS,
                                    "loader and step together")
        if self.together.error is not None:
            raise DataProbeError(f"`{self.loader_name}` fails in the loop at its own settings: "
                                 f"{self.together.error}")

    def _sweep(self, first: list[LoaderSettings]) -> None:
        ceiling = self.step_alone.samples_per_second if self.step_alone is not None else None
        measured = self._sweep_workers(first, ceiling)
        self._second_stage(ceiling, plateau=decide.more_in_flight_did_not_pay(measured))
        self._note_cpu_step()
        self._recommend_and_check()

    def _sweep_workers(self, first: list[LoaderSettings],
                       ceiling: float | None) -> list[tuple[int, float, float | None]]:
        """The worker counts: from the count the loading calls for (the fewest whose workers could load as fast as
        the step runs), down while a smaller count could still reach the best rate measured, then up while doubling
        pays off. Without the loader-alone rate of one process (the user's loader has workers, an IterableDataset,
        no step) the sweep starts at the fewest. (count, samples/s, wait) of each count measured, fewest first."""
        by_count = {settings.num_workers: settings for settings in first}
        counts = sorted(by_count)
        one_process = self._one_process_rate()
        called_for = decide.workers_called_for(counts, one_process, ceiling) if one_process else None
        start = counts.index(called_for) if called_for is not None else 0
        results: dict[int, tuple[float, float | None]] = {}
        tried: set[int] = set()
        for index in range(start, -1, -1):
            count = counts[index]
            best = max((rate for rate, _ in results.values()), default=None)
            # The user's own setting was measured already (the baseline); any other is left out, down to 0 workers
            # (a loop that loads in its own process reaches one process's rate at most), once it cannot reach `best`.
            if index < start and by_count[count] != self.baseline_settings and one_process and best is not None \
                    and decide.cannot_reach(max(count, 1), one_process, best):
                self._skip_counts([settings for settings in first[:index + 1] if settings != self.baseline_settings],
                                  self._beyond_reach(count, one_process, best, results))
                break
            tried.add(count)
            self._measure_count(by_count[count], results)
        while True:
            measured = [(count, rate, wait) for count, (rate, wait) in sorted(results.items())]
            higher = [settings for settings in first if settings.num_workers > max(tried)]
            if not higher:
                return measured
            reason = decide.stop_adding_workers(measured, ceiling)
            if reason is not None:
                self._skip_counts(higher, reason)
                return measured
            tried.add(higher[0].num_workers)
            duplicated = self._measure_count(higher[0], results)
            if duplicated is not None:
                self._skip_counts(higher[1:], duplicated)
                return [(count, rate, wait) for count, (rate, wait) in sorted(results.items())]

    def _measure_count(self, settings: LoaderSettings, results: dict[int, tuple[float, float | None]]) -> str | None:
        """One worker count in the loop (the user's own setting is its baseline trial): its rate and wait go in
        `results`; why the sweep must stop when its workers each yielded the whole stream."""
        trial = self._current_trial() if settings == self.baseline_settings else None
        if trial is None:
            trial = self._maybe_trial(settings, SWEEP, SWEEP_WINDOWS)
        if trial is None:
            return None
        if trial.duplicates:
            return f"{settings.num_workers} workers yielded every batch {trial.repeats:.1f} times: {DUPLICATES}"
        if trial.samples_per_second is not None:
            results[settings.num_workers] = (trial.samples_per_second, trial.wait_fraction)
        return None

    def _skip_counts(self, untried: list[LoaderSettings], reason: str) -> None:
        """Name the counts the sweep leaves out, and give their windows back to the budget. Your own setting was
        measured already (at your settings): it is not among those not tried (by what the report calls it: a sweep
        setting may differ from yours in what it does not show)."""
        self.windows_left = max(0, self.windows_left - SWEEP_WINDOWS * len(untried))
        untried = [later for later in untried if later.label() != self.baseline_settings.label()]
        if not untried:
            return
        counts = ", ".join(str(later.num_workers) for later in untried)
        plural = "s" if len(untried) > 1 or untried[0].num_workers != 1 else ""
        self.skipped.append(f"{counts} worker{plural}: {reason}")

    def _one_process_rate(self) -> float | None:
        """samples/s of the loader alone in the kernel's own process (the user's loader has no workers): what each
        worker can load at most. None where it is not known, or for an IterableDataset (workers that do not split
        the stream deliver more than they load)."""
        alone = self.loader_alone
        if self.target is None or self.recipe.iterable or alone is None or alone.settings.num_workers != 0:
            return None
        return alone.samples_per_second

    @staticmethod
    def _beyond_reach(count: int, one_process: float, best: float,
                      results: dict[int, tuple[float, float | None]]) -> str:
        leader = max(results, key=lambda each: results[each][0])
        bound = format_rate(max(count, 1) * one_process * decide.WORKER_BOUND_MARGIN)
        who = f"{count} worker{'s' if count != 1 else ''}" if count else "the main process alone"
        return (f"each worker loads at most what one process loads alone ({format_rate(one_process)} samples/s): "
                f"{who}, with half again to spare, {bound} samples/s, under the {format_rate(best)} that {leader} "
                f"worker{'s' if leader != 1 else ''} measured in the loop")

    def _recommend_and_check(self) -> None:
        """The recommendation from the sweep, then its check on a fresh loader: the verified throughput. When the
        check falls under 90% of what another setting showed in the sweep, that one is measured again too, and the
        better of the two checks is recommended."""
        swept = [trial for trial in self._mode_trials() if trial.stage != VERIFY]
        choice = decide.recommend(swept)
        ranked = decide.ranking(swept)
        if choice is None or not ranked:
            self.notes.append("No setting could be measured: nothing to recommend.")
            return
        self.recommendation = (choice[0], choice[1], ranked[0][1])
        if self.elapsed > SKIP_VERIFY_AFTER * self.request.seconds:
            self.notes.append("The recommendation was not checked by running it again: the time budget ran out.")
            return
        check = self._trial(choice[0], VERIFY, self.mode, VERIFY_WINDOWS, "checking the recommendation")
        self.verified = check.samples_per_second
        rival = next(((settings, rate) for settings, rate in ranked if settings != choice[0]), None)
        if rival is None or not decide.fell_behind(self.verified, rival[1]):
            return
        said = (f"{choice[0].label()} measured {format_rate(self.verified or 0)} samples/s when checked, under 90% of "
                f"the {format_rate(rival[1])} samples/s {rival[0].label()} showed in the sweep")
        if self.elapsed > SKIP_RECHECK_AFTER * self.request.seconds:
            self.notes.append(f"{said}; {rival[0].label()} was not measured again: the time budget ran out.")
            return
        again = self._maybe_trial(rival[0], RECHECK, VERIFY_WINDOWS)
        if again is None or again.samples_per_second is None:
            return
        if again.samples_per_second <= (self.verified or 0):
            self.notes.append(f"{said}; measured again, {rival[0].label()} gave "
                              f"{format_rate(again.samples_per_second)}: the recommendation stands.")
            return
        self.notes.append(f"{said}; measured again, {rival[0].label()} gave {format_rate(again.samples_per_second)}: "
                          "it is recommended instead.")
        swept = [trial for trial in self._mode_trials() if trial.stage != VERIFY]
        pooled = dict(decide.ranking(swept))
        self.recommendation = (rival[0], pooled[rival[0]], max(pooled.values()))
        self.verified = again.samples_per_second

    def _second_stage(self, ceiling: float | None, plateau: bool = False) -> None:
        """Variants around the best worker count: a deeper prefetch queue, workers restarted every epoch, and on a
        GPU pinning toggled, each only where it could show. When the loader already keeps up only pinning is left
        (on a GPU it shortens the step's own copies, which the wait does not show); a deeper queue is left out when
        doubling the workers stopped paying off (`plateau`) or every batch loads in about the same time; restarted
        workers when no epoch ended within a trial."""
        if self.elapsed > SKIP_SECOND_STAGE_AFTER * self.request.seconds:
            self.skipped.append("deeper prefetch, non-persistent workers and pinning: the time budget was mostly "
                                "spent (raise --seconds)")
            return
        ranked = decide.ranking(self._mode_trials())
        if not ranked:
            return
        best, rate = ranked[0]
        # Around the best count only: prefetch and persistence matter little next to the worker count, and the
        # runner-up's own variants would rarely beat the best's.
        second = decide.second_stage([best], gpu=self.gpu)
        wait = decide.pooled_wait(self._mode_trials()).get(best)
        if decide.at_ceiling(rate, ceiling) or (best.num_workers and decide.keeps_up(wait)):
            self.skipped.append("deeper prefetch and non-persistent workers: the loader already keeps up with the "
                                "step")
            second = [variant for variant in second if variant.pin_memory != best.pin_memory]
        elif best.num_workers:
            deeper = [variant for variant in second if variant.prefetch_factor != best.prefetch_factor]
            restarted = [variant for variant in second if variant.persistent_workers != best.persistent_workers]
            variation = self._load_variation()
            if deeper and plateau:
                self.skipped.append("deeper prefetch: doubling the workers (twice the batches in flight) bought under "
                                    "5%, so a deeper queue cannot")
                second = [variant for variant in second if variant not in deeper]
            elif deeper and not decide.deeper_queue_can_pay(variation):
                self.skipped.append(f"deeper prefetch: in one process every batch loaded in about the same time "
                                    f"(they vary {variation:.1%} over both measurements, the slowest one set aside "
                                    "as a one-off), so the workers finish in turn and the default "
                                    "queue never runs dry for one slow batch")
                second = [variant for variant in second if variant not in deeper]
            epochs = max((trial.epochs for trial in self._mode_trials() if trial.settings == best), default=1)
            if restarted and not decide.restarts_show(epochs):
                self.skipped.append(f"{'non-persistent' if best.persistent_workers else 'persistent'} workers: no "
                                    "epoch ended within a trial, so workers restarted at an epoch's end cannot show "
                                    "here (they cost their start-up once an epoch: persistent_workers=True saves it)")
                second = [variant for variant in second if variant not in restarted]
        # A variant of the user's setting can be a setting the first stage already measured (its persistent one):
        # measured again, it showed as a second row with the same label and other numbers, and took the budget.
        measured = {trial.settings for trial in self._mode_trials()}
        second = [variant for variant in second if variant not in measured]
        self.windows_left += SWEEP_WINDOWS * len(second)
        for settings in second:
            self._maybe_trial(settings, SWEEP, SWEEP_WINDOWS)

    def _load_variation(self) -> float | None:
        """How much the batches' load times varied in one process, over both baselines at num_workers=0 together
        (decide.recurring_load_variation), or None. Not the larger of the two: on CI's loaded host one batch held up
        in either baseline (15-18 batches each) made a steady loader read as uneven."""
        loads = [load for trial in (self.loader_alone, self.together) if trial is not None for load in trial.loads]
        return decide.recurring_load_variation(loads)

    def _current_trial(self) -> Trial | None:
        """The baseline trial of the user's setting in the sweep's mode: it is that setting's sweep measurement."""
        return self.together if self.target is not None else self.loader_alone

    def _note_cpu_step(self) -> None:
        """A step on the CPU shares the cores with the workers: say so when workers did not pay off."""
        if self.target is None or self.target.device.type != "cpu":
            return
        ranked = decide.ranking(self._mode_trials())
        if ranked and ranked[0][0].num_workers <= 1:
            self.notes.append(f"The step runs on the CPU, so loader workers take cores from it ({self.cpus} usable "
                              "here): with the step on a GPU they would not compete, and more workers may pay off.")

    def _maybe_trial(self, settings: LoaderSettings, stage: str, windows: int) -> Trial | None:
        runnable = self._runnable(settings, self.measured_batch_bytes)
        if runnable is None:
            self.windows_left -= windows
            return None
        return self._trial(settings, stage, self.mode, windows, stage)

    def _runnable(self, settings: LoaderSettings, measured_bytes: int | None) -> LoaderSettings | None:
        """The setting, or None (and why, in `skipped`) when its workers cannot start here."""
        pitfalls = self.pitfalls
        if pitfalls is None or settings.num_workers == 0:
            return settings
        if pitfalls.workers_blocked is not None:
            self._skip(f"{settings.label()}: {pitfalls.workers_blocked}")
            return None
        if not pitfalls.fits_shm(settings, measured_bytes):
            self._skip(f"{settings.label()}: its batches in flight do not fit /dev/shm (a worker would die with "
                       "a bus error)")
            return None
        return settings

    def _skip(self, text: str) -> None:
        if text not in self.skipped:
            self.skipped.append(text)

    def _trial(self, settings: LoaderSettings, stage: str, mode: str, windows: int, what: str) -> Trial:
        index = len(self.trials) + 1
        text = f"dataprobe: {what} · {settings.label()} · trial {index}"
        self.progress(text + self._clock())
        self.ticker.resume(text)
        try:
            trial = self.runner.trial(settings, stage=stage, mode=mode, windows=windows,
                                      window_seconds=self._window_seconds(1))
        finally:
            self.ticker.pause()
        self.windows_left = max(0, self.windows_left - windows)
        self.trials.append(trial)
        return trial

    def _iterable_notes(self) -> list[str]:
        """What the check of an IterableDataset's workers found, where the trials do not say it already."""
        if not self.recipe.iterable or any(trial.duplicates for trial in self.trials):
            return []  # duplicates: the report says so, with the fix, next to the recommendation
        checked = sorted({trial.settings.num_workers for trial in self.trials
                          if trial.repeats is not None and trial.settings.num_workers >= 2})
        if checked:
            return [f"Checked for an IterableDataset: with {', '.join(map(str, checked))} workers no batch came "
                    "more often than with num_workers=0 (the workers do not each yield the whole stream, or they "
                    "randomise every part of it)."]
        return ["An IterableDataset yields its items once per worker unless it splits them with "
                "torch.utils.data.get_worker_info(); no setting with two or more workers could be checked for that "
                "here (none ran, or its batches are alike at num_workers=0), so its samples/s count every batch "
                "the workers yielded."]

    def _clock(self) -> str:
        return f" · {format_seconds(self.elapsed)} of {format_seconds(self.request.seconds)}"

    def _mode_trials(self) -> list[Trial]:
        return decide.of_mode(self.trials, self.mode)

    # -- result ----------------------------------------------------------------------------------------------

    def _verdict(self) -> str | None:
        fraction = self._wait_fraction()
        return decide.verdict(fraction) if fraction is not None else None

    def _wait_fraction(self) -> float | None:
        together = self.together
        if together is None:
            return None
        # On CUDA the GPU's own idle time is the stall; the host can wait while the GPU still has queued work.
        if together.gpu_idle_fraction is not None:
            return together.gpu_idle_fraction
        return together.wait_fraction

    def result(self, loader_name: str, step_name: str | None, restored: list[str],
               not_restored: list[str]) -> DataProbeResult:
        current_trial = self.together if self.target is not None else self.loader_alone
        current_rate = current_trial.samples_per_second if current_trial is not None else None
        settings = rate = best = None
        if self.recommendation is not None:
            settings, rate, best = self.recommendation
        # A current setting whose workers duplicate the data counts each batch once per worker: no baseline.
        duplicated = current_trial is not None and current_trial.duplicates
        speedup = self.verified / current_rate if self.verified and current_rate and not duplicated else None
        step_rate = self.step_alone.samples_per_second if self.step_alone is not None else None
        together_rate = self.together.samples_per_second if self.together is not None else None
        return DataProbeResult(
            loader_name=loader_name, step_name=step_name,
            device=str(self.target.device) if self.target is not None else "cpu",
            current=self.current, batch_size=self.recipe.batch_size, dataset_len=self.recipe.dataset_len,
            cpus=self.cpus, loader_alone=self.loader_alone, step_alone=self.step_alone, together=self.together,
            verdict=self._verdict(), wait_fraction=self._wait_fraction(),
            perfect_loader_speedup=decide.perfect_loader_speedup(step_rate, together_rate),
            trials=list(self.trials), recommended=settings.kwargs() if settings is not None else None,
            recommended_settings=settings, predicted=rate, verified=self.verified, best=best, speedup=speedup,
            pitfalls=list(self.pitfalls.findings) if self.pitfalls is not None else [],
            skipped=list(self.skipped), notes=[*self._iterable_notes(), *self.notes], restored=restored,
            not_restored=not_restored,
            budget_seconds=self.request.seconds, seconds=self.elapsed, interrupted=self.interrupted)

