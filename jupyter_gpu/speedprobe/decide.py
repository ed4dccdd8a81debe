"""The rules of `%speedprobe`: when an option's numbers agree with the baseline's, when it helped, which ones to
combine, which configuration to recommend, and when a step is launch-bound. Pure Python.

Agreement is judged on the update the first step makes (relative L2 of the parameter change against the
baseline's, from the same weights and batch) and on the loss over the following steps. The tolerance of the
update is calibrated on the user's own step: besides the format's unit roundoff (bf16 3.9e-3, fp16 4.9e-4),
the probe measures how far the update moves when the only change is rounding the weights to that format. On
our CPU that alone moved a ResNet's update by 1.9e-2 and an MLP-with-Adam's by 0.12 in bf16 (Adam's first update
is close to the sign of the gradient), and autocast moved them 1.1-1.4 times as much, on three models and both
formats; a fixed multiple of the roundoff would call correct AMP wrong on some models and miss broken AMP on
others. An option that does not change the format (channels_last, fused, compile) only reorders float32 sums;
those moved the updates by up to 5e-5 (a ResNet) and 2.6e-4 (a transformer with Adam) here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from jupyter_gpu.speedprobe.catalog import BY_NAME, FP32, UNIT_ROUNDOFF
from jupyter_gpu.speedprobe.result import Agreement, OptionTrial

# The update may differ by this many times what rounding the weights to the format alone does.
SENSITIVITY_FACTOR = 4.0
# Float32 reorderings (fused kernels, other convolution algorithms, compiled reductions): a TF32-sized difference.
FP32_REORDER_TOLERANCE = 1e-3
# Past this, rounding alone moves the update so much that comparing updates says nothing: the loss decides.
MAX_UPDATE_TOLERANCE = 0.5
LOSS_DRIFT_LIMIT = 0.01  # 1% over --steps, as the reference's 20-step check
# An option must save at least this share of the step to count as helping (timings on a busy machine wobble).
HELPS_SPEEDUP = 1.05
# A GradScaler that halved its scale this many times in the probe's steps is skipping steps: gradients overflow.
SCALER_COLLAPSE_HALVINGS = 3
# Host time per operator below which a GPU step is launch-bound: a kernel launch costs 4-6 us on the host and
# PyTorch's dispatcher adds a few more, so ~20 us per operator means the kernels finish before the next arrives.
GPU_LAUNCH_BOUND_SECONDS_PER_OP = 20e-6
# On the CPU the same shape of problem is per-operator overhead: 1.4 us for an eager op on one element and
# 7.8 us per Linear(32, 32) at batch 4 on our machine; under 10 us per op the arithmetic is not what costs.
CPU_OVERHEAD_BOUND_SECONDS_PER_OP = 10e-6
# Fewer operators than this and the per-op time says little (one big matmul is not "launch-bound").
MIN_OPS_FOR_LAUNCH_VERDICT = 20


def tolerance(format_name: str, sensitivity: float | None, repeat_noise: float | None) -> float:
    """The most the update may differ from the baseline's under an option computing in `format_name`.

    `sensitivity`: how far the update moved when the weights were rounded to that format (or, for float32,
    perturbed by one unit in the last place); `repeat_noise`: how far two baseline runs from the same state
    differ (non-deterministic kernels). The larger of the format's floor and four times either.
    """
    floor = FP32_REORDER_TOLERANCE if format_name == FP32 else UNIT_ROUNDOFF[format_name]
    measured = [value for value in (sensitivity, repeat_noise) if value is not None and math.isfinite(value)]
    return max([floor, *(SENSITIVITY_FACTOR * value for value in measured)])


def judge(format_name: str, update_rel_l2: float | None, tol: float | None, losses: Sequence[float | None],
          baseline_losses: Sequence[float | None], failure: str | None = None,
          unjudged: str | None = None) -> Agreement:
    """The agreement verdict: a failure (NaN, a collapsing scaler) is never agreement; otherwise the update must be
    within `tol` and the loss within 1% at every step compared. `unjudged` says why no comparison is possible."""
    compared = [(value, base) for value, base in zip(losses, baseline_losses, strict=False)
                if value is not None and base is not None]
    drift = max((abs(value - base) / max(abs(base), 1e-12) for value, base in compared), default=None)
    if failure is None:
        failure = _non_finite(update_rel_l2, [value for value, _ in compared])
    common = {"format": format_name, "update_rel_l2": update_rel_l2, "tolerance": tol, "loss_drift": drift,
              "steps": len(compared)}
    if failure is not None:
        return Agreement(**common, failure=failure, agrees=False)
    if unjudged is not None:
        return Agreement(**common, agrees=None, note=unjudged)
    reasons = []
    note = None
    if update_rel_l2 is not None and tol is not None:
        if tol > MAX_UPDATE_TOLERANCE:
            note = (f"the update is too sensitive to rounding to compare (rounding the weights to {format_name} "
                    f"alone moves it by more than {MAX_UPDATE_TOLERANCE / SENSITIVITY_FACTOR:.0%}); the loss decides")
        elif update_rel_l2 > tol:
            reasons.append(f"the first update differs by {update_rel_l2:.2g} (tolerance {tol:.2g})")
    if drift is not None and drift > LOSS_DRIFT_LIMIT:
        reasons.append(f"the loss drifted {drift:.2%} from the baseline's over {len(compared)} steps (limit 1%)")
    if reasons:
        return Agreement(**common, failure="; ".join(reasons), agrees=False)
    if update_rel_l2 is None and drift is None:
        return Agreement(**common, agrees=None, note="nothing to compare: no parameter changed and no loss returned")
    return Agreement(**common, agrees=True, note=note)


def _non_finite(update_rel_l2: float | None, losses: list[float]) -> str | None:
    for index, loss in enumerate(losses, 1):
        if not math.isfinite(loss):
            return f"the loss became {_finite_name(loss)} at step {index}"
    if update_rel_l2 is not None and not math.isfinite(update_rel_l2):
        return "the parameters became NaN or inf after the first step"
    return None


def _finite_name(value: float) -> str:
    return "NaN" if math.isnan(value) else "inf"


def scaler_failure(initial_scale: float, final_scale: float, skipped_steps: int, steps: int,
                   backward_scaled: bool) -> str | None:
    """Why an fp16 run with a GradScaler is wrong, or None: the loss was never scaled (fp16 without a scaler),
    or the scale collapsed (the scaler skipped step after step because the gradients overflow)."""
    if not backward_scaled:
        return ("fp16 without a scaler: the step's backward did not go through loss.backward(), so the GradScaler "
                "never scaled the loss and small gradients flush to zero in fp16")
    halvings = math.log2(initial_scale / final_scale) if final_scale > 0 else math.inf
    if halvings >= SCALER_COLLAPSE_HALVINGS or (steps and skipped_steps >= max(2, steps // 2)):
        return (f"the GradScaler's scale collapsed from {initial_scale:g} to {final_scale:g}: {skipped_steps} of "
                f"{steps} steps overflowed in fp16 and were skipped")
    return None


def helped(trial: OptionTrial) -> bool:
    return trial.measured and trial.speedup is not None and trial.speedup >= HELPS_SPEEDUP


def combination_members(singles: Sequence[OptionTrial]) -> tuple[str, ...]:
    """The options worth combining: each one that helped and agrees, only the fastest of a group (bf16 or fp16
    autocast; compile or compile with CUDA graphs), in the catalogue's order."""
    chosen: dict[str, OptionTrial] = {}
    for trial in singles:
        if not (helped(trial) and trial.agrees is True and len(trial.members) == 1):
            continue
        group = BY_NAME[trial.name].group or trial.name
        if group not in chosen or (trial.speedup or 0) > (chosen[group].speedup or 0):
            chosen[group] = trial
    names = {trial.name for trial in chosen.values()}
    return tuple(name for name in BY_NAME if name in names)


def choose_best(singles: Sequence[OptionTrial], combination: OptionTrial | None) -> OptionTrial | None:
    """The fastest configuration that agrees and helps, or None: the step is best left as it is."""
    candidates = [trial for trial in [*singles, *([combination] if combination else [])]
                  if helped(trial) and trial.agrees is True]
    return max(candidates, key=lambda trial: trial.speedup or 0.0, default=None)


def launch_bound(device_type: str, ops: int, step_seconds: float) -> bool:
    """Whether the step's time is per-operator overhead: many operators, each taking about a launch's time."""
    if ops < MIN_OPS_FOR_LAUNCH_VERDICT or step_seconds <= 0:
        return False
    limit = GPU_LAUNCH_BOUND_SECONDS_PER_OP if device_type != "cpu" else CPU_OVERHEAD_BOUND_SECONDS_PER_OP
    return step_seconds / ops <= limit
