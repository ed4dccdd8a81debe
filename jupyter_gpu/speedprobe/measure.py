"""Run the user's step under one configuration, the way `%%gputime` times: synchronised, warm-up (and
compilation) apart, at least five timed steps; and record what the agreement check needs: the first step's
parameter update (and its models' outputs, which are what a forward-only step has to compare), the loss of every
step, NaN/inf and the GradScaler's fate; and, on the counted step, the number formats the step's matrix
multiplications and convolutions really ran in (its own autocast shows there) and whether it trains at all.

Every configuration starts from the same state (the runner restores its StateSnapshot first), so every one sees
the same weights and, with the random generators restored, the same batch.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpu.gputime.opcount import OpCounter
from jupyter_gpu.kernel_torch import handler_mode
from jupyter_gpu.probekit.batch_structure import leaves
from jupyter_gpu.probekit.clock import CudaMemoryWatch, DeviceClock
from jupyter_gpu.probekit.step_census import StepCensus
from jupyter_gpu.probekit.step_failure import raised_sentence
from jupyter_gpu.probekit.step_output import StepOutput
from jupyter_gpu.speedprobe import variants
from jupyter_gpu.speedprobe.catalog import BF16, FP16, FP32, TF32
from jupyter_gpu.speedprobe.variants import StepSetting

MIN_TIMED_STEPS = 5
# A sub-millisecond step timed 18 times is 10 ms of measurement, which one pause of the machine moves: every
# configuration is timed for at least this long, up to MAX_CALLS calls.
MIN_TIMED_SECONDS = 0.2
MAX_CALLS = 2000
# torch.compile compiles on the first call and often once more on the second (the optimizer's state, dynamic
# shapes); both are warm-up, reported as compile time.
COMPILE_WARMUP_STEPS = 2
FIRST_STEP_WARMUP = 1
# The operators autocast lowers to bf16/fp16 (matrix products, convolutions, attention), as ATen names them below
# autograd and autocast: what a step computes in. Elementwise and reduction operators follow their inputs.
_COMPUTE_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "matmul", "linear",
                          "_addmm_activation", "convolution", "_convolution", "conv1d", "conv2d", "conv3d",
                          "mkldnn_convolution", "cudnn_convolution", "miopen_convolution", "convolution_overrideable",
                          "_mkldnn_rnn_layer", "mkldnn_rnn_layer", "_cudnn_rnn", "miopen_rnn"})
_COMPUTE_PREFIXES = ("_scaled_dot_product", "_flash_attention", "_efficient_attention", "_cudnn_attention")
# The models' outputs are kept on the host for the agreement check: a language model's logits can be gigabytes, so
# each output keeps at most this many of its elements, evenly strided (the same ones in every configuration).
MAX_OUTPUT_ELEMENTS = 1 << 20
# How far float32's calibration moves each weight, in units of float32's last place, at random: as far as a
# reordered kernel rounds its results. channels_last convolutions and BatchNorm on the CPU (torch 2.13, oneDNN) left
# a ResNet-style CNN's activations 1-5e-6 off float64's, 20-80 units, where the contiguous kernels left 1-10 units;
# one unit flipped too few ReLUs to calibrate against (decide.py's docstring).
FP32_CALIBRATION_ULPS = 64

Progress = Callable[[str], None]


class StepRaised(RuntimeError):
    """The step raised under a configuration; the message names the exception."""


@dataclass
class Run:
    """What one configuration's steps measured."""

    times: list[float] = field(default_factory=list)
    warmup_seconds: list[float] = field(default_factory=list)
    losses: list[float | None] = field(default_factory=list)
    update: list[Any] | None = None            # per parameter, host float32: after the first step minus before
    ops: dict[str, int] = field(default_factory=dict)  # operators of one counted step, by device type
    cpu_peak_bytes: int | None = None
    cuda_peak_bytes: int | None = None
    batch_size: int | None = None
    # Batches the counted step trained on: calls of the model the batch size was read from, per optimizer step
    # (gradient accumulation's micro-batches; a GAN's two optimizers do not double its generator's batch).
    batches: int = 1
    scaling: variants.Fp16Scaling | None = None
    first_step_skipped: bool = False  # the GradScaler skipped the first step (its scale overflowed): no update
    compute_dtypes: dict[str, int] = field(default_factory=dict)  # counted step: compute operators by input dtype
    random_in_forward: bool = False  # counted step: a model's forward drew random numbers
    notes: list[str] = field(default_factory=list)
    refused: str | None = None  # why the option cannot run on this step, found only as it ran (a closure's step)
    error: str | None = None
    loss_note: str | None = None
    outputs: list[Any] | None = None  # the first step's model outputs, host float32 (subsampled), in call order
    # The counted step trained: an optimizer stepped or a gradient reached a parameter (inspected steps only; None
    # elsewhere). A step that does neither (evaluation, inference) has no update to compare, and no GradScaler.
    trained: bool | None = None
    # Ids of the notebook's models the counted step called and of the optimizers that stepped (inspected steps
    # only): the code to adopt names these, not every model the notebook holds.
    called_models: set[int] | None = None
    stepped_optimizers: set[int] | None = None
    # Per parameter, the RMS of its gradient in the first step (the baseline's reference run only; None for a
    # parameter that got none): which updates are made of rounding noise (null_gradients).
    gradient_rms: list[float | None] | None = None


# A parameter whose first gradient's RMS is this small beside the step's over all parameters holds rounding noise,
# not a gradient: its exact gradient is zero, as for a bias that feeds BatchNorm in training mode (the batch mean it
# adds is subtracted again). fp32 leaves it at ~1e-7 of the others; Adam then makes a full-size step of that noise,
# different in every format and every order of summation, so such updates cannot be compared.
NULL_GRADIENT = 1e-5


def null_gradients(gradient_rms: list[float | None] | None, sizes: list[int]) -> set[int]:
    """Indices of the parameters whose first gradient is rounding noise beside the others (NULL_GRADIENT)."""
    if not gradient_rms:
        return set()
    squares = sum(rms * rms * size for rms, size in zip(gradient_rms, sizes, strict=True) if rms)
    counted = sum(size for rms, size in zip(gradient_rms, sizes, strict=True) if rms is not None)
    overall = math.sqrt(squares / counted) if counted else 0.0
    return {index for index, rms in enumerate(gradient_rms)
            if rms is not None and overall > 0 and rms < NULL_GRADIENT * overall}


class GradientSizes:
    """While entered, the RMS of each parameter's gradient as it last accumulated (the step's final gradient, also
    under gradient accumulation), read by post-accumulate-grad hooks: a step may zero its gradients at its end."""

    def __init__(self, params: list[Any]) -> None:
        self._params = params
        self._handles: list[Any] = []
        self.rms: dict[int, float] = {}

    def __enter__(self) -> GradientSizes:
        for index, param in enumerate(self._params):
            if param.requires_grad:
                self._handles.append(param.register_post_accumulate_grad_hook(
                    lambda tensor, index=index: self._read(index, tensor)))
        return self

    def _read(self, index: int, param: Any) -> None:
        grad = param.grad
        if grad is not None and grad.numel() and not grad.is_sparse:
            self.rms[index] = float(grad.detach().float().pow(2).mean().sqrt())

    def __exit__(self, *exc_info: Any) -> None:
        for handle in self._handles:
            handle.remove()

    def per_parameter(self) -> list[float | None]:
        return [self.rms.get(index) for index in range(len(self._params))]


@dataclass
class RoundedRun:
    """The baseline's steps from the weights rounded to a format: its first update, its models' first outputs and
    its losses."""

    update: list[Any] | None
    losses: list[float | None] = field(default_factory=list)
    outputs: list[Any] | None = None


@dataclass
class StepRunner:
    """Runs configurations of one step on one setting; `weights_before` are host copies of every parameter."""

    step: Callable[[], Any]
    setting: StepSetting
    params: list[Any]
    weights_before: list[Any]
    progress: Progress | None = None
    output: StepOutput = field(default_factory=StepOutput)  # what the step printed, kept out of the notebook

    @classmethod
    def for_step(cls, step: Callable[[], Any], setting: StepSetting, params: list[Any],
                 progress: Progress | None = None) -> StepRunner:
        return cls(step, setting, params, [param.detach().to("cpu", copy=True) for param in params], progress)

    def run(self, names: tuple[str, ...], steps: int, label: str, inspect_step: bool = False,
            extra_warmup: int = 0, same_random_numbers: bool = False, fp16_init_scale: float | None = None) -> Run:
        """Apply `names`, call the step `max(steps, warm-up + 1 + 5)` times and for at least MIN_TIMED_SECONDS
        of timed steps, undo; `inspect_step`: on the counted step, also read the batch size and the formats the
        step's matrix products ran in; `fp16_init_scale`: where amp-fp16's GradScaler starts (its default, 65536,
        when None). The caller restores state."""
        torch = self.setting.torch
        compiled = any(name.startswith("compile") for name in names)
        warmup = (COMPILE_WARMUP_STEPS if compiled else FIRST_STEP_WARMUP) + extra_warmup
        total = max(steps, warmup + 1 + MIN_TIMED_STEPS)
        record = Run()
        memory = CudaMemoryWatch(torch)
        graphs_before = variants.compiled_graphs(torch) if compiled else 0
        with ExitStack() as stack:
            applied = variants.apply(names, self.setting, stack, same_random_numbers=same_random_numbers,
                                     fp16_init_scale=fp16_init_scale)
            record.scaling = applied.fp16
            record.notes = applied.notes
            clock = DeviceClock(torch)
            index = 0
            while index < total or (sum(record.times) < MIN_TIMED_SECONDS and index < MAX_CALLS):
                if self.progress is not None:
                    self.progress(f"{label}: step {index + 1}/{max(total, index + 1)}")
                counted = index == warmup
                try:
                    # The first call's outputs: what a forward-only step is judged on (the baseline's inspected run
                    # is where the probe learns whether the step trains).
                    capture = index == 0 and (inspect_step or self.setting.forward_only)
                    sizes = GradientSizes(self.params) if index == 0 and inspect_step else None
                    with sizes if sizes is not None else contextlib.nullcontext():
                        seconds, value = self._one_step(applied, clock, counted, record,
                                                        inspect_step and counted, capture_outputs=capture)
                    if sizes is not None:
                        record.gradient_rms = sizes.per_parameter()
                except StepRaised as raised:
                    if isinstance(raised.__cause__, variants.ClosureStepRefused):
                        record.refused = str(raised.__cause__)  # not the step's fault: the option cannot apply
                    record.error = str(raised)
                    break
                if index < warmup:
                    record.warmup_seconds.append(seconds)
                elif not counted:  # counting operators slows the step: that one is not timed
                    record.times.append(seconds)
                record.losses.append(self._loss_value(value, record))
                if index == 0:
                    record.update = self._update()
                    record.first_step_skipped = bool(applied.fp16 is not None and applied.fp16.skipped_steps)
                index += 1
        if compiled and record.error is None and variants.compiled_graphs(torch) == graphs_before:
            record.error = ("torch.compile compiled no graph of this model (Dynamo skipped its forward), so the "
                            "step ran as before")
        record.cuda_peak_bytes = self._cuda_peak(memory)
        return record

    def _one_step(self, applied: variants.Applied, clock: DeviceClock, counted: bool, record: Run,
                  inspect_step: bool, capture_outputs: bool = False) -> tuple[float, Any]:
        box: dict[str, Any] = {}

        def call() -> None:
            box["value"] = applied.call(self.step)

        torch = self.setting.torch
        with ExitStack() as watching:
            watching.enter_context(self.output.hidden())
            if inspect_step:
                census = watching.enter_context(StepCensus(torch, self.setting.objects.modules, self.params))
            outputs = watching.enter_context(OutputCapture(torch, self.setting.objects.models())) \
                if capture_outputs else None
            try:
                if counted:
                    counter = OpCounter(torch)
                    dtypes = ComputeDtypes(torch, census if inspect_step else None)
                    with counter, dtypes if inspect_step else contextlib.nullcontext():
                        seconds, _ = clock.time(call)
                    counts = counter.result()
                    record.ops = dict(counts.by_device)
                    record.cpu_peak_bytes = counts.cpu_peak_bytes
                    record.compute_dtypes = dict(dtypes.seen)
                    record.random_in_forward = dtypes.random_in_forward
                else:
                    seconds, _ = clock.time(call)
            except KeyboardInterrupt:
                raise
            except Exception as exc:
                raise StepRaised(raised_sentence(torch, exc)) from exc
        if inspect_step:
            record.trained = census.trained
            record.batch_size, record.batches = census.batch_size, census.batches
            record.called_models, record.stepped_optimizers = census.called, census.stepped
        if outputs is not None:
            record.outputs = outputs.tensors
        return seconds, box.get("value")

    def _loss_value(self, value: Any, record: Run) -> float | None:
        torch = self.setting.torch
        if isinstance(value, torch.Tensor):
            if value.numel() == 1:
                return float(value.detach().float().item())
            record.loss_note = f"the step returned a tensor of shape {tuple(value.shape)}, not a scalar loss"
            return None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if value is not None:
            record.loss_note = f"the step returned a {type(value).__name__}, not a loss"
        return None

    def _update(self, before: list[Any] | None = None) -> list[Any]:
        """Each parameter now minus `before` (by default the user's weights), on the host in float32."""
        return [param.detach().to("cpu", copy=True).float() - start.float()
                for param, start in zip(self.params, before or self.weights_before, strict=True)]

    def _cuda_peak(self, memory: CudaMemoryWatch) -> int | None:
        device = self.setting.device
        if device.type != "cuda":
            return None
        index = device.index if device.index is not None else 0
        for use in memory.finish():
            if use.device == f"cuda:{index}":
                return use.peak_allocated
        return None

    # -- sensitivity ------------------------------------------------------------------------------------------------

    def rounded_run(self, format_name: str, steps: int, draw: int = 0) -> RoundedRun:
        """`steps` baseline steps after rounding the weights to `format_name` (float32: FP32_CALIBRATION_ULPS units in
        the last place, at random, `draw` seeding which): how much that format's precision alone moves this step's
        first update, and how far the loss then drifts as training carries the difference on. The caller restores the
        state afterwards."""
        torch = self.setting.torch
        generator = torch.Generator().manual_seed(draw)
        with torch.no_grad():
            for param, before in zip(self.params, self.weights_before, strict=True):
                if not torch.is_floating_point(param):
                    continue
                param.copy_(_rounded(torch, before, format_name, generator).to(param.device))
        rounded_before = [param.detach().to("cpu", copy=True).float() for param in self.params]
        clock = DeviceClock(torch)
        applied = variants.Applied(self.setting, (), ExitStack())
        record = Run()
        for index in range(steps):
            try:
                _, value = self._one_step(applied, clock, False, record, False,
                                          capture_outputs=index == 0 and self.setting.forward_only)
            except StepRaised:
                return RoundedRun(record.update, record.losses, record.outputs)
            record.losses.append(self._loss_value(value, record))
            if index == 0:
                record.update = self._update(rounded_before)
        return RoundedRun(record.update, record.losses, record.outputs)


class OutputCapture:
    """Keeps what `models` return during one call (the tensors of a tuple, dict or dataclass output), on the host in
    float32 and at most MAX_OUTPUT_ELEMENTS of each: a forward-only step changes no parameter, and its outputs are
    what an option could get wrong. `models` are the outermost ones (TrainingObjects.models(): a submodule of a
    found model is dropped when it is found), and nothing is kept while Dynamo traces (a compiled forward's hooks)."""

    def __init__(self, torch: Any, models: list[Any]) -> None:
        self._torch = torch
        self._models = models
        self._handles: list[Any] = []
        self.tensors: list[Any] = []

    def __enter__(self) -> OutputCapture:
        self._handles = [model.register_forward_hook(self._keep) for model in self._models]
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for handle in self._handles:
            handle.remove()

    def _keep(self, _module: Any, _args: tuple, output: Any) -> None:
        torch = self._torch
        if getattr(torch.compiler, "is_compiling", lambda: False)():
            return
        for value in leaves(output):
            if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
                flat = value.detach().reshape(-1)
                stride = -(-flat.numel() // MAX_OUTPUT_ELEMENTS)
                self.tensors.append(flat[::stride].to("cpu", dtype=torch.float32, copy=True))


# Operators that draw from a random generator: compiled, inductor draws other numbers than eager from the same seed.
_RANDOM_OPS = frozenset({"bernoulli", "bernoulli_", "native_dropout", "rand", "rand_like", "randn", "randn_like",
                         "randint", "randint_like", "randperm", "normal", "normal_", "uniform_", "multinomial",
                         "exponential_", "geometric_", "cauchy_", "log_normal_", "random_"})


class ComputeDtypes:
    """Counts, during one step, the dtype of the first floating input of each matrix product, convolution and
    attention operator: what the step really computes in, after its own autocast (if any) chose. With the step's
    census, also whether a model's forward draws random numbers (dropout, a VAE's `torch.randn_like`)."""

    def __init__(self, torch: Any, census: StepCensus | None = None) -> None:
        self._tensor_type = torch.Tensor
        self._mode = handler_mode(self._record)
        self._census = census
        self.seen: dict[str, int] = {}
        self.random_in_forward = False

    def __enter__(self) -> ComputeDtypes:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._mode.__exit__(*exc_info)

    def _record(self, func: Any, args: tuple, kwargs: dict) -> Any:
        name = func.overloadpacket.__name__
        if name in _RANDOM_OPS and self._census is not None and self._census.forward_depth > 0:
            self.random_in_forward = True
        if name in _COMPUTE_OPS or name.startswith(_COMPUTE_PREFIXES):
            dtype = next((str(value.dtype) for value in (*args, *kwargs.values())
                          if isinstance(value, self._tensor_type) and value.is_floating_point()), None)
            if dtype is not None:
                self.seen[dtype] = self.seen.get(dtype, 0) + 1
        return func(*args, **kwargs)


def _rounded(torch: Any, tensor: Any, format_name: str, generator: Any) -> Any:
    if format_name == BF16:
        return tensor.to(torch.bfloat16).to(tensor.dtype)
    if format_name == FP16:
        return tensor.to(torch.float16).to(tensor.dtype)
    if format_name == TF32:
        # TF32 keeps 10 of float32's 23 mantissa bits: round to nearest at bit 13.
        bits = tensor.float().contiguous().view(torch.int32)
        return ((bits + 0x1000) & ~0x1FFF).view(torch.float32).to(tensor.dtype)
    if format_name == FP32:
        noise = torch.rand(tensor.shape, generator=generator) * 2 - 1
        return (tensor.float() * (1 + noise * FP32_CALIBRATION_ULPS * 2.0 ** -24)).to(tensor.dtype)
    raise ValueError(format_name)


def update_scale(update: list[Any] | None, reference: list[Any] | None) -> float | None:
    """The update's size along the reference's direction, <update, reference> / ||reference||^2 (1 when equal, 0 for
    no update, 65536 for one made of gradients still scaled), in float64; None as for `relative_difference`."""
    if update is None or reference is None:
        return None
    norm = sum(float((b.double() ** 2).sum()) for b in reference)
    if norm == 0:
        return None
    return sum(float((a.double() * b.double()).sum()) for a, b in zip(update, reference, strict=True)) / norm


def relative_difference(update: list[Any] | None, reference: list[Any] | None) -> float | None:
    """||update - reference|| / ||reference|| over all parameters, in float64; None when either is missing or the
    reference did not move (a step that updates nothing cannot be compared)."""
    if update is None or reference is None:
        return None
    difference = sum(float(((a.double() - b.double()) ** 2).sum()) for a, b in zip(update, reference, strict=True))
    norm = sum(float((b.double() ** 2).sum()) for b in reference)
    if norm == 0:
        return None
    return math.sqrt(difference / norm) if math.isfinite(difference) else math.inf
