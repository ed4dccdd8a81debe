"""`--apply`: the plan, measured. The fixes that need no edit of the user's code are chosen and checked by the probes
that own them, then the loop runs again with them and the profile shows before and after side by side.

- **Which fixes, and whether their numbers agree**: `%speedprobe`'s engine on the lifted `profile_train_step`
  (bf16 autocast, TF32, channels_last, fused optimizers; `torch.compile` only when asked). Each option's first update
  is compared with the step as it is, as `%speedprobe` checks it; the combination it recommends (the options that
  helped and agreed) is applied. An option that disagrees is left out and named with why.
- **The input pipeline**: `%dataprobe`'s engine on the loader the loop iterated and `profile_step`, when waiting for
  data costs 5% of the step or more; its recommended DataLoader settings replace the loader for the second run (the
  notebook's variable gets its own loader back afterwards).
- **Then the loop again**, under the same profile, from the same state (the model, optimizer, schedulers and RNGs
  are put back before it, so it sees the same batches) with those fixes applied; everything is undone afterwards.

Fixes that need an edit (a sync's line) are in the plan with their measured cost, not applied.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpu.gpuprofile.lift import DATA_STEP, LOADER, TRAIN_STEP
from jupyter_gpu.gpuprofile.plan import DATA_SHARE
from jupyter_gpu.gpuprofile.result import DATA, ProfileResult
from jupyter_gpu.probekit.training_state import set_value_at, value_at

OPTIONS = ("amp-bf16", "tf32", "channels-last", "fused-optimizer")
PROBE_STEPS = 8
# A fix is applied when the probe measured at least this speed-up. Below it, the loop's runs cannot tell it from
# their noise: on the 2-core CI machine one configuration's speed-up moved 5-11% between back-to-back pairs, and a
# fused SGD measured at 1.07x on the step was chosen in one --apply run, not in the next, and made the loop 0.88x.
APPLY_SPEEDUP = 1.10


@dataclass
class FixPlan:
    options: tuple[str, ...] = ()                  # speedprobe option names to apply
    loader: str | None = None                      # the notebook name of the loader to replace
    loader_settings: Any = None                    # dataprobe LoaderSettings for it
    loader_code: str | None = None                 # the line a user writes for it
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (fix, why it was not applied)
    checked: list[str] = field(default_factory=list)              # what was measured to decide
    titles: list[str] = field(default_factory=list)               # the applied fixes, as the report names them
    code: list[str] = field(default_factory=list)                 # the lines that adopt them in the user's code
    interrupted: str | None = None                 # Ctrl-C came while this probe measured: apply nothing, stop
    not_tried: list[tuple[str, str]] = field(default_factory=list)  # (fix, why it could not be tried here)


def choose_fixes(torch: Any, namespace: dict[str, Any], before: ProfileResult, loaders: list[str], *,
                 compile_too: bool, data_seconds: float, progress: Callable[[str], None] | None) -> FixPlan:
    """Ask the probes which fixes help this loop and keep its numbers."""
    plan = FixPlan()
    loader_why = _loader_not_tried(before, loaders, namespace)
    if loader_why is not None:
        plan.not_tried.append(("DataLoader settings", loader_why))
    step = namespace.get(TRAIN_STEP)
    if not callable(step) or not any(r.name == TRAIN_STEP for r in before.ready_steps):
        why = next((r.reason for r in before.ready_steps if r.reason), None) or "no step was lifted"
        plan.left_out.append(("every fix", f"the loop body could not be lifted ({why}), so no fix could be checked "
                                           "for agreement"))
        return plan
    from jupyter_gpu.speedprobe.runner import SpeedProbeError, SpeedProbeRequest, run_speedprobe

    options = (*OPTIONS, "compile") if compile_too else OPTIONS
    try:
        speed = run_speedprobe(step, SpeedProbeRequest(options=options, steps=PROBE_STEPS), step_name=TRAIN_STEP,
                               namespace=namespace, progress=progress)
    except SpeedProbeError as exc:
        plan.left_out.append(("precision, layout, fused optimizers", f"%speedprobe could not run: {exc}"))
        speed = None
    if speed is not None and speed.interrupted:
        plan.interrupted = "%speedprobe"  # what it measured is partial: the user asked to stop, not to go on
        return plan
    if speed is not None and speed.shared_cpu is not None:
        plan.left_out.append(("precision, layout, fused optimizers", f"not judged: {speed.shared_cpu}"))
        speed = None
    if speed is not None:
        plan.checked.append(f"%speedprobe {TRAIN_STEP} --try {','.join(options)} --steps {PROBE_STEPS}")
        best = speed.best
        if best is not None and best.speedup is not None and best.speedup < APPLY_SPEEDUP:
            plan.left_out.append((best.title, f"{best.speedup:.2f}x on the step alone, under the "
                                              f"{APPLY_SPEEDUP:.2f}x the loop's runs can tell from their noise"))
            best = None
        chosen = best.members if best is not None else ()
        plan.options = tuple(chosen)
        if best is not None:
            plan.titles.append(f"{best.title} ({best.speedup:.2f}x on the step alone)")
            plan.code.extend(speed.code())
        for trial in speed.options:
            if trial.name in chosen:
                continue
            if trial.skipped:
                plan.left_out.append((trial.title, trial.skipped))
            elif trial.error:
                plan.left_out.append((trial.title, f"the step raised {trial.error}"))
            elif trial.agreement is not None and trial.agreement.agrees is False:
                plan.left_out.append((trial.title, "its numbers disagree with the step as it is: "
                                                   f"{trial.agreement.failure or 'the numbers differ'}"))
            elif speed.best is not None and trial.name in speed.best.members:
                continue  # named above, with the configuration it belongs to
            elif trial.speedup is not None and speed.best is not None and trial.speedup > 1:
                plan.left_out.append((trial.title, f"{trial.speedup:.2f}x alone, but the fastest configuration whose "
                                                   f"numbers agree ({speed.best.title}) is without it"))
            else:
                speedup = f"{trial.speedup:.2f}x" if trial.speedup else "no measurable gain"
                plan.left_out.append((trial.title, f"did not help on this step ({speedup})"))
    data = before.bucket(DATA)
    if loaders and loaders[0] == LOADER and data is not None and data.share >= DATA_SHARE:
        plan.left_out.append(("DataLoader settings", "the loop makes its DataLoader itself (inside the function), so "
                              "a run cannot be handed other settings; %dataprobe profile_loader --step profile_step "
                              "measures them, to change where the loader is made"))
    elif loaders and data is not None and data.share >= DATA_SHARE and callable(namespace.get(DATA_STEP)):
        from jupyter_gpu.dataprobe.runner import DataProbeRequest, run_dataprobe

        name = loaders[0]
        plan.checked.append(f"%dataprobe {name} --step {DATA_STEP} --seconds {data_seconds:g}")
        probe = run_dataprobe(value_at(namespace, name), namespace[DATA_STEP], DataProbeRequest(seconds=data_seconds),
                              loader_name=name, step_name=DATA_STEP, namespace=namespace, progress=progress)
        if probe.interrupted:
            plan.interrupted = "%dataprobe"
            return plan
        if (probe.recommended_settings is not None and probe.recommended_settings != probe.current
                and probe.speedup is not None and probe.speedup < APPLY_SPEEDUP):
            plan.left_out.append(("DataLoader settings",
                                  f"{probe.recommended_settings.label()}: {probe.speedup:.2f}x measured, under the "
                                  f"{APPLY_SPEEDUP:.2f}x the loop's runs can tell from their noise"))
        elif probe.recommended_settings is not None and probe.recommended_settings != probe.current:
            plan.loader, plan.loader_settings, plan.loader_code = name, probe.recommended_settings, probe.code()
            plan.titles.append(f"{name}: {probe.recommended_settings.label()}")
            if plan.loader_code:
                plan.code.append(plan.loader_code)
        else:
            plan.left_out.append(("DataLoader settings", "%dataprobe found nothing faster than the loader as it is"))
    return plan


def _loader_not_tried(before: ProfileResult, loaders: list[str], namespace: dict[str, Any]) -> str | None:
    """Why %dataprobe's loader settings are not tried on this loop, said in --apply's table; None when they are."""
    data = before.bucket(DATA)
    if not loaders:
        return "the loop takes no batches from a DataLoader (it makes its own), and %dataprobe measures DataLoaders"
    if data is None or data.share < DATA_SHARE:
        share = f"{data.share:.0%}" if data is not None else "none"
        return (f"waiting for data is {share} of the step, under the {DATA_SHARE:.0%} from which a loader fix "
                "could show in the loop's runs")
    if loaders[0] != LOADER and not callable(namespace.get(DATA_STEP)):
        return (f"no {DATA_STEP} was lifted from the loop, so %dataprobe has no step to run with {loaders[0]}'s "
                "batches")
    return None


def applied_run(torch: Any, namespace: dict[str, Any], plan: FixPlan, objects: Any, device: Any,
                run: Callable[[], Any]) -> Callable[[], Any]:
    """`run`, made to run with the plan's fixes in place (and undone when it returns or raises)."""
    from jupyter_gpu.dataprobe.loaders import recipe_of, shut_down
    from jupyter_gpu.speedprobe.variants import StepSetting, apply

    def with_fixes() -> Any:
        with ExitStack() as stack:
            applied = apply(plan.options, StepSetting(torch, objects, device), stack) if plan.options else None
            if plan.loader is not None:
                loader = plan.loader  # `train_loader`, or a trainer's `trainer.train_loader`
                original = value_at(namespace, loader)
                replacement = recipe_of(original).build(plan.loader_settings, counting=False)
                set_value_at(namespace, loader, replacement)

                def put_back() -> None:
                    set_value_at(namespace, loader, original)
                    iterator = getattr(replacement, "_iterator", None)
                    if iterator is not None:
                        shut_down(iterator)  # persistent workers of the replacement: not the user's to keep
                stack.callback(put_back)
            for make in applied.around_call if applied is not None else []:
                stack.enter_context(make())
            return run()
    return with_fixes
