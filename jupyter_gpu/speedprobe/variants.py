"""Apply each `%speedprobe` option to the user's step without editing their code, and undo it.

Every change is registered on an ExitStack as it is made, so closing the stack undoes exactly what was done,
also when the step raised or Ctrl-C came half-way. What the undo cannot reach by itself (parameters converted
to channels_last, optimizer param groups switched to fused, state a step created) the runner's StateSnapshot
puts back bitwise afterwards; the process-wide switches (TF32, cudnn.benchmark) are `flags.GlobalFlags`'.

Probe layer: torch is imported inside functions only; nothing here initialises CUDA (the device questions are
asked only of a model that already lives on CUDA).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpu.probekit.training_state import TrainingObjects, compiled_how
from jupyter_gpu.speedprobe.flags import enable_tf32, tf32_enabled

# The convolutions channels_last changes (4-D weights); cudnn.benchmark also tunes 1-D/3-D ones and RNNs.
_CONV_2D = ("Conv2d", "ConvTranspose2d", "LazyConv2d", "LazyConvTranspose2d")
_CUDNN_MODULES = ("Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
                  "RNN", "LSTM", "GRU")
# oneDNN's channel block per torch CPU capability: input channels in floats per vector register (AVX-512: 16, AVX2: 8).
_ONEDNN_CHANNEL_BLOCK = {"AVX512": 16, "AVX2": 8}
_DROPOUT_MODULES = ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout")
_REDUCED_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}
_MISSING = object()
# Where torch.nn.utils.clip_grad_norm_ and clip_grad_value_ (and get_total_norm, clip_grads_with_norm_) read the
# gradients: every one of them, also when the user imported it by name before the probe ran, looks this helper up in
# torch.nn.utils.clip_grad's globals at call time (torch 2.x), so wrapping it there reaches them all.
_CLIP_GRAD_READERS = ("_group_tensors_by_device_and_dtype",)
# The public names, for a torch whose clipping does not go through that helper.
_CLIP_FUNCTIONS = ("clip_grad_norm_", "clip_grad_norm", "clip_grad_value_", "get_total_norm", "clip_grads_with_norm_")
_TENSOR_ARGUMENTS = ("parameters", "tensors", "tensorlistlist")  # how those functions name their first argument


@dataclass
class StepSetting:
    """What the options are applied to: the user's training objects, where the model lives."""

    torch: Any
    objects: TrainingObjects
    device: Any  # torch.device of the model's first parameter
    # The dtypes the step's matrix products and convolutions ran in, counted on the baseline's step (empty before).
    compute_dtypes: dict[str, int] = field(default_factory=dict)
    # The baseline's step trained nothing (no optimizer step, no gradient): evaluation or inference.
    forward_only: bool = False
    # A model's forward drew random numbers in the baseline's step (dropout, a VAE's torch.randn_like).
    random_in_forward: bool = False

    @property
    def device_type(self) -> str:
        return str(self.device.type)

    def module_classes(self) -> set[str]:
        return {type(sub).__name__ for module in self.objects.modules for sub in module.modules()}

    def has_dropout(self) -> bool:
        if self.module_classes() & set(_DROPOUT_MODULES):
            return True
        return any(float(getattr(sub, "dropout", 0) or 0) > 0 for module in self.objects.modules
                   for sub in module.modules() if type(sub).__name__ == "MultiheadAttention")

    def draws_random_numbers(self) -> bool:
        """A model's forward draws random numbers: compiled, inductor draws others than eager from the same seed."""
        return self.random_in_forward or self.has_dropout()

    def parameter_dtypes(self) -> set[Any]:
        return {param.dtype for module in self.objects.modules for param in module.parameters()}

    def own_autocast(self) -> str | None:
        """Why the step already computes in a reduced format of its own (its autocast), or None: some of its matrix
        products or convolutions ran in bfloat16 or float16 while the parameters are not (the caller checks that)."""
        reduced = {dtype: count for dtype, count in self.compute_dtypes.items() if dtype in _REDUCED_DTYPES}
        if not reduced:
            return None
        dtype = max(reduced, key=lambda name: reduced[name])
        total = sum(self.compute_dtypes.values())
        return (f"the step already uses {_REDUCED_DTYPES[dtype]} autocast: {sum(reduced.values())} of the {total} "
                f"matrix products and convolutions it ran were in {dtype}, and its own autocast would override the "
                "probe's")


def why_not(name: str, setting: StepSetting) -> str | None:
    """Why option `name` cannot apply to this step here, in words; None when it applies."""
    torch = setting.torch
    cuda = setting.device_type == "cuda"
    modules = setting.objects.modules
    needs_model = "no torch.nn.Module was found in the notebook or in what the step refers to"
    if name in ("amp-bf16", "amp-fp16"):
        if any(scaler.is_enabled() for scaler in setting.objects.scalers):
            return "the step already uses a GradScaler (mixed precision)"
        reduced = setting.parameter_dtypes() & {torch.float16, torch.bfloat16}
        if reduced:
            return f"the model's parameters are already {', '.join(sorted(str(d) for d in reduced))}"
        own = setting.own_autocast()
        if own is not None:
            return own
        if setting.device_type not in ("cuda", "cpu"):
            return f"autocast is tried on CUDA and the CPU; this model is on {setting.device}"
        if name == "amp-fp16":
            closure = next((opt for opt in setting.objects.optimizers if _step_needs_closure(opt)), None)
            if closure is not None:
                return closure_refused(closure)
        if name == "amp-bf16" and cuda and not getattr(torch.version, "hip", None):
            # torch.cuda.is_bf16_supported() asks the current device, not the step's; its rule is the same:
            # compute capability 8.0 or newer (below that, bfloat16 is emulated, slower than float32).
            major, minor = torch.cuda.get_device_capability(setting.device)
            if major < 8:
                return (f"{torch.cuda.get_device_name(setting.device)} has no native bfloat16: it needs compute "
                        f"capability 8.0 (Ampere) or newer, this GPU is {major}.{minor}")
        return None
    if name == "tf32":
        if not cuda:
            return f"TF32 is a format of NVIDIA GPUs (Ampere and newer); this step runs on {setting.device}"
        major, minor = torch.cuda.get_device_capability(setting.device)
        if major < 8:
            return f"TF32 needs compute capability 8.0 (Ampere) or newer; this GPU is {major}.{minor}"
        if tf32_enabled(torch):
            return "TF32 is already on for matmuls and convolutions"
        return None
    if name == "cudnn-benchmark":
        if not cuda:
            return f"cudnn.benchmark tunes cuDNN's convolutions on CUDA; this step runs on {setting.device}"
        if not setting.module_classes() & set(_CUDNN_MODULES):
            return "the model has no convolutions or RNNs for cuDNN to tune"
        if torch.backends.cudnn.benchmark:
            return "torch.backends.cudnn.benchmark is already True"
        return None
    if name == "channels-last":
        if not modules:
            return needs_model
        if not setting.module_classes() & set(_CONV_2D):
            return "the model has no 2-D convolutions (channels_last is a layout for 4-D image tensors)"
        if _all_channels_last(torch, modules):
            return "the model's 4-D weights are already channels_last"
        return _onednn_1x1_strided_backward(setting)
    if name == "fused-optimizer":
        if setting.forward_only:
            return "the step runs no optimizer step (it trains nothing: evaluation or inference)"
        if not setting.objects.optimizers:
            return "no torch.optim optimizer was found in the notebook or in what the step refers to"
        reasons = [_optimizer_why_not(torch, optimizer) for optimizer in setting.objects.optimizers]
        if all(reason is not None for reason in reasons):
            return "; ".join(dict.fromkeys(reason for reason in reasons if reason is not None))
        return None
    if name in ("compile", "compile-reduce-overhead"):
        if not modules:
            return needs_model
        if not hasattr(torch, "compile"):
            return f"torch {torch.__version__} has no torch.compile"
        compiled = {compiled_how(module) for module in modules}
        for how in ("model.compile()", "torch.compile(model)"):
            if how in compiled:
                return f"the model is already compiled ({how})"
        if name == "compile-reduce-overhead" and not cuda:
            return f"reduce-overhead records CUDA graphs; this step runs on {setting.device}"
        return None
    raise ValueError(f"unknown option {name!r}")


def _onednn_1x1_strided_backward(setting: StepSetting) -> str | None:
    """Why channels_last must not be tried on this CPU step, or None. oneDNN's x86 backward of a 1x1 convolution with
    a stride, in channels_last, with fewer input channels than its vector block (16 floats on AVX-512, 8 on AVX2)
    writes past its buffer: oneDNN issue #6035 (open). Here (torch 2.13, AVX-512) Conv2d(8, 16, 1, stride=2) on 64x64
    images killed the process with SIGSEGV, and the issue reports hangs and wrong weight gradients on AVX2. A
    ResNet's downsampling shortcut on narrow stages is that convolution."""
    torch = setting.torch
    if setting.device_type != "cpu" or setting.forward_only:
        return None
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return None
    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)  # torch 2.2 and newer
    block = _ONEDNN_CHANNEL_BLOCK.get(capability()) if capability is not None else None
    if block is None:
        return None
    for model in setting.objects.modules:
        for name, sub in model.named_modules():
            if (type(sub).__name__ in ("Conv2d", "LazyConv2d") and tuple(sub.kernel_size) == (1, 1)
                    and tuple(sub.stride) != (1, 1) and sub.weight.requires_grad
                    and sub.in_channels // sub.groups < block):
                where = f"`{name}`, " if name else ""
                return (f"on this CPU, oneDNN's backward of a 1x1 convolution with a stride and fewer than {block} "
                        f"input channels ({where}{sub.in_channels // sub.groups}) writes past its buffer in "
                        "channels_last: the kernel's process crashes (segmentation fault) or hangs, or the weight "
                        "gradients come out wrong (oneDNN issue #6035)")
    return None


def _all_channels_last(torch: Any, modules: list[Any]) -> bool:
    weights = [param for module in modules for param in module.parameters() if param.dim() == 4]
    return bool(weights) and all(param.is_contiguous(memory_format=torch.channels_last)
                                 and not param.is_contiguous() for param in weights)


def _optimizer_why_not(torch: Any, optimizer: Any) -> str | None:
    """Why this optimizer cannot be switched to a fused or foreach implementation, or None."""
    kind = type(optimizer).__name__
    if _fused_possible(torch, optimizer):
        return None
    if _takes(optimizer, "foreach") and not all(group.get("foreach") for group in optimizer.param_groups):
        return None
    if all(group.get("fused") for group in optimizer.param_groups):
        return f"{kind} is already fused"
    if all(group.get("foreach") for group in optimizer.param_groups):
        return f"{kind} already uses foreach and has no fused implementation here"
    return f"{kind} has neither a fused nor a foreach implementation"


def _takes(optimizer: Any, argument: str) -> bool:
    try:
        return argument in inspect.signature(type(optimizer).__init__).parameters
    except (TypeError, ValueError):
        return False


def _fused_possible(torch: Any, optimizer: Any) -> bool:
    """The class takes fused=True, its groups are not fused yet, and every parameter is a floating tensor on a
    device with fused kernels (torch's own check, done here so the switch does not fail inside the step)."""
    if not _takes(optimizer, "fused") or all(group.get("fused") for group in optimizer.param_groups):
        return False
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
        devices = set(_get_fused_kernels_supported_devices())
    except ImportError:
        devices = {"cuda"}
    params = [param for group in optimizer.param_groups for param in group["params"]]
    if any(group.get("differentiable") for group in optimizer.param_groups):
        return False
    return all(param.device.type in devices and torch.is_floating_point(param) for param in params)


# -- applying -----------------------------------------------------------------------------------------------------

@dataclass
class Fp16Scaling:
    """The GradScaler the amp-fp16 option adds: it scales the loss in `loss.backward()`, unscales the gradients
    before the step clips them, and steps through `scaler.step(optimizer)`, counting what the agreement check needs."""

    scaler: Any
    initial_scale: float
    scaled_backwards: int = 0
    steps: int = 0
    skipped_steps: int = 0
    inside_scaler: bool = False
    scaled_since_update: bool = False  # a scaled backward ran since the last scaler.update(): the gradients are scaled
    unscaled_for_clipping: int = 0     # scaler.unscale_(optimizer) calls placed before the step's gradient clipping
    # The first call's gradients changed between backward() and optimizer.step() while still scaled, by code the probe
    # could not put scaler.unscale_ in front of (the step's own clipping): the first update says nothing about fp16.
    unplaced_change: bool = False
    watching: bool = True              # fingerprint the gradients (the first call only: it costs operators)
    fingerprints: dict[int, Any] = field(default_factory=dict)  # id(optimizer) -> its gradients after backward()


@dataclass
class Applied:
    """An applied configuration: `call(step)` runs one step under it; the stack undoes it."""

    setting: StepSetting
    names: tuple[str, ...]
    stack: ExitStack
    around_call: list[Callable[[], contextlib.AbstractContextManager[Any]]] = field(default_factory=list)
    after_call: list[Callable[[], None]] = field(default_factory=list)
    fp16: Fp16Scaling | None = None
    notes: list[str] = field(default_factory=list)
    # Dropout draws the baseline's masks, for the agreement run (compiled: eager's generator; channels_last: the
    # logical order).
    same_random_numbers: bool = False
    fp16_init_scale: float | None = None  # where amp-fp16's GradScaler starts; None: GradScaler's own 65536

    def call(self, step: Callable[[], Any]) -> Any:
        with ExitStack() as per_call:
            for make in self.around_call:
                per_call.enter_context(make())
            value = step()
        for hook in self.after_call:
            hook()
        return value


def apply(names: tuple[str, ...], setting: StepSetting, stack: ExitStack, same_random_numbers: bool = False,
          fp16_init_scale: float | None = None) -> Applied:
    """Apply the options in `names` (already checked with `why_not`); every change is undone by `stack`."""
    applied = Applied(setting, names, stack, same_random_numbers=same_random_numbers,
                      fp16_init_scale=fp16_init_scale)
    for name in names:
        _APPLY[name](applied)
    return applied


def _amp(dtype_name: str) -> Callable[[Applied], None]:
    def apply_amp(applied: Applied) -> None:
        torch = applied.setting.torch
        device_type = applied.setting.device_type
        dtype = getattr(torch, dtype_name)
        # Without its weight cache: autocast runs around the whole step, and a step that evaluates under no_grad
        # before it trains (nanoGPT's `estimate_loss()` every N iterations) cached weight casts made without autograd
        # history, which the training forward then reused: 12 of a small GPT's weights got no gradient, and correct
        # bf16 was called "faster but wrong". Each weight is cast once per forward either way.
        applied.around_call.append(lambda: torch.autocast(device_type, dtype=dtype, cache_enabled=False))
        if dtype_name == "float16" and not applied.setting.forward_only:  # no gradients, nothing to scale
            _add_grad_scaler(applied)
    return apply_amp


def _add_grad_scaler(applied: Applied) -> None:
    """Loss scaling without editing the step: `Tensor.backward` scales a scalar loss, gradient clipping unscales
    first, each optimizer's `step` goes through `scaler.step`, and `scaler.update()` runs after every call."""
    torch = applied.setting.torch
    optimizers = applied.setting.objects.optimizers
    start = {} if applied.fp16_init_scale is None else {"init_scale": applied.fp16_init_scale}
    scaler = torch.amp.GradScaler(applied.setting.device_type, **start)
    scaling = Fp16Scaling(scaler, float(scaler.get_scale()))
    applied.fp16 = scaling
    original_backward = torch.Tensor.backward

    def scaled_backward(tensor: Any, gradient: Any = None, *args: Any, **kwargs: Any) -> Any:
        if gradient is None and tensor.numel() == 1 and tensor.is_floating_point():
            scaling.scaled_backwards += 1
            scaling.scaled_since_update = True
            outcome = original_backward(scaler.scale(tensor), None, *args, **kwargs)
            if scaling.watching:
                for optimizer in optimizers:
                    scaling.fingerprints[id(optimizer)] = _gradient_fingerprint(torch, optimizer)
            return outcome
        return original_backward(tensor, gradient, *args, **kwargs)

    @contextlib.contextmanager
    def patched_backward() -> Iterator[None]:
        torch.Tensor.backward = scaled_backward
        try:
            yield
        finally:
            torch.Tensor.backward = original_backward

    applied.around_call.append(patched_backward)
    applied.around_call.append(lambda: _unscaling_before_clipping(torch, scaling, optimizers))
    for optimizer in optimizers:
        _route_step_through_scaler(applied, optimizer, scaling)
    steps_seen = [0]

    def update() -> None:
        # Once per call of the step, and only after a scaler.step (update() asserts an inf check was recorded).
        scaling.watching = False
        scaling.fingerprints.clear()
        if scaling.steps > steps_seen[0]:
            steps_seen[0] = scaling.steps
            scaler.update()
            scaling.scaled_since_update = False

    applied.after_call.append(update)


@contextlib.contextmanager
def _unscaling_before_clipping(torch: Any, scaling: Fp16Scaling, optimizers: list[Any]) -> Iterator[None]:
    """For the duration of a call, gradient clipping first unscales the gradients it is given, as PyTorch's AMP
    recipe does (`scaler.unscale_(opt)` before `clip_grad_norm_`): clipping gradients still multiplied by the scale
    (65536) would clip them all, and the update would shrink to nothing."""
    import torch.nn.utils as nn_utils
    import torch.nn.utils.clip_grad as clip_grad

    def unscaling(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def unscale_then(*args: Any, **kwargs: Any) -> Any:
            # The tensors come first, or by name; a generator of parameters is read here first: keep its items.
            key = next((name for name in _TENSOR_ARGUMENTS if name in kwargs), None)
            if args:
                args = (_listed(torch, args[0]), *args[1:])
                _unscale_owners(torch, scaling, optimizers, args[0])
            elif key is not None:
                kwargs[key] = _listed(torch, kwargs[key])
                _unscale_owners(torch, scaling, optimizers, kwargs[key])
            return original(*args, **kwargs)
        return unscale_then

    with ExitStack() as patches:
        for owner, names in ((clip_grad, (*_CLIP_GRAD_READERS, *_CLIP_FUNCTIONS)), (nn_utils, _CLIP_FUNCTIONS)):
            for name in names:
                original = owner.__dict__.get(name)
                if callable(original):
                    setattr(owner, name, unscaling(original))
                    patches.callback(setattr, owner, name, original)
        yield


def _listed(torch: Any, tensors: Any) -> Any:
    if isinstance(tensors, torch.Tensor | list | tuple):
        return tensors
    return list(tensors)


def _unscale_owners(torch: Any, scaling: Fp16Scaling, optimizers: list[Any], tensors: Any) -> None:
    """`scaler.unscale_` every optimizer whose parameters (or their gradients) are among `tensors` and whose gradients
    are still scaled, once between two updates, as the recipe places it."""
    if not scaling.scaled_since_update:
        return
    given = {id(tensor) for tensor in _flat_tensors(torch, tensors)}
    for optimizer in optimizers:
        state = scaling.scaler._per_optimizer_states[id(optimizer)]
        if getattr(state.get("stage"), "name", None) != "READY":
            continue  # unscaled already, or stepped
        params = [param for group in optimizer.param_groups for param in group["params"]]
        if any(id(param) in given or (param.grad is not None and id(param.grad) in given) for param in params):
            scaling.scaler.unscale_(optimizer)
            scaling.unscaled_for_clipping += 1


def _flat_tensors(torch: Any, value: Any) -> Iterator[Any]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _flat_tensors(torch, item)


def _gradient_fingerprint(torch: Any, optimizer: Any) -> tuple[tuple[bool, ...], Any]:
    """Which parameters have gradients and the norm of each: equal before and after, the gradients are untouched."""
    grads = [param.grad for group in optimizer.param_groups for param in group["params"]]
    present = tuple(grad is not None for grad in grads)
    dense = [grad for grad in grads if grad is not None and not grad.is_sparse]
    if not dense:
        return present, None
    norms = torch.stack([norm.float().to(dense[0].device) for norm in torch._foreach_norm(dense)])
    # Compared bit for bit: gradients that overflowed have inf or NaN norms, and NaN equals nothing, not even itself.
    return present, norms.view(torch.int32)


def _same_fingerprint(torch: Any, before: tuple[tuple[bool, ...], Any], after: tuple[tuple[bool, ...], Any]) -> bool:
    if before[0] != after[0]:
        return False
    if before[1] is None or after[1] is None:
        return before[1] is None and after[1] is None
    return bool(torch.equal(before[1], after[1]))


def _step_needs_closure(optimizer: Any) -> bool:
    """The optimizer's step takes a closure it cannot do without (LBFGS: `step(self, closure)`, no default)."""
    try:
        parameter = inspect.signature(type(optimizer).step).parameters.get("closure")
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.default is inspect.Parameter.empty


def closure_refused(optimizer: Any) -> str:
    """Why fp16 cannot be tried on a step that steps `optimizer` through a closure."""
    return (f"GradScaler cannot step an optimizer through a closure ({type(optimizer).__name__}.step(closure)): "
            "torch's GradScaler.step refuses closures (\"Closure use is not currently supported if GradScaler is "
            "enabled\"), so fp16 needs the step rewritten without one; bf16 autocast needs no GradScaler")


class ClosureStepRefused(RuntimeError):
    """The step stepped its optimizer through a closure under the probe's GradScaler (see `closure_refused`)."""


def _route_step_through_scaler(applied: Applied, optimizer: Any, scaling: Fp16Scaling) -> None:
    # An LR scheduler has already put its own wrapper on the instance: keep it and put it back afterwards.
    previous = optimizer.__dict__.get("step", _MISSING)
    inner_step = optimizer.step

    # wraps() carries the scheduler wrapper's marker over: without it the scheduler warns that optimizer.step
    # "has been overridden after learning rate scheduler initialization".
    @functools.wraps(inner_step)
    def step_through_scaler(*args: Any, **kwargs: Any) -> Any:
        if not scaling.inside_scaler and (args or kwargs.get("closure") is not None):
            # An optional closure (SGD's, SAM's): it would run its backward scaled and step on gradients no
            # GradScaler unscaled, and GradScaler.step itself refuses a closure. Say so; never judge fp16 on it.
            raise ClosureStepRefused(closure_refused(optimizer))
        if scaling.inside_scaler or not scaling.scaled_backwards:
            return inner_step(*args, **kwargs)  # GradScaler.step calling back in, or nothing was scaled
        _check_untouched(applied.setting.torch, scaling, optimizer)
        scaling.inside_scaler = True
        try:
            scaling.steps += 1
            outcome = scaling.scaler.step(optimizer, *args, **kwargs)
        finally:
            scaling.inside_scaler = False
        state = scaling.scaler._per_optimizer_states.get(id(optimizer), {})
        if sum(float(found.item()) for found in state.get("found_inf_per_device", {}).values()):
            scaling.skipped_steps += 1
        return outcome

    optimizer.step = step_through_scaler
    applied.stack.callback(_put_back_attribute, optimizer, "step", previous)


def _check_untouched(torch: Any, scaling: Fp16Scaling, optimizer: Any) -> None:
    """Note a change of the still-scaled gradients since backward() (the step's own clipping, which the probe could
    not unscale first); gradients the probe unscaled before clipping may change, as in the recipe."""
    before = scaling.fingerprints.get(id(optimizer))
    if before is None:
        return
    state = scaling.scaler._per_optimizer_states[id(optimizer)]
    if getattr(state.get("stage"), "name", None) != "READY":
        return
    if not _same_fingerprint(torch, before, _gradient_fingerprint(torch, optimizer)):
        scaling.unplaced_change = True


def _put_back_attribute(owner: Any, name: str, previous: Any) -> None:
    if previous is _MISSING:
        owner.__dict__.pop(name, None)
    else:
        owner.__dict__[name] = previous


def _tf32(applied: Applied) -> None:
    enable_tf32(applied.setting.torch)  # GlobalFlags, taken by the runner, puts the old values back


def _cudnn_benchmark(applied: Applied) -> None:
    applied.setting.torch.backends.cudnn.benchmark = True


def _channels_last(applied: Applied) -> None:
    # The parameter objects stay (Module.to swaps their data); the snapshot restores their layout and bytes.
    torch = applied.setting.torch
    if applied.same_random_numbers and applied.setting.has_dropout():
        _dropout_in_logical_order(applied)
    for module in applied.setting.objects.modules:
        module.to(memory_format=torch.channels_last)
    # The optimizer's per-parameter state follows, as it would for an optimizer created after the conversion:
    # fused SGD on channels_last weights with the contiguous momentum buffers of earlier steps computed a wrong
    # update (0.23 off, relative, on a ResNet-style CNN, torch 2.13 CPU). The snapshot gives back the old tensors.
    for optimizer in applied.setting.objects.optimizers:
        for param, state in optimizer.state.items():
            if param.dim() != 4:
                continue
            for key, value in list(state.items()):
                if isinstance(value, torch.Tensor) and value.shape == param.shape:
                    state[key] = value.contiguous(memory_format=torch.channels_last)


def optimizer_note(label: str, optimizer: Any, flag: str) -> str:
    """The note saying which implementation an optimizer was switched to ("optD (Adam): fused=True"); the runner
    reads it back to write each optimizer's line to adopt."""
    return f"{label} ({type(optimizer).__name__}): {flag}=True"


def _dropout_in_logical_order(applied: Applied) -> None:
    """Dropout draws its mask in memory order, so on a channels_last activation it zeroes other elements than on the
    baseline's contiguous one from the same seed (a CNN's update then differs by half, numerics aside). For the
    agreement run only, dropout on a 4-D channels_last tensor draws on a contiguous copy, as the baseline did, and
    gives the result back in channels_last."""
    torch = applied.setting.torch
    functional = torch.nn.functional
    original = functional.dropout

    def dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        if (isinstance(input, torch.Tensor) and input.dim() == 4 and not input.is_contiguous()
                and input.is_contiguous(memory_format=torch.channels_last)):
            return original(input.contiguous(), p, training, False).contiguous(memory_format=torch.channels_last)
        return original(input, p, training, inplace)

    functional.dropout = dropout
    applied.stack.callback(setattr, functional, "dropout", original)


def _fused_optimizer(applied: Applied) -> None:
    torch = applied.setting.torch
    labels = applied.setting.objects.labels
    for optimizer in applied.setting.objects.optimizers:
        label = labels.get(id(optimizer), type(optimizer).__name__)
        if _fused_possible(torch, optimizer):
            for group in optimizer.param_groups:
                group["fused"], group["foreach"] = True, False
            _move_steps_to_parameters(optimizer)
            applied.notes.append(optimizer_note(label, optimizer, "fused"))
        elif _takes(optimizer, "foreach") and not all(group.get("foreach") for group in optimizer.param_groups):
            for group in optimizer.param_groups:
                group["foreach"] = True
            applied.notes.append(optimizer_note(label, optimizer, "foreach"))


def _move_steps_to_parameters(optimizer: Any) -> None:
    """Fused kernels keep the step count as a float32 tensor on the parameter's device (what load_state_dict
    does for fused=True); a count left on the CPU by earlier non-fused steps would fail the fused step. The
    snapshot gives the entries their original tensors back."""
    import torch

    for param, state in optimizer.state.items():
        step = state.get("step")
        if isinstance(step, torch.Tensor) and step.device != param.device:
            state["step"] = step.to(device=param.device, dtype=torch.float32)


def _compile(mode: str | None) -> Callable[[Applied], None]:
    def apply_compile(applied: Applied) -> None:
        torch = applied.setting.torch
        if applied.same_random_numbers and applied.setting.draws_random_numbers():
            # Inductor draws its own random numbers; with this, dropout and randn_like use eager's generator, so the
            # compiled step draws the baseline's numbers and the updates can be compared. It changes the speed, so
            # the runner times the step compiled as the user would compile it and uses this only for the agreement.
            import torch._inductor.config as inductor_config

            applied.stack.enter_context(inductor_config.patch(fallback_random=True))
        for module in applied.setting.objects.modules:
            # The instance's forward, compiled: what torch.compile(model) runs. model.compile() compiles
            # Module._call_impl instead, and on torch 2.13 Dynamo skips that frame for nn.Sequential (torch's own
            # file), compiling nothing without a word.
            previous = module.__dict__.get("forward", _MISSING)
            module.forward = torch.compile(module.forward, **({"mode": mode} if mode else {}))
            applied.stack.callback(_put_back_attribute, module, "forward", previous)
    return apply_compile


def compiled_graphs(torch: Any) -> int:
    """How many graphs torch.compile has compiled in this process so far (Dynamo's own counter)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


_APPLY: dict[str, Callable[[Applied], None]] = {
    "amp-bf16": _amp("bfloat16"),
    "amp-fp16": _amp("float16"),
    "tf32": _tf32,
    "cudnn-benchmark": _cudnn_benchmark,
    "channels-last": _channels_last,
    "fused-optimizer": _fused_optimizer,
    "compile": _compile(None),
    "compile-reduce-overhead": _compile("reduce-overhead"),
}
