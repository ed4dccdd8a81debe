"""Why a training step failed during a batch-size probe: out of memory, a size limit, or a dead CUDA context.

Pure Python: no torch or IPython imports, so the classification is testable anywhere and importing it
never initialises CUDA. torch's exception classes are recognised by name in the type's MRO instead.

Three outcomes matter to the probe, and each needs a different reaction:

- **out of memory**: the size is too big; free the failed attempt and try a smaller one.
- **size limit**: not memory, but this size can never run (INT_MAX elements, the CUDA grid limit of 65535,
  Triton shared memory). Stop searching upward and report a limit, not "memory".
- **sticky CUDA error**: an illegal address or a device-side assert leaves the CUDA context unusable; every
  later CUDA call fails the same way. Stop and tell the user to restart the kernel.

Anything else is the user's bug: `classify` returns None and the probe re-raises it unchanged.
The message strings come from the §1.6 table of the research notes (timing-batch-memory.md), checked against
torch 2.13; no other finder (accelerate, Lightning, toma) recognises all of them, nor an OOM wrapped in
another exception.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from jupyter_gpu.probekit.exceptions import exception_chain
from jupyter_gpu.rendering.units import format_bytes
from jupyter_gpu.torch_errors.oom import TORCH_OOM_TYPE, device_out_of_memory, find_oom_marker

# Our own memory budget (for CPU, MPS or XPU runs that pretend to be a smaller GPU) raises
# torch.OutOfMemoryError with this marker, so the probe can tell its own refusal from a real allocator's.
BUDGET_MARKER = "(jupyter-gpu memory budget)"

_MESSAGE_LIMIT = 200


class FailureKind(enum.StrEnum):
    OUT_OF_MEMORY = "out of memory"
    SIZE_LIMIT = "size limit"
    STICKY = "sticky CUDA error"


@dataclass(frozen=True)
class Failure:
    """What `classify` recognised in a failed step, enough for the probe's report without the exception."""

    kind: FailureKind
    flavour: str  # where it came from, for the report: "CUDA caching allocator", "cuDNN", "CUDA grid limit", ...
    message: str  # the first line of the matched exception's message, trimmed
    chained: bool  # found in __cause__/__context__ rather than in the raised exception itself


@dataclass(frozen=True)
class _Rule:
    kind: FailureKind
    flavour: str
    marker: str


# Checked in order against the message of a RuntimeError (or subclass), before the shared out-of-memory table
# (`jupyter_gpu.torch_errors.oom`) and the generic " out of memory" fallback below.
_STICKY_RULES = (
    _Rule(FailureKind.STICKY, "illegal memory access", "an illegal memory access was encountered"),
    _Rule(FailureKind.STICKY, "device-side assert", "device-side assert triggered"),
    _Rule(FailureKind.STICKY, "unspecified launch failure", "unspecified launch failure"),
    _Rule(FailureKind.STICKY, "illegal instruction", "an illegal instruction was encountered"),
    _Rule(FailureKind.STICKY, "misaligned address", "misaligned address"),
    _Rule(FailureKind.STICKY, "kernel launch timeout", "the launch timed out and was terminated"),
    _Rule(FailureKind.STICKY, "hardware stack error", "hardware stack error"),
    _Rule(FailureKind.STICKY, "uncorrectable ECC error", "uncorrectable ECC error encountered"),
    _Rule(FailureKind.STICKY, "GPU is lost", "GPU is lost"),
    # cudaErrorUnknown is not always sticky, but after it the context is rarely trustworthy; telling the user
    # to restart costs a minute, carrying on with a broken context costs a confusing next error.
    _Rule(FailureKind.STICKY, "CUDA unknown error", "CUDA error: unknown error"),
)

_SIZE_LIMIT_RULES = (
    _Rule(FailureKind.SIZE_LIMIT, "INT_MAX element limit", "INT_MAX"),
    _Rule(FailureKind.SIZE_LIMIT, "32-bit index limit", "canUse32BitIndexMath"),
    # cudaErrorInvalidConfiguration: a launch with a grid dimension over 65535 (pytorch#142228, SDPA, BatchNorm).
    _Rule(FailureKind.SIZE_LIMIT, "CUDA grid limit", "invalid configuration argument"),
    _Rule(FailureKind.SIZE_LIMIT, "MPS buffer size limit", "Invalid buffer size"),
    # Triton's OutOfResources text, also seen wrapped by Inductor in a RuntimeError subclass.
    _Rule(FailureKind.SIZE_LIMIT, "Triton resource limit", "out of resource:"),
)

def budget_message(device: str, requested: int, held: int, budget: int) -> str:
    """The message of the `torch.OutOfMemoryError` our memory budget raises; `classify` calls it "memory budget".

    `device` is the device the run really uses ("CPU", "MPS", "XPU"), so the user is not told a real
    allocator failed.
    """
    return (
        f"{device} out of memory {BUDGET_MARKER}. Tried to allocate {format_bytes(requested)}; "
        f"live tensors hold {format_bytes(held)} of the {format_bytes(budget)} budget."
    )


def classify(error: BaseException) -> Failure | None:
    """Recognise an out-of-memory, size-limit or sticky CUDA error in `error` or the exceptions it chains.

    A sticky error anywhere in the chain wins: once the context is dead, retrying a smaller size only fails
    again. Otherwise the first out-of-memory or size limit found, walking `__cause__` before `__context__`.
    None means the error is not ours to handle; the caller re-raises it unchanged.
    """
    # KeyboardInterrupt, SystemExit, GeneratorExit: the user wants out, even if an OOM is in the context.
    if not isinstance(error, Exception):
        return None
    found: Failure | None = None
    for depth, exception in enumerate(exception_chain(error)):
        failure = _classify_one(exception, chained=depth > 0)
        if failure is None:
            continue
        if failure.kind is FailureKind.STICKY:
            return failure
        if found is None:
            found = failure
    return found


def describe(failure: Failure) -> str:
    """One phrase for a report line: what happened and, for a sticky error, what the user must do."""
    if failure.kind is FailureKind.STICKY:
        return (
            f"{failure.kind} ({failure.flavour}): the CUDA context is unusable, restart the kernel (Kernel > Restart)"
        )
    if failure.kind is FailureKind.SIZE_LIMIT:
        return f"{failure.kind} ({failure.flavour}), not memory: this batch size cannot run on this device"
    return f"{failure.kind} ({failure.flavour})"


def _classify_one(exception: BaseException, chained: bool) -> Failure | None:
    if isinstance(exception, MemoryError):
        return _failure(FailureKind.OUT_OF_MEMORY, "Python allocator", exception, chained)
    if _is_triton_out_of_resources(exception):
        return _failure(FailureKind.SIZE_LIMIT, "Triton resource limit", exception, chained)
    # Every torch, CUDA and accelerator error arrives as a RuntimeError (OutOfMemoryError and AcceleratorError
    # subclass it). A ValueError or a user's own exception that happens to say "out of memory" is a bug in
    # their code, not a size the probe should shrink from, so only RuntimeErrors are read by message.
    if not isinstance(exception, RuntimeError):
        return None
    text = _text(exception)
    for rule in _STICKY_RULES:
        if rule.marker in text:
            return _failure(rule.kind, rule.flavour, exception, chained)
    if BUDGET_MARKER in text:
        return _failure(FailureKind.OUT_OF_MEMORY, "memory budget", exception, chained)
    if (marker := find_oom_marker(text)) is not None:
        return _failure(FailureKind.OUT_OF_MEMORY, marker.flavour, exception, chained)
    for rule in _SIZE_LIMIT_RULES:
        if rule.marker in text:
            return _failure(rule.kind, rule.flavour, exception, chained)
    if (device := device_out_of_memory(text)) is not None:
        return _failure(FailureKind.OUT_OF_MEMORY, f"{device} allocator", exception, chained)
    if _is_torch_out_of_memory(exception):
        # torch said OutOfMemoryError in a wording this table does not know yet: trust the class.
        return _failure(FailureKind.OUT_OF_MEMORY, "PyTorch allocator", exception, chained)
    if "out of memory" in text.lower():
        # NCCL's "Cuda failure 'out of memory'", XLA's "Out of memory while trying to allocate", ...
        return _failure(FailureKind.OUT_OF_MEMORY, "unrecognised allocator", exception, chained)
    return None


def _is_torch_out_of_memory(exception: BaseException) -> bool:
    # torch.OutOfMemoryError is torch.cuda.OutOfMemoryError is torch._C.OutOfMemoryError; its __module__ is
    # "torch". Matching the name within torch's modules avoids importing torch just to use isinstance.
    return any(
        cls.__name__ == TORCH_OOM_TYPE and (cls.__module__ == "torch" or cls.__module__.startswith("torch."))
        for cls in type(exception).__mro__
    )


def _is_triton_out_of_resources(exception: BaseException) -> bool:
    # triton.runtime.errors.OutOfResources subclasses Exception, not RuntimeError, and "OutOfResources" is a
    # common name elsewhere, so the module must be Triton's.
    return any(
        cls.__name__ == "OutOfResources" and (cls.__module__ == "triton" or cls.__module__.startswith("triton."))
        for cls in type(exception).__mro__
    )


def _failure(kind: FailureKind, flavour: str, exception: BaseException, chained: bool) -> Failure:
    first_line = _text(exception).strip().split("\n", 1)[0].strip()
    if len(first_line) > _MESSAGE_LIMIT:
        first_line = first_line[: _MESSAGE_LIMIT - 1] + "…"
    return Failure(kind=kind, flavour=flavour, message=first_line, chained=chained)


def _text(exception: BaseException) -> str:
    # A broken __str__ must not replace the user's error with ours: the probe re-raises the original.
    try:
        return str(exception)
    except Exception:
        return ""
