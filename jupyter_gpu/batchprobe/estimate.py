"""`%batchprobe STEP --estimate`: predict the step's peak memory per batch size with fake tensors, run nowhere.

The user's real training step runs under `FakeTensorMode`: every operator computes only shapes, dtypes and
strides, so a batch that would need 60 GiB costs no memory and a few seconds of CPU. For the length of one
evaluation the parameters, buffers, gradients and optimizer state are swapped for fake tensors of the same
sizes; a `TensorBudget`-style counter adds up the storages that are alive (those fakes plus every new
storage the step creates, freed through weak references) and keeps the peak over two steps, so lazily
created optimizer state is included. Afterwards the user's own objects are put back (the swap is undone and
a `StateSnapshot` is restored), so the model is bitwise and by identity what it was.

What the count cannot see, and the assumptions that stand in for it (none of them checked on a GPU yet):
the CUDA context and library workspaces (`RESERVE_BYTES` is held back from each memory size), allocator
rounding and fragmentation (`margin` of the rest is kept free), and per-device differences of the fake CPU
run (CUDA picks foreach optimizers and other kernels, and `autocast("cuda")` does nothing on CPU tensors).

Safety: on a PyTorch build without CUDA, a fake CUDA tensor that autograd touches aborts the whole process
(a C++ `terminate`, the kernel dies). So tensors on a device whose backend is not available are refused
before the step runs (the model's) or the moment an operator produces one (the step's own), before any
backward can see it. torch is imported inside functions only.
"""

from __future__ import annotations

import copy
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from jupyter_gpu.batchprobe.budget import StorageCounter
from jupyter_gpu.batchprobe.estimate_result import MemoryEstimate, budget_bytes
from jupyter_gpu.batchprobe.result import AMP_DTYPES
from jupyter_gpu.batchprobe.search import Outcome, memory_line
from jupyter_gpu.probekit.training_state import StateSnapshot, TrainingObjects, find_training_objects
from jupyter_gpu.probekit.user_line import in_torch, innermost_user_frame, place_of
from jupyter_gpu.rendering.units import format_bytes

# Held back from every memory size for what tensors do not show: the CUDA context (about 0.3-1 GiB) and
# cuBLAS/cuDNN workspaces. 1 GiB as in the reference experiment (exp/predict_bs.py); an assumption, not yet
# compared with max_memory_reserved() on a real card.
RESERVE_BYTES = 1 << 30
# Each fake evaluation runs the step this many times: the first creates the optimizer's lazy state
# (Adam's moments), the second is the steady state that every later training step repeats.
STEPS_PER_EVALUATION = 2
# A memory size's search falls back to plain bisection after this many rounds of line predictions, so a
# step whose peak is far from linear still costs a bounded number of fake steps.
PREDICTION_ROUNDS = 3
# While the peak does not grow with the batch (small sizes can peak in optimizer.step), the first points
# double the size at most this many extra times looking for the per-sample growth.
GROWTH_DOUBLINGS = 4


class EstimateError(RuntimeError):
    """--estimate cannot run this step; the message is one sentence for the user."""


def estimate_peaks(step: Callable[[int], Any], sizes: list[int], *, namespace: dict[str, Any],
                   memory_sizes: list[int], margin: float = 0.1, start: int = 2, maximum: int = 65536,
                   reserve_bytes: int = RESERVE_BYTES, amp: str | None = None) -> MemoryEstimate:
    """Predict `step(batch_size)`'s peak memory at `sizes` and the largest batch size for each memory size.

    `sizes` are evaluated and reported as they are; the line comes from `start` and `2 * start` (doubled
    further while the peak does not grow), and each memory size's answer is checked by fake evaluations at
    the answer and the answer + 1. `amp` ("bf16"/"fp16") runs the step under autocast on the device the
    fake run uses. Raises EstimateError when the step cannot run on fake tensors.
    """
    import torch

    if start < 1 or maximum < start:
        raise ValueError("need 1 <= start <= maximum")
    began = time.perf_counter()
    objects = find_training_objects(namespace, step)
    device_type = _check_devices(torch, objects)
    snapshot = StateSnapshot.take(objects, step)  # the user's step: its counters and lists run for real here too
    if amp is not None:
        step = _under_autocast(torch, step, device_type, amp)
    notes = _object_notes(objects)
    points: dict[int, int] = {}

    def peak_at(size: int) -> int:
        if size not in points:
            points[size] = _evaluate(torch, step, size, objects, device_type, snapshot)
        return points[size]

    for size in sorted({min(size, maximum) for size in sizes if size >= 1}):
        peak_at(size)
    peak_at(start)
    size = min(2 * start, maximum)
    peak_at(size)
    for _ in range(GROWTH_DOUBLINGS):
        if _line(points) is not None or size >= maximum:
            break
        size = min(2 * size, maximum)
        peak_at(size)

    fits = {memory: _largest_fit(budget_bytes(memory, reserve_bytes, margin), peak_at, points, maximum)
            for memory in memory_sizes}
    line = _line(points)
    intercept, per_sample = line if line is not None else (float(max(points.values())), 0.0)
    if line is None:
        notes.append(f"the peak did not grow with the batch size up to {max(points)}: it is set by something "
                     "else (often optimizer.step), so every size up to the cap has the same prediction")
    for memory, fit in fits.items():
        if fit == maximum:
            notes.append(f"{format_bytes(memory)}: {maximum} is the --max cap, not the memory limit")
    notes.append(f"{device_type.upper()} fake run: the CUDA context and workspaces are covered only by the "
                 f"{format_bytes(reserve_bytes)} reserve and fragmentation by the {margin:.0%} margin; both are "
                 "assumptions not yet checked on a GPU")
    return MemoryEstimate(points=sorted(points.items()), intercept=intercept, per_sample=per_sample, fits=fits,
                          reserve_bytes=reserve_bytes, margin=margin, device=device_type,
                          seconds=time.perf_counter() - began, notes=notes)


# -- the search -------------------------------------------------------------------------------------------


def _line(points: dict[int, int]) -> tuple[float, float] | None:
    return memory_line([Outcome(size, True, peak) for size, peak in points.items()])


def _largest_fit(budget: int, peak_at: Callable[[int], int], points: dict[int, int], maximum: int) -> int:
    """The largest size whose peak fits `budget`, assuming the peak grows with the size; 0 when 1 does not."""
    if budget <= 0:  # the memory size is all reserve: nothing fits, and nothing needs evaluating
        return 0
    rounds = 0
    while True:
        fitting = [size for size, peak in points.items() if peak <= budget]
        failing = [size for size, peak in points.items() if peak > budget]
        low = max(fitting, default=0)
        high = min(failing, default=maximum + 1)
        if high - low <= 1 or low >= maximum:
            return min(low, maximum)
        rounds += 1
        guess = _guess(budget, points, low, high, maximum) if rounds <= PREDICTION_ROUNDS else None
        if guess is None:
            guess = (low + high) // 2 if high <= maximum else min(2 * low, maximum) if low else 1
        guess = min(max(guess, low + 1), high - 1)
        # The guess and the size after it: when the line is right, these two are the whole proof.
        for size in (guess, guess + 1):
            if low < size < high:
                peak_at(size)


def _guess(budget: int, points: dict[int, int], low: int, high: int, maximum: int) -> int | None:
    """Where the peak reaches the budget: between the bracketing points when both are known (they are the
    closest evidence), else on the line through the two largest points."""
    if low in points and high in points and points[high] > points[low]:
        per_sample = (points[high] - points[low]) / (high - low)
        return low + int((budget - points[low]) // per_sample)
    line = _line({size: peak for size, peak in points.items() if size < high})
    if line is None:
        return None
    intercept, per_sample = line
    return min(int((budget - intercept) // per_sample), maximum)


# -- one fake evaluation ---------------------------------------------------------------------------------


def _under_autocast(torch: Any, step: Callable[[int], Any], device_type: str, amp: str) -> Callable[[int], Any]:
    dtype = getattr(torch, AMP_DTYPES[amp])

    def autocast_step(size: int) -> Any:
        with torch.autocast(device_type=device_type, dtype=dtype):
            return step(size)
    return autocast_step


def _evaluate(torch: Any, step: Callable[[int], Any], size: int, objects: TrainingObjects, device_type: str,
              snapshot: StateSnapshot) -> int:
    """The predicted peak bytes of `STEPS_PER_EVALUATION` steps at `size`; the user's objects are restored."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    counter = _FakeCounter(torch, device_type)
    swap = _Swap(objects)
    try:
        # A fresh mode per evaluation: its memo of converted tensors would otherwise keep fakes alive.
        with FakeTensorMode(allow_non_fake_inputs=True):
            swap.install(torch, counter)
            with counter.trial():  # the peak starts from the fakes that exist before the step
                for _ in range(STEPS_PER_EVALUATION):
                    step(size)  # the returned loss (a fake) is dropped at once, as a training loop does
            return counter.peak_bytes
    except EstimateError:
        raise
    except Exception as error:
        if counter.refused is not None:  # the step caught our refusal and went on; the refusal is the story
            raise counter.refused from error
        unusable = _unusable_device_named(torch, str(error))
        if unusable is not None:  # e.g. x.to("cuda") fails inside the operator, before its output exists
            raise EstimateError(_device_message(unusable)) from error
        raise EstimateError(_failure_message(error)) from error
    finally:
        swap.remove()
        snapshot.restore()
        counter.close()


class _FakeCounter(StorageCounter):
    """Storage counting for fake tensors: no baseline (every counted storage is a fake we registered), no
    limit (it applies to the prediction, not the run), and the device guard."""

    def __init__(self, torch: Any, device_type: str) -> None:
        super().__init__(torch, device_type)
        self.refused: EstimateError | None = None

    def record(self, func: Any, out: Any) -> None:
        # Checked on the forward op's output, before autograd can record it: on a build without CUDA, the
        # backward of a fake CUDA tensor aborts the process instead of raising.
        if self.refused is not None:
            raise self.refused  # sticky: a step that swallowed the first refusal must not reach backward
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, self._torch.Tensor) and not _device_usable(self._torch, tensor.device.type):
                self.refused = EstimateError(_device_message(tensor.device.type))
                raise self.refused
        super().record(func, out)


class _Swap:
    """Puts fakes in the user's modules and optimizers for one evaluation, and the originals back."""

    def __init__(self, objects: TrainingObjects) -> None:
        self._objects = objects
        self._slots: list[tuple[dict[str, Any], str, Any]] = []  # (module slot dict, name, original)
        self._optimizers: list[tuple[Any, Any, Any]] = []  # (optimizer, original param_groups, original state)

    def install(self, torch: Any, counter: _FakeCounter) -> None:
        """Called inside the FakeTensorMode: every fake made here is counted as existing before the step."""
        fakes: dict[int, Any] = {}  # id(original) -> fake: tied weights stay tied; dropped on return

        def fake(tensor: Any) -> Any:
            if id(tensor) not in fakes:
                fakes[id(tensor)] = made = _fake_like(torch, tensor)
                counter.track(made)
                if made.grad is not None:
                    counter.track(made.grad)
            return fakes[id(tensor)]

        seen: set[int] = set()  # a submodule shared by two models is swapped once
        for module in self._objects.modules:
            for sub in module.modules():
                if id(sub) in seen:
                    continue
                seen.add(id(sub))
                for slot in (sub._parameters, sub._buffers):
                    for name, tensor in list(slot.items()):
                        if tensor is not None:
                            self._slots.append((slot, name, tensor))
                            slot[name] = fake(tensor)
        for optimizer in self._objects.optimizers:
            groups, state = optimizer.param_groups, optimizer.state
            self._optimizers.append((optimizer, groups, state))
            # New group dicts and a new state dict: the originals are never written, only set aside.
            optimizer.param_groups = [{**group, "params": [fake(p) for p in group["params"]]} for group in groups]
            new_state: defaultdict[Any, dict[Any, Any]] = defaultdict(dict)
            for param, entry in state.items():
                new_state[fake(param)] = _fake_tree(entry, fake, torch)
            optimizer.state = new_state

    def remove(self) -> None:
        for slot, name, original in reversed(self._slots):
            slot[name] = original
        for optimizer, groups, state in reversed(self._optimizers):
            optimizer.param_groups = groups
            optimizer.state = state
        self._slots.clear()
        self._optimizers.clear()


def _fake_like(torch: Any, tensor: Any) -> Any:
    """A fake of the same size, dtype, strides and device, with a fake .grad.

    empty_strided rather than `fake_mode.from_tensor`: the mode's converter memoises every converted tensor
    for as long as the real one lives, so a fake gradient the step frees (zero_grad) would never be freed.
    A 0-dim tensor (Adam's `step`, BatchNorm's counter) becomes a fake that knows its value: the optimizer
    reads `step.item()`, which a value-less fake refuses.
    """
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    if tensor.dim() == 0:
        with unset_fake_temporarily():
            value = tensor.detach().item()  # the real value, read outside the fake mode
        made = torch.tensor(value, dtype=tensor.dtype, device=tensor.device)
    else:
        made = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device=tensor.device)
    if isinstance(tensor, torch.nn.Parameter):
        made = torch.nn.Parameter(made, requires_grad=tensor.requires_grad)
        if tensor.grad is not None:
            made.grad = _fake_like(torch, tensor.grad)
    return made


def _fake_tree(value: Any, fake: Callable[[Any], Any], torch: Any) -> Any:
    """Optimizer state with every tensor replaced by its fake (LBFGS keeps lists of tensors)."""
    if isinstance(value, torch.Tensor):
        return fake(value)
    if isinstance(value, dict):
        return {key: _fake_tree(item, fake, torch) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_fake_tree(item, fake, torch) for item in value)
    return copy.deepcopy(value)


# -- devices and messages --------------------------------------------------------------------------------


def _device_usable(torch: Any, device_type: str) -> bool:
    """Whether fake tensors on this device type are safe: its backend is built and available."""
    if device_type in ("cpu", "meta"):
        return True
    if device_type == "cuda":
        return bool(torch.backends.cuda.is_built() and torch.cuda.is_available())
    backend = getattr(torch, device_type, None)
    available = getattr(backend, "is_available", None)
    return bool(callable(available) and available())


def _unusable_device_named(torch: Any, message: str) -> str | None:
    """The unusable device type an error message is about ("not linked with support for cuda devices")."""
    lowered = message.lower()
    for device_type in ("cuda", "xpu", "mps"):
        if device_type in lowered and not _device_usable(torch, device_type):
            return device_type
    return None


def _existing_tensors(objects: TrainingObjects) -> Iterator[Any]:
    for module in objects.modules:
        for tensor in (*module.parameters(), *module.buffers()):
            yield tensor
            if tensor.grad is not None:
                yield tensor.grad
    for optimizer in objects.optimizers:
        for group in optimizer.param_groups:
            yield from group["params"]
        for entry in optimizer.state.values():
            yield from (value for value in entry.values() if hasattr(value, "device"))


def _check_devices(torch: Any, objects: TrainingObjects) -> str:
    """Refuse unusable devices before anything runs; the device type whose memory is predicted."""
    types = {tensor.device.type for tensor in _existing_tensors(objects)}
    if "meta" in types:  # the snapshot that guarantees the restore needs real bytes to copy
        raise EstimateError("--estimate needs the model's weights on a real device: materialise the meta-device "
                            "model on 'cpu' (e.g. model.to_empty(device='cpu')) first.")
    for device_type in sorted(types):
        if not _device_usable(torch, device_type):
            raise EstimateError(_device_message(device_type))
    accelerators = sorted(types - {"cpu", "meta"})
    return accelerators[0] if accelerators else "cpu"


def _device_message(device_type: str) -> str:
    return (f"--estimate cannot use {device_type} tensors: this PyTorch has no usable {device_type} backend, and a "
            f"fake {device_type} tensor in backward would abort the kernel; write the step with a device variable "
            "and set it to 'cpu' for --estimate (tensor sizes are the same on every device).")


def _failure_message(error: BaseException) -> str:
    import torch
    from torch._subclasses import fake_tensor

    frames = list(traceback.walk_tb(error.__traceback__))
    user = innermost_user_frame(torch, frames)
    # The frames below the user's line are torch's: one in torch.utils.data means a DataLoader did the read.
    loader = next((frame for frame, _ in reversed(frames[user + 1 if user is not None else 0:])
                   if in_torch(torch, frame.f_code.co_filename, "utils", "data")), None)
    place = f" at {place_of(*frames[user])}" if user is not None else ""
    read = _reading_operation(error, fake_tensor, frames)
    detail = None
    if read is not None and loader is not None:  # torch's own .item() is not the user's to change: the loader is
        detail = f"a DataLoader iteration: {loader.f_code.co_qualname} in torch.utils.data asks for {read[0]}"
    elif read is not None:
        detail = f"{read[0]}: {read[1]}"
    elif isinstance(error, (fake_tensor.UnsupportedOperatorException, fake_tensor.UnsupportedFakeTensorException)):
        detail = f"an operator fake tensors do not support: {error}"
    if detail is not None:
        return (f"--estimate cannot run this step with fake tensors: it reads tensor values ({detail}){place}. "
                "Run the real probe with --max-memory instead.")
    first_line = (str(error).strip().splitlines() or [""])[0][:200]
    return (f"--estimate: the step raised {type(error).__name__} on fake tensors ({first_line}){place}; "
            "if it runs for real, use the real probe with --max-memory instead.")


def _reading_operation(error: BaseException, fake_tensor: Any, frames: list[tuple[Any, int]]
                       ) -> tuple[str, str] | None:
    """What was read and the code that reads it that way, from the error the fake mode raised (None: not a
    read): ("a tensor's value as a Python number", ".item(), int(), ...")."""
    operator = getattr(error, "func", None)
    name = str(operator)  # "aten.nonzero.default"
    if isinstance(error, fake_tensor.DataDependentOutputException):
        if "_local_scalar_dense" not in name:
            return "a tensor's values", name
        # .tolist() makes one Python number per element; FakeTensor.tolist is the frame that asks for them.
        if any(frame.f_code.co_name == "tolist" for frame, _ in frames):
            return "a tensor's values as Python numbers", ".tolist()"
        return "a tensor's value as a Python number", ".item(), int(), float(), bool() or an `if` on a tensor"
    if isinstance(error, fake_tensor.DynamicOutputShapeException):
        return "an output shape that depends on values", f"{name}, as in nonzero(), boolean-mask indexing or unique()"
    if "numpy() is not supported for tensor subclasses" in str(error):
        return "a tensor's values as a NumPy array", ".numpy()"
    return None


def _object_notes(objects: TrainingObjects) -> list[str]:
    notes = []
    in_modules = {id(param) for module in objects.modules for param in module.parameters()}
    loose = {id(param) for optimizer in objects.optimizers for group in optimizer.param_groups
             for param in group["params"] if id(param) not in in_modules}
    if not objects.modules:
        notes.append("no nn.Module was found in the namespace or the step: only what the step creates is counted")
    if loose:
        notes.append(f"{len(loose)} optimizer parameter(s) belong to no module that was found: their module keeps "
                     "its real weights during the fake run, so their activations may be undercounted")
    return notes
