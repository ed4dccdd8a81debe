"""The rules of `%speedprobe`: when an option's numbers agree with the baseline's, when it helped, which ones to
combine, which configuration to recommend, and when a step is launch-bound. Pure Python.

Agreement is judged on the update the first step makes (against the baseline's, from the same weights and batch)
and on the loss over the following steps, with tolerances meant to hold for correct AMP on any seed.

The update is compared twice. Its size along the baseline's direction (the projection, 1 when equal) must be within
25%: the failures that make AMP wrong move it by orders of magnitude (clipping gradients that are still scaled: 1e-5;
an optimizer stepping on gradients still multiplied by the scale: 65536), while rounding only shrinks it by about
half the square of its relative error (Adam's sign-like first update), 5% at most on our models. Its relative L2
difference must be within the larger of a floor of the format and four times what rounding the weights to that
format alone does to it. The floor is 8·sqrt(u) (u the unit roundoff: bf16 0.5, fp16 and TF32 0.18), not a multiple
of u: in a network with ReLUs, or under Adam, whose first update is the gradient's sign, the update moves in jumps
where rounding flips a unit or a sign near zero; how many flip grows with u, so the error grows like its square
root. Rounding the weights alone flips few (it changes each gradient by a fraction of itself, where autocast rounds
every term of its sums), so on its own it cannot calibrate the tolerance: on one seed of an MLP with Adam it moved
the update by 1.9e-4 and fp16 autocast by 2.7e-2, and on another 0.027 against 0.126 (0.71 of the floor, the most
of 40 seeds of six models). The former tolerance, the larger of u and four times that sensitivity, called correct
AMP wrong in 9 of 80 cases (10 seeds of four models, bf16 and fp16). An option that does not change the format
(channels_last, fused, compile) only reorders float32 sums, and the same jumps follow: a reordered kernel rounds its
results by tens of units in the last place, not one (channels_last on the CPU left a ResNet-style CNN's activations
20-80 units off float64's), and one flipped ReLU among n activations moves the update by about 1/sqrt(n). Over 72 CPU
cases (six ResNet-style CNNs, batch 16-128 of 32x32 and 64x64 images, SGD with momentum and Adam, 12 seeds each)
channels_last moved the first update by up to 6.2e-3 under SGD and 7.8e-2 under Adam, whose first update is the
gradient's sign. So float32 is held to the same rule as a reduced format whose unit roundoff is 64 of float32's
(2^-18): a floor of 8·sqrt(2^-18) = 1/64, or four times what moving each weight by 64 units alone does (the larger of
two random draws), when more. That called none of the 72 wrong (the former floor of 1e-3 called 54 wrong); the
failures it is there for are far larger (a fused SGD step on channels_last weights with contiguous momentum buffers:
0.23; dropout masks drawn in another order: 0.95).

The loss must stay within 1% of the baseline's at every step, or within four times what the same steps from the
rounded weights drift, when that is more: a small ResNet with BatchNorm (batch 16 of 16x16 images) drifts 1.2-3.6%
over 20 steps under correct bf16 and fp16 autocast, and 2-6% from rounded weights (autocast 0.6-2.7 times that at
batch 8), as training amplifies any perturbation there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from jupyter_gpu.speedprobe.catalog import BY_NAME, FP32, UNIT_ROUNDOFF
from jupyter_gpu.speedprobe.result import Agreement, OptionTrial

# The update may differ by this many times what rounding the weights to the format alone does, and the loss may drift
# by this many times what the steps from the rounded weights drift.
SENSITIVITY_FACTOR = 4.0
# The floor of a reduced format's tolerance, in square roots of its unit roundoff (see the module's docstring).
ROUNDING_FLOOR_FACTOR = 8.0
# The floor of a forward-only step's output tolerance, in units of the format's unit roundoff (see output_floor).
OUTPUT_FLOOR_FACTOR = 8.0
# The first update's size along the baseline's direction may differ by this much (0.25: from 0.75 to 1.25 times).
SCALE_TOLERANCE = 0.25
# Float32 reorderings (fused kernels, other convolution algorithms, compiled reductions): the floor of the first
# update's difference is 8·sqrt(64·u) for float32's u = 2^-24 (see the module's docstring), and of a forward-only
# step's outputs, which no ReLU flip amplifies into a jump, 1e-3.
FP32_REORDER_TOLERANCE = 8 * math.sqrt(64 * 2.0 ** -24)
FP32_OUTPUT_TOLERANCE = 1e-3
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
# 7.8 us per Linear(32, 32) at batch 4 on one machine; within about 12 times the host's own one-element op the
# arithmetic is not what costs. A fixed 10 us misjudged a 2-core EPYC, whose one-element op takes 1.6-3.2 us: a tiny
# MLP at batch 1 took 11.4-15.2 us an operator there (9.7 times the floor while another process shared the CPU) and
# was called not overhead-bound; a 512-wide MLP at batch 256 takes hundreds of times the floor.
CPU_OVERHEAD_BOUND_FLOORS = 12.0
CPU_OVERHEAD_BOUND_SECONDS_PER_OP = 10e-6  # where the host's floor was not measured
# Fewer operators than this and the per-op time says little (one big matmul is not "launch-bound").
MIN_OPS_FOR_LAUNCH_VERDICT = 20


def tolerance(format_name: str, sensitivity: float | None, repeat_noise: float | None,
              compared: str = "update") -> float:
    """The most the update (or, `compared="outputs"`, a forward-only step's outputs) may differ from the baseline's
    under an option computing in `format_name`.

    `sensitivity`: how far it moved when the weights were rounded to that format (or, for float32, perturbed by
    64 units in the last place); `repeat_noise`: how far two baseline runs from the same state differ
    (non-deterministic kernels). The larger of the format's floor and four times either.
    """
    measured = [value for value in (sensitivity, repeat_noise) if value is not None and math.isfinite(value)]
    floor = output_floor(format_name) if compared == "outputs" else format_floor(format_name)
    return max([floor, *(SENSITIVITY_FACTOR * value for value in measured)])


def output_floor(format_name: str) -> float:
    """The least tolerance of a forward pass's outputs: 8·u for a reduced format (bf16 3.1%, fp16 0.39%), 1e-3 for
    float32 reorderings. Outputs have no sign-like jumps (no optimizer reads them), so their error grows like u: on
    an MLP, a small ResNet and a transformer encoder in eval mode, 4 seeds each, autocast moved the logits by at
    most 5.8e-3 (bf16) and 6.4e-4 (fp16), and 3.1 times what rounding the weights alone did."""
    if format_name == FP32:
        return FP32_OUTPUT_TOLERANCE
    return OUTPUT_FLOOR_FACTOR * UNIT_ROUNDOFF[format_name]


def format_floor(format_name: str) -> float:
    """The least tolerance of the update: 8·sqrt(u) for a reduced format (bf16 0.5, fp16 and TF32 0.18), and for
    float32 reorderings 8·sqrt(64·u) = 1/64."""
    if format_name == FP32:
        return FP32_REORDER_TOLERANCE
    return ROUNDING_FLOOR_FACTOR * math.sqrt(UNIT_ROUNDOFF[format_name])


def loss_limit(rounded_drift: float | None, format_name: str | None = None) -> float:
    """The most the loss may drift: 1%, or four times what the steps from the rounded weights drift, or four times the
    format's unit roundoff (bf16: 1.6%), whichever is more. The last because a loss computed in bf16 is itself
    rounded: on an AVX2 CPU (no native bf16) correct bf16 autocast on the bench CNN drifted 1.07% in 4 steps for one
    seed of ten, with weights whose rounding alone moved it 0.2%."""
    floor = max(LOSS_DRIFT_LIMIT, SENSITIVITY_FACTOR * UNIT_ROUNDOFF[format_name]) if format_name in UNIT_ROUNDOFF \
        else LOSS_DRIFT_LIMIT
    if rounded_drift is None or not math.isfinite(rounded_drift):
        return floor
    return max(floor, SENSITIVITY_FACTOR * rounded_drift)


def loss_drift(losses: Sequence[float | None], baseline_losses: Sequence[float | None]) -> tuple[float | None, int]:
    """The largest relative difference of the losses from the baseline's at the same step, and how many compared."""
    compared = [(value, base) for value, base in zip(losses, baseline_losses, strict=False)
                if value is not None and base is not None]
    drift = max((abs(value - base) / max(abs(base), 1e-12) for value, base in compared), default=None)
    return drift, len(compared)


def judge(format_name: str, update_rel_l2: float | None, tol: float | None, losses: Sequence[float | None],
          baseline_losses: Sequence[float | None], failure: str | None = None, unjudged: str | None = None,
          update_scale: float | None = None, drift_limit: float = LOSS_DRIFT_LIMIT,
          update_note: str | None = None, compared: str = "update") -> Agreement:
    """The agreement verdict: a failure (NaN, a collapsing scaler) is never agreement; otherwise the update's size
    along the baseline's direction must be within 25%, its relative difference within `tol`, and the loss within
    `drift_limit` at every step compared. `unjudged` says why no comparison is possible; `update_note` why the first
    update is not compared (the loss decides). `compared="outputs"`: `update_rel_l2` and `update_scale` are of a
    forward-only step's model outputs, and the words say so."""
    drift, steps = loss_drift(losses, baseline_losses)
    if failure is None:
        failure = _non_finite(update_rel_l2, update_scale, losses, compared)
    common = {"format": format_name, "update_rel_l2": update_rel_l2, "tolerance": tol, "loss_drift": drift,
              "steps": steps, "update_scale": update_scale, "loss_limit": drift_limit, "compared": compared}
    if failure is not None:
        return Agreement(**common, failure=failure, agrees=False)
    if unjudged is not None:
        return Agreement(**common, agrees=None, note=unjudged)
    reasons = _update_reasons(format_name, update_rel_l2, tol, update_scale, compared)
    note = update_note
    if compared == "update" and update_rel_l2 is not None and tol is not None and tol > MAX_UPDATE_TOLERANCE:
        note = (f"the update's direction is too sensitive to rounding to compare (rounding the weights to "
                f"{format_name} alone moves it by more than {MAX_UPDATE_TOLERANCE / SENSITIVITY_FACTOR:.0%}); its "
                "size and the loss decide")
    if drift is not None and drift > drift_limit:
        reasons.append(f"the loss drifted {drift:.2%} from the baseline's over {steps} steps (limit "
                       f"{drift_limit * 100:.3g}%)")
    if reasons:
        return Agreement(**common, failure="; ".join(reasons), agrees=False)
    if update_rel_l2 is None and drift is None:
        nothing = ("nothing to compare: no model returned a floating-point tensor and no loss was returned"
                   if compared == "outputs" else "nothing to compare: no parameter changed and no loss returned")
        return Agreement(**common, agrees=None, note=update_note or nothing)
    return Agreement(**common, agrees=True, note=note)


def _update_reasons(format_name: str, update_rel_l2: float | None, tol: float | None,
                    update_scale: float | None, compared: str = "update") -> list[str]:
    reasons = []
    what = "the models' outputs" if compared == "outputs" else "the first update"
    if update_scale is not None and abs(update_scale - 1) > SCALE_TOLERANCE:
        reasons.append(f"{what} {'are' if compared == 'outputs' else 'is'} {update_scale:.2g} times the baseline's "
                       f"along {'their' if compared == 'outputs' else 'its'} direction (rounding to {format_name} "
                       "changes that by a few percent)")
    if update_rel_l2 is not None and tol is not None and tol <= MAX_UPDATE_TOLERANCE and update_rel_l2 > tol:
        reasons.append(f"{what} differ{'' if compared == 'outputs' else 's'} by {update_rel_l2:.2g} (tolerance "
                       f"{tol:.2g})")
    return reasons


def _non_finite(update_rel_l2: float | None, update_scale: float | None,
                losses: Sequence[float | None], compared: str = "update") -> str | None:
    for index, loss in enumerate(losses, 1):
        if loss is not None and not math.isfinite(loss):
            return f"the loss became {_finite_name(loss)} at step {index}"
    if any(value is not None and not math.isfinite(value) for value in (update_rel_l2, update_scale)):
        if compared == "outputs":
            return "the models' outputs became NaN or inf (float16 overflows above 65504)"
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


UNPLACED_UNSCALE = (
    "the step changes the gradients between backward() and optimizer.step() other than through "
    "torch.nn.utils.clip_grad_norm_ or clip_grad_value_ (clipping of its own?), and the probe cannot tell where "
    "scaler.unscale_(opt) must go before it, so under its GradScaler that code saw gradients still multiplied by the "
    "scale: fp16 is not judged. With fp16, call scaler.unscale_(opt) before changing the gradients")


def first_step_skipped_note(initial_scale: float) -> str:
    return (f"the GradScaler skipped the first step (gradients overflowed at its initial scale {initial_scale:g}, as "
            "it does while it finds its scale), so there is no first update to compare; the loss decides")


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


def launch_bound(device_type: str, ops: int, step_seconds: float, traced: bool | None = None,
                 op_floor: float | None = None) -> bool:
    """Whether the step's time is per-operator overhead. Where a kernel trace was taken, its verdict decides
    (`traced`: `GpuTimeline.launch_bound`, the one rule %%gpuprofile's plan uses too: many short kernels, the GPU idle
    most of the step, between back-to-back launches rather than while the host does other work); on the H200's
    slower host a tiny MLP took 32 µs an operator, over the fixed 20 µs, with its GPU idle most of the step, and a
    step that makes its own batches leaves the GPU idle without being launch-bound. Without a trace: many operators,
    each taking about a launch's time; on the CPU, measured against this host's own one-element operator (`op_floor`,
    probekit.clock.eager_op_floor) where it was measured."""
    if ops < MIN_OPS_FOR_LAUNCH_VERDICT or step_seconds <= 0:
        return False
    if traced is not None:
        return traced
    if device_type != "cpu":
        limit = GPU_LAUNCH_BOUND_SECONDS_PER_OP
    elif op_floor is not None and op_floor > 0:
        limit = CPU_OVERHEAD_BOUND_FLOORS * op_floor
    else:
        limit = CPU_OVERHEAD_BOUND_SECONDS_PER_OP
    return step_seconds / ops <= limit
