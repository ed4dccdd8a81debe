"""Run `%%gpuprofile`: the user's cell under the hooks, stopped after the steps it needs, the training state put back,
then the measured ceiling, the breakdown, the plan and the ready-made probe steps.

The cell runs as written, in the notebook's namespace. What it changes in training state (models, optimizers,
schedulers, GradScaler, random generators, the global flags) is put back bitwise afterwards, unless `keep`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import math
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpu.gpuprofile import lift
from jupyter_gpu.gpuprofile.assemble import assemble
from jupyter_gpu.gpuprofile.cell_outcome import what_the_cell_did
from jupyter_gpu.gpuprofile.instrument import Instruments, ProfilePlan, StopProfile
from jupyter_gpu.gpuprofile.request import DEFAULT_STEPS, DEFAULT_WARMUP, ProfileRequest
from jupyter_gpu.gpuprofile.result import (
    ProfileResult,
)
from jupyter_gpu.gpuprofile.script_calls import with_script_commands
from jupyter_gpu.kernel_torch import cuda_initialized
from jupyter_gpu.probekit.cpu_contention import ContentionWatch
from jupyter_gpu.probekit.fingerprint import GLOBAL_RNG, Fingerprint, object_claims
from jupyter_gpu.probekit.saved_files import SavedFiles, saved_files_notes
from jupyter_gpu.probekit.step_variables import advanced_iterators_notes
from jupyter_gpu.probekit.ticker import Ticker
from jupyter_gpu.probekit.training_state import StateSnapshot, find_training_objects
from jupyter_gpu.running_shell import running_shell

Progress = Callable[[str], None]


class GpuProfileError(RuntimeError):
    """The profile cannot run; the message is one sentence for the user."""


@dataclass
class Profiled:
    """The result, and what the cell itself ended with: its value, or the exception to re-raise after display."""

    result: ProfileResult
    value: Any = None
    error: BaseException | None = None
    defined: list[str] = field(default_factory=list)  # names the profile defined in the namespace


APPLY_ORDER = (False, True, True, False)  # --apply: the loop without (False) and with (True) the fixes
# Each of --apply's runs profiles at least this long (up to APPLY_MOST_STEPS steps): on the 2-core CI machine one
# run of 20 MLP steps (0.22 s) against another gave 2.26x in one pair and 1.68x in the next.
APPLY_RUN_SECONDS = 1.0
APPLY_MOST_STEPS = 200
_COMPILED_MODULE_HOOKS_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks on modules"


def profile_training(fn: Callable[..., Any], *args: Any, steps: int = DEFAULT_STEPS, warmup: int = DEFAULT_WARMUP,
                     seconds: float | None = None, keep: bool = False, namespace: dict[str, Any] | None = None,
                     **kwargs: Any) -> ProfileResult:
    """Profile `fn(*args, **kwargs)`, a function that trains (e.g. one epoch), as `%gpuprofile` does, for scripts.

    The model, optimizer, scheduler and scaler are found among the arguments and in `namespace` (by default the
    function's module globals) and put back afterwards unless `keep`. The cell's error, if any, is raised after
    the profile was taken; Ctrl-C raises KeyboardInterrupt.
    """
    request = ProfileRequest(steps=None if seconds is not None else steps, warmup=warmup, seconds=seconds, keep=keep)
    where = namespace if namespace is not None else getattr(fn, "__globals__", {})
    arguments = {f"argument {i}": value for i, value in enumerate(args)} | dict(kwargs)
    # As at profile_run's end: the raised error's traceback keeps this frame, so it must not keep the arguments.
    call = [functools.partial(fn, *args, **kwargs)]
    del args, kwargs
    profiled = profile_run(lambda: call[0](), request, namespace=where, also=arguments, code=fn)
    call.clear()
    del arguments
    if profiled.error is not None:
        raise profiled.error
    # A script has no magics: the commands are the calls it makes (a notebook's kernel runs an IPython shell).
    result = profiled.result if running_shell() is not None else with_script_commands(profiled.result)
    if namespace is None and profiled.defined:
        # Its ready steps went where its training objects were looked for: the function's module.
        module = getattr(fn, "__module__", None) or "the function's module"
        place = "this script's globals" if module == "__main__" else f"module {module}"
        return dataclasses.replace(result, defined_in=place)
    if profiled.defined:
        return dataclasses.replace(result, defined_in="the namespace passed to profile_training")
    return result


def profile_run(run: Callable[[], Any], request: ProfileRequest, *, namespace: dict[str, Any],
                loop_source: lift.LoopSource | None = None, progress: Progress | None = None,
                also: dict[str, Any] | None = None, code: Any = None) -> Profiled:
    """Run `run()` (the cell, or the user's training function) under the profile. `also`: more places the training
    objects may be (a function's arguments). `code`: the function (or list of functions) whose code is the cell's,
    so the notebook variables it carries (`global_step += 1`, `logs.append(...)`) are put back with the training
    state; the names it creates and its loop variables stay."""
    try:
        import torch
    except ImportError:
        raise GpuProfileError("%%gpuprofile needs PyTorch, and torch is not installed in this kernel.") from None
    places = {**namespace, **(also or {})}  # where the training objects and the loaders may be
    objects = find_training_objects(places)
    from jupyter_gpu.speedprobe.flags import GlobalFlags

    snapshot = None if request.keep else StateSnapshot.take(objects, code, whole_run=True)
    # Checksums of the training state and the RNG: what the report says was put back (or, with --keep, changed) is
    # what compared, not what was meant (probekit/fingerprint.py).
    check = Fingerprint.take([*object_claims(objects), ("RNG", GLOBAL_RNG)], namespace=places)
    saves = None if request.keep else SavedFiles(torch)
    flags = GlobalFlags.take(torch)
    cuda_before = cuda_initialized(torch)
    if cuda_before:
        for index in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(index)
    ticker = Ticker(progress) if progress is not None else None
    instruments = Instruments(torch, ProfilePlan(warmup=request.warmup, steps=request.steps,
                                                 seconds=request.seconds),
                              on_step=(lambda text: ticker.resume(f"%%gpuprofile: {text}")) if ticker else None)
    value: Any = None
    error: BaseException | None = None
    iterators_before = _loader_iterators(torch, places)
    contention = ContentionWatch(torch)  # the loop's own DataLoader workers are its children, not other processes
    began = time.perf_counter()
    try:
        instruments.install()
        with warnings.catch_warnings():
            # Our global module hooks make torch warn at every call of a torch.compile'd model that they fire for
            # its wrapper too: they are ours, counted once (the outermost call), and traced as no-ops inside.
            warnings.filterwarnings("ignore", message=_COMPILED_MODULE_HOOKS_WARNING, category=UserWarning)
            with saves if saves is not None else contextlib.nullcontext(), contention:
                value = run()
        instruments.finish()
    except StopProfile as stop:
        # The loop's frames hold its DataLoader iterator: clearing them shuts the workers down now.
        traceback.clear_frames(stop.__traceback__)
        del stop
    except BaseException as exc:  # shown with the partial result, then re-raised by the caller
        error = exc
    finally:
        instruments.uninstall()
        _stop_new_workers(torch, places, iterators_before)
        if ticker is not None:
            ticker.stop()
            progress("")  # type: ignore[misc]
    run_seconds = time.perf_counter() - began
    gc.collect()
    gpu_phases = _gpu_phase_seconds(torch, instruments)
    peak_memory = _peak_memory(torch)
    used = find_training_objects(namespace)
    before_ids = {id(obj) for obj in objects.objects()}
    created = [used.labels.get(id(obj), type(obj).__name__) for obj in used.objects() if id(obj) not in before_ids]
    if snapshot is not None:
        snapshot.restore()
    put_back = snapshot.changed_variables if snapshot is not None else []
    flags.restore(torch)
    verdict = check.verify()
    del check  # its entries hold the model and the cell's variables: a raised cell's traceback keeps this frame
    result, defined, loaders = assemble(torch, instruments, request, namespace, used, gpu_phases, peak_memory,
                                         loop_source, error, run_seconds, cuda_before,
                                         # A cell's code (the magic's, which has its source) drives a loop the
                                         # source lifter refuses; profile_training's caller has no probes to run.
                                         cell=code if loop_source is not None and isinstance(code, list) else None)
    result.notes.insert(0, what_the_cell_did(result, instruments.stopped, instruments.completed_steps,
                                             verdict.restored, request.keep))
    if request.keep and verdict.changes:
        result.notes.append("--keep: the steps changed " + "; ".join(c.kept_line() for c in verdict.changes) + ".")
    elif not request.keep:
        result.notes.extend(f"Not put back: {line}." for line in verdict.not_restored)
    if put_back:
        result.notes.append(f"{', '.join(put_back)}: notebook variables the cell changed, put back as they were with "
                            "the training state (--keep keeps what the steps did).")
    if snapshot is not None:
        result.notes.extend(advanced_iterators_notes(snapshot.advanced_iterators, "The cell"))
    if saves is not None:
        result.notes.extend(saved_files_notes(saves, "the cell's torch.save", "; --keep keeps what the steps wrote"))
    if contention.note is not None:
        result.notes.append(f"The step times: {contention.note}.")
    if created and not request.keep:
        result.notes.append(f"{', '.join(created)}: made by the cell itself, so they keep the steps it ran (only "
                            "what existed before the cell is put back).")
    if request.apply and error is None and not request.keep:
        result = _apply(torch, run, request, namespace, loop_source, progress, result, loaders, code)
        if result.applied is not None and result.applied.interrupted:
            error = KeyboardInterrupt()  # shown with what was measured, then raised: "Run all" stops here
    profiled = Profiled(result=result, value=value, error=error, defined=defined)
    # After a cell that raised, this frame outlives the call: the cell's frames in the re-raised traceback point back
    # to it (`f_back`), and IPython keeps that traceback until the next error. So nothing of the run may be left in
    # it (the state snapshot is a copy of the model and optimizer; the instruments keep the last batch): a user who
    # deletes the model to free the GPU must free it.
    del objects, snapshot, instruments, used, places, iterators_before, value, error
    return profiled


def _apply(torch: Any, run: Callable[[], Any], request: ProfileRequest, namespace: dict[str, Any],
           loop_source: lift.LoopSource | None, progress: Progress | None, before: ProfileResult,
           loaders: list[str], code: Any) -> ProfileResult:
    """--apply: the probes choose and check the fixes, then the loop runs as it is and with them, back to back
    (APPLY_ORDER), every run from the same state. Ctrl-C during any of it applies nothing (`.interrupted`)."""
    from dataclasses import replace

    from jupyter_gpu.gpuprofile.apply import applied_run, choose_fixes
    from jupyter_gpu.gpuprofile.result import AppliedFixes, RunFigures

    fixes = choose_fixes(torch, namespace, before, loaders, compile_too=request.compile,
                         data_seconds=request.data_seconds, progress=progress)
    figures: dict[bool, list[RunFigures]] = {False: [], True: []}
    interrupted = fixes.interrupted
    if not interrupted and (fixes.options or fixes.loader):
        objects = find_training_objects(namespace)
        device = objects.device() or torch.device("cpu")
        # The loop as it is and with the fixes, back to back and twice each in the order before, after, after,
        # before, so a drift of the machine's speed (the probes just ran; a shared machine) falls on both alike:
        # the first profile, taken before the probes, is not what the fixes are measured against.
        run_request = _apply_run_request(request, before)
        for fixed in APPLY_ORDER:
            # A run puts the training state back itself; one with the fixes also needs what they change undone.
            with _put_back(torch, objects) if fixed else contextlib.nullcontext():
                measured = profile_run(applied_run(torch, namespace, fixes, objects, device, run) if fixed else run,
                                       run_request, namespace=namespace, loop_source=loop_source, progress=progress,
                                       code=code)
            if isinstance(measured.error, KeyboardInterrupt):
                interrupted = "the runs before and after"
                figures[True].clear()
                break
            if measured.error is not None:
                what = "the run with the fixes" if fixed else "the run without them"
                fixes.left_out.append((what, f"it raised {type(measured.error).__name__}: {measured.error}"))
                figures[True].clear()
                break
            figures[fixed].append(measured.result.figures())
    after = RunFigures.fastest(figures[True]) if figures[True] else None
    before_figures = RunFigures.fastest(figures[False]) if after is not None else before.figures()
    applied = AppliedFixes(applied=[] if interrupted else fixes.titles, left_out=fixes.left_out,
                           checked=fixes.checked, code=[] if interrupted else fixes.code, before=before_figures,
                           after=after, runs_each=len(figures[True]) if after else 1, interrupted=interrupted,
                           not_tried=fixes.not_tried)
    return replace(before, applied=applied)


def _apply_run_request(request: ProfileRequest, before: ProfileResult) -> ProfileRequest:
    """What each of --apply's runs profiles: the profile's own steps, or more where they took under
    APPLY_RUN_SECONDS (the loop as it is, as the first profile measured it)."""
    if request.seconds is not None:
        return dataclasses.replace(request, apply=False, keep=False, seconds=max(request.seconds, APPLY_RUN_SECONDS))
    steps = request.steps or DEFAULT_STEPS
    if before.seconds:
        steps = max(steps, min(APPLY_MOST_STEPS, math.ceil(APPLY_RUN_SECONDS / before.seconds)))
    return dataclasses.replace(request, apply=False, keep=False, steps=steps)


@contextlib.contextmanager
def _put_back(torch: Any, objects: Any) -> Iterator[None]:
    """The training objects and the global flags, bitwise as before (the layout channels_last changed, the fused
    flags)."""
    from jupyter_gpu.speedprobe.flags import GlobalFlags

    snapshot, flags = StateSnapshot.take(objects), GlobalFlags.take(torch)
    try:
        yield
    finally:
        snapshot.restore()
        flags.restore(torch)


def _loader_iterators(torch: Any, places: dict[str, Any]) -> dict[int, tuple[Any, Any]]:
    """Each DataLoader in `places` with the iterator it keeps on itself (only one with persistent workers does)."""
    loader_type = torch.utils.data.DataLoader
    return {id(value): (value, getattr(value, "_iterator", None)) for value in places.values()
            if isinstance(value, loader_type)}


def _stop_new_workers(torch: Any, places: dict[str, Any], before: dict[int, tuple[Any, Any]]) -> None:
    """Shut down the worker processes the profiled run left on a loader with `persistent_workers=True`.

    Clearing the stopped loop's frames frees an ordinary iterator, and its workers with it; a persistent loader keeps
    its iterator on itself, mid-epoch, with its workers alive. An iterator the loader had before the run is left (its
    workers were there before; the next loop resets it, as after any epoch); one the run made is shut down and the
    loader left without one, as before the run (its next loop starts new workers, as a fresh loader's does)."""
    from jupyter_gpu.dataprobe.loaders import shut_down

    for key, (loader, iterator) in _loader_iterators(torch, places).items():
        previous = before.get(key, (loader, None))[1]
        if iterator is not None and iterator is not previous:
            shut_down(iterator)
            loader._iterator = previous


def _gpu_phase_seconds(torch: Any, instruments: Instruments) -> dict[tuple[int, str], float]:
    if not instruments.gpu_events or not cuda_initialized(torch):
        return {}
    torch.cuda.synchronize()
    found: dict[tuple[int, str], float] = {}
    for step, bucket, start, end in instruments.gpu_events:
        found[(step, bucket)] = found.get((step, bucket), 0.0) + start.elapsed_time(end) / 1000.0
    return found


def _peak_memory(torch: Any) -> int | None:
    if not cuda_initialized(torch):
        return None
    return max((int(torch.cuda.max_memory_allocated(i)) for i in range(torch.cuda.device_count())), default=None)


