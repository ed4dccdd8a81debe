"""Timing one loader setting: the loader alone or the training loop, in windows, on a fresh DataLoader.

A window pulls batches until it has run for the window's seconds (and at least MIN_BATCHES), so a slow loader
gets fewer batches rather than more time. Epochs that end inside a window start again inside it, as they would in
training: the start-up of non-persistent workers then counts, which is what `persistent_workers` saves. The
batches the workers prefetched while starting are drained before the first window: they would make the first
window look faster than the steady state.

Samples are counted by the items each batch was collated from (`loaders.CountingCollate`). For an IterableDataset
the first epoch's first batches are fingerprinted (`repeats`), so that a setting whose workers each yield the
whole stream is told apart from one that splits it; the hashing time is taken out of the windows.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpu.dataprobe import repeats
from jupyter_gpu.dataprobe.loaders import (
    LoaderRecipe,
    batch_samples,
    quiet_worker_count,
    shut_down,
    to_device,
    worker_memory,
    worker_pids,
)
from jupyter_gpu.dataprobe.result import LOOP, StepAlone, Trial
from jupyter_gpu.dataprobe.settings import LoaderSettings
from jupyter_gpu.probekit.clock import DeviceClock, record_event, step_device_index
from jupyter_gpu.probekit.step_failure import raised_sentence
from jupyter_gpu.probekit.step_output import StepOutput

MIN_BATCHES = 2  # a rate needs two batches; one may carry the epoch's start
MIN_STEPS = 3


class StepFailed(RuntimeError):
    """The user's step raised; the original exception is the cause."""


class EmptyEpoch(ValueError):
    """A fresh epoch yielded no batch (an empty dataset, or drop_last with fewer samples than a batch)."""


class _Batches:
    """Batches from one fresh loader, each with its count of samples, starting a new epoch when one ends.

    With `fingerprint`, the first FINGERPRINT_BATCHES batches of the first epoch are fingerprinted; the seconds
    that takes are kept in `fingerprint_seconds`, so the windows can leave them out."""

    def __init__(self, loader: Any, *, fingerprint: bool = False) -> None:
        self._loader = loader
        self._iterator: Any = None
        self._yielded = 0  # batches from the current epoch
        self.epochs = 0  # epochs started
        self.pids: list[int] = []
        self.fingerprints: list[repeats.Fingerprint] | None = [] if fingerprint else None
        self.fingerprint_seconds = 0.0

    def next(self) -> tuple[Any, int]:
        while True:
            if self._iterator is None:
                with quiet_worker_count():
                    self._iterator = iter(self._loader)
                self._yielded = 0
                self.epochs += 1
                self.pids = worker_pids(self._iterator) or self.pids
            try:
                items, batch = next(self._iterator)  # CountingCollate's (items, batch)
            except StopIteration:
                if self._yielded == 0:
                    raise EmptyEpoch("an epoch of this loader yields no batch") from None
                if not getattr(self._loader, "persistent_workers", False):
                    shut_down(self._iterator)  # what DataLoader does at an epoch's end, done now, not at gc
                self._iterator = None
                continue
            self._yielded += 1
            self._fingerprint(batch)
            return batch, batch_samples(batch, items)

    def _fingerprint(self, batch: Any) -> None:
        found = self.fingerprints
        if found is None or self.epochs > 1 or len(found) >= repeats.FINGERPRINT_BATCHES:
            return
        began = time.perf_counter()
        found.append(repeats.fingerprint(batch))
        self.fingerprint_seconds += time.perf_counter() - began

    def close(self) -> None:
        if self._iterator is not None:
            shut_down(self._iterator)
            self._iterator = None
        persistent = getattr(self._loader, "_iterator", None)
        if persistent is not None:  # persistent workers live on the loader between epochs
            shut_down(persistent)
            self._loader._iterator = None


@dataclass
class StepTarget:
    """The user's step and the device its model is on (where a cached batch goes)."""

    step: Callable[[Any], Any]
    device: Any  # torch.device
    cuda: bool
    output: StepOutput = field(default_factory=StepOutput)  # what the step printed, kept out of the notebook

    def run(self, batch: Any) -> None:
        try:
            with self.output.hidden():
                self.step(batch)  # the returned loss is dropped at once: it would keep the autograd graph alive
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            import torch  # imported already: the step is the user's torch code

            raise StepFailed(raised_sentence(torch, exc)) from exc


class TrialRunner:
    """Measures settings on fresh loaders built from the user's; `restore()` runs after every trial that stepped."""

    def __init__(self, torch: Any, recipe: LoaderRecipe, target: StepTarget | None,
                 restore: Callable[[], None]) -> None:
        self._torch = torch
        self._recipe = recipe
        self._target = target
        self._restore = restore
        self._clock = DeviceClock(torch)
        # The first batches of an IterableDataset's epoch at num_workers=0: what every worker setting must match.
        self._reference: list[repeats.Fingerprint] = []

    def trial(self, settings: LoaderSettings, *, stage: str, mode: str, windows: int,
              window_seconds: float) -> Trial:
        began = time.perf_counter()
        loop = mode == LOOP and self._target is not None
        batches = _Batches(self._recipe.build(settings), fingerprint=self._recipe.iterable)
        rates: list[float] = []
        waited_total = timed_total = 0.0
        idle_total = gpu_total = 0.0
        timed = 0
        loads: list[float] | None = [] if settings.num_workers == 0 else None
        first_seconds: float | None = None
        memory = None
        error: str | None = None
        try:
            start = time.perf_counter()
            batches.next()
            first_seconds = time.perf_counter() - start
            self._drain(batches, settings, window_seconds, loop)
            for _ in range(windows):
                samples, count, elapsed, waited, idle, gpu = self._window(batches, settings, window_seconds, loop,
                                                                          loads)
                rates.append(samples / elapsed)
                timed += count
                waited_total += waited
                timed_total += elapsed
                if idle is not None and gpu:
                    idle_total += idle
                    gpu_total += gpu
            memory = worker_memory(batches.pids)
        except (KeyboardInterrupt, StepFailed):
            raise
        except Exception as exc:  # a worker that died, a dataset that raised: this setting failed, say why
            error = _one_line(exc)
        finally:
            batches.close()
            if loop:
                self._restore()
        return Trial(settings=settings, stage=stage, mode=mode, rates=rates, first_batch_seconds=first_seconds,
                     wait_fraction=waited_total / timed_total if loop and timed_total else None,
                     gpu_idle_fraction=idle_total / gpu_total if gpu_total else None, worker_memory=memory,
                     batches=timed, seconds=time.perf_counter() - began, timed_seconds=timed_total,
                     error=error, repeats=self._judge(settings, batches.fingerprints), epochs=batches.epochs,
                     loads=tuple(loads or ()))

    def _judge(self, settings: LoaderSettings, fingerprints: list[repeats.Fingerprint] | None) -> float | None:
        """How many times each batch came against num_workers=0; at 0 workers the batches extend the reference."""
        if fingerprints is None:
            return None
        if settings.num_workers == 0:
            if len(fingerprints) > len(self._reference):
                self._reference = fingerprints
            return None
        return repeats.repeats(self._reference, fingerprints)

    def _drain(self, batches: _Batches, settings: LoaderSettings, seconds: float, loop: bool) -> None:
        """Pull the batches the workers queued while starting, for at most one window's time; in the loop they
        go through the step, so the first timed window starts from the loop's steady state."""
        queued = max(1, settings.num_workers * (settings.prefetch_factor or 0))
        deadline = time.perf_counter() + seconds
        for _ in range(queued):
            if time.perf_counter() > deadline:
                return
            batch, _ = batches.next()
            if loop and self._target is not None:
                self._target.run(batch)
            del batch

    def _window(self, batches: _Batches, settings: LoaderSettings, seconds: float, loop: bool,
                loads: list[float] | None = None) -> tuple[int, int, float, float, float | None, float | None]:
        """(samples, batches, seconds, seconds blocked in next(), GPU idle seconds, GPU seconds) of one window;
        each batch's seconds in next() go on `loads` when given."""
        target = self._target
        events: list[tuple[Any, Any]] = []
        cuda = loop and target is not None and target.cuda
        move = loop and target is not None and settings.pin_memory and target.cuda
        samples = count = 0
        waited = 0.0
        # More batches than the workers can hold ready: a window of queued batches alone would time only the
        # handover, not the loading (a busy host once measured one worker at 938 samples/s that loads 125).
        least = max(MIN_BATCHES, settings.num_workers * (settings.prefetch_factor or 0) + 2)
        # The step's events go on its model's device, whichever device the step leaves current.
        index = step_device_index(self._torch, target.device) if cuda and target is not None else None
        if loop:
            self._clock.synchronize()
        hashing = batches.fingerprint_seconds
        start = time.perf_counter()
        while True:
            before, hashed = time.perf_counter(), batches.fingerprint_seconds
            batch, held = batches.next()
            waited += time.perf_counter() - before
            if loads is not None:
                loads.append(time.perf_counter() - before - (batches.fingerprint_seconds - hashed))
            samples += held
            count += 1
            if loop and target is not None:
                if move:  # pinned host memory: the copy overlaps the previous step's GPU work
                    batch = to_device(batch, target.device, non_blocking=True)
                ready = record_event(self._torch, index) if index is not None else None
                target.run(batch)
                if index is not None:
                    events.append((ready, record_event(self._torch, index)))
            del batch
            if count >= least and time.perf_counter() - start >= seconds:
                break
        if loop:
            self._clock.synchronize()
        hashing = batches.fingerprint_seconds - hashing  # spent in next(): neither loading nor waiting for it
        elapsed = time.perf_counter() - start - hashing
        idle, gpu = _gpu_idle(events)
        return samples, count, elapsed, max(0.0, waited - hashing), idle, gpu

    def step_alone(self, batch: Any, samples: int, *, windows: int, window_seconds: float) -> StepAlone:
        """The step on one batch (of `samples` samples) already on its device, repeated: what a loader that costs
        nothing would give."""
        target = self._target
        assert target is not None
        cached = [to_device(batch, target.device)]  # a list, so the finally below can drop the only reference
        rates: list[float] = []
        per_step: list[float] = []
        try:
            wall, _ = self._clock.time(lambda: _repeat(target, cached[0], 1))  # first-call costs apart
            steps = max(MIN_STEPS, int(window_seconds / max(wall, 1e-6)))
            for _ in range(windows):
                wall, _ = self._clock.time(lambda count=steps: _repeat(target, cached[0], count))
                rates.append(samples * steps / wall)
                per_step.append(wall / steps)
                steps = max(MIN_STEPS, int(window_seconds / max(wall / steps, 1e-6)))
        finally:
            cached.clear()
            self._restore()
        return StepAlone(rates=rates, step_seconds=sorted(per_step)[len(per_step) // 2], device=str(target.device))

    def sample_batch(self, settings: LoaderSettings, reference_seconds: float = 0.0) -> tuple[Any, int]:
        """One batch from a fresh loader with the given settings, and its count of samples (for the step-alone
        measurement). For an IterableDataset at num_workers=0, up to REFERENCE_BATCHES of the epoch's first
        batches are loaded within `reference_seconds` and kept as the reference the worker settings must match."""
        batches = _Batches(self._recipe.build(settings), fingerprint=self._recipe.iterable)
        try:
            first = batches.next()
            deadline = time.perf_counter() + reference_seconds
            found = batches.fingerprints
            while (found is not None and settings.num_workers == 0 and batches.epochs == 1
                   and len(found) < repeats.REFERENCE_BATCHES and time.perf_counter() < deadline):
                batches.next()
            self._judge(settings, found)
            return first
        finally:
            batches.close()


def _repeat(target: StepTarget, batch: Any, count: int) -> None:
    for _ in range(count):
        target.run(batch)


def _gpu_idle(events: list[tuple[Any, Any]]) -> tuple[float | None, float | None]:
    """GPU seconds idle between one step's end and the next step's start, and the GPU seconds spanned."""
    if len(events) < 2:
        return None, None
    idle = sum(max(0.0, done.elapsed_time(ready)) for (_, done), (ready, _) in itertools.pairwise(events))
    span = events[0][0].elapsed_time(events[-1][1])
    return idle / 1000.0, span / 1000.0


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    if lines[0].startswith("Caught ") and len(lines) > 1:
        # torch re-raises a worker's error as "Caught X in DataLoader worker process N." with the worker's
        # traceback below it: the last line is the user's actual error.
        return f"{lines[0]} {lines[-1]}"
    return f"{type(exc).__name__}: {lines[0]}"
