"""Out-of-memory classification against the real torch exception classes and messages (research notes §1.6)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from jupyter_gpu.batchprobe.oom import (
    BUDGET_MARKER,
    Failure,
    FailureKind,
    budget_message,
    classify,
    describe,
)

OOM = FailureKind.OUT_OF_MEMORY
LIMIT = FailureKind.SIZE_LIMIT
STICKY = FailureKind.STICKY

CUDA_ALLOCATOR = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is "
    "free. Including non-PyTorch memory, this process has 78.12 GiB memory in use. Of the allocated memory 75.50 GiB "
    "is allocated by PyTorch, and 1.12 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory "
    "is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)
ASYNC_NOTE = (
    "\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
    "incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1"
)

OUT_OF_MEMORY_CASES = [
    pytest.param(torch.OutOfMemoryError(CUDA_ALLOCATOR), "CUDA caching allocator", id="cuda-allocator"),
    pytest.param(
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 7.79 GiB total capacty; "
                               "6.12 GiB already allocated; 13.12 MiB free)"),
        "CUDA caching allocator",
        id="cuda-allocator-old-typo",
    ),
    pytest.param(torch.AcceleratorError("CUDA error: out of memory" + ASYNC_NOTE), "CUDA runtime", id="cuda-runtime"),
    pytest.param(
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        "cuBLAS",
        id="cublas-alloc",
    ),
    pytest.param(
        RuntimeError("CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`"),
        "cuBLAS (probably out of memory)",
        id="cublas-not-initialized",
    ),
    pytest.param(RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), "cuDNN", id="cudnn-alloc"),
    pytest.param(
        RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a "
                     "non-contiguous input."),
        "cuDNN (probably out of memory)",
        id="cudnn-not-supported",
    ),
    pytest.param(RuntimeError("cuFFT error: CUFFT_ALLOC_FAILED"), "cuFFT", id="cufft"),
    pytest.param(
        torch.OutOfMemoryError("HIP out of memory. Tried to allocate 64.00 GiB. GPU 0 has a total capacity of "
                               "63.98 GiB of which 48.63 GiB is free."),
        "ROCm (HIP) allocator",
        id="rocm",
    ),
    pytest.param(
        RuntimeError("MPS backend out of memory (MPS allocated: 0 bytes, other allocations: 448.00 KiB, max allowed: "
                     "242.48 MiB). Tried to allocate 256.00 MiB on shared pool."),
        "MPS allocator",
        id="mps",
    ),
    pytest.param(
        torch.OutOfMemoryError("XPU out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of "
                               "16.00 GiB of which 0 bytes is free. Please use `empty_cache` to release all unoccupied "
                               "cached memory."),
        "XPU allocator",
        id="xpu",
    ),
    pytest.param(
        RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you "
                     "tried to allocate 1099511627776 bytes. Error code 12 (Cannot allocate memory)"),
        "CPU allocator",
        id="cpu-allocator",
    ),
    pytest.param(
        RuntimeError("[Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::4294967296 (4096)MB"),
        "HPU",
        id="hpu",
    ),
    pytest.param(MemoryError(), "Python allocator", id="python-memoryerror"),
    pytest.param(torch.OutOfMemoryError("NPU out of memory. Tried to allocate 2.00 GiB"), "NPU allocator",
                 id="other-accelerator"),
    pytest.param(torch.OutOfMemoryError("allocation refused"), "PyTorch allocator", id="unknown-wording"),
    pytest.param(
        RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error, NCCL version 2.21.5\n"
                     "Last error:\nCuda failure 'out of memory'"),
        "unrecognised allocator",
        id="nccl",
    ),
]


@pytest.mark.parametrize(("error", "flavour"), OUT_OF_MEMORY_CASES)
def test_every_out_of_memory_flavour(error: BaseException, flavour: str) -> None:
    failure = classify(error)
    assert failure is not None
    assert (failure.kind, failure.flavour, failure.chained) == (OOM, flavour, False)
    first_line = str(error).split("\n")[0]
    expected = first_line if len(first_line) <= 200 else first_line[:199] + "…"
    assert failure.message == expected


def test_the_message_is_the_first_line_trimmed() -> None:
    failure = classify(torch.AcceleratorError("CUDA error: out of memory" + ASYNC_NOTE))
    assert failure is not None and failure.message == "CUDA error: out of memory"
    failure = classify(torch.OutOfMemoryError(CUDA_ALLOCATOR))
    assert failure is not None and len(failure.message) == 200 and failure.message.endswith("…")


def test_the_real_cpu_allocator_error_is_out_of_memory() -> None:
    # Not a copied string: what this torch build raises for an impossible allocation.
    with pytest.raises(RuntimeError) as raised:
        torch.empty(1 << 60, dtype=torch.uint8)
    failure = classify(raised.value)
    assert failure is not None and (failure.kind, failure.flavour) == (OOM, "CPU allocator")


def test_an_oom_raised_from_inside_another_error_is_found() -> None:
    def step() -> None:
        try:
            raise torch.OutOfMemoryError(CUDA_ALLOCATOR)
        except torch.OutOfMemoryError as oom:
            raise RuntimeError("step failed") from oom

    with pytest.raises(RuntimeError) as raised:
        step()
    failure = classify(raised.value)
    assert failure is not None
    assert (failure.kind, failure.flavour, failure.chained) == (OOM, "CUDA caching allocator", True)
    assert failure.message.startswith("CUDA out of memory.")


def test_an_oom_in_the_implicit_context_is_found() -> None:
    def step() -> None:
        try:
            raise torch.AcceleratorError("CUDA error: out of memory" + ASYNC_NOTE)
        except RuntimeError:
            raise ValueError("cleanup failed")  # noqa: B904 (the implicit __context__ is what this tests)

    with pytest.raises(ValueError) as raised:
        step()
    assert raised.value.__cause__ is None and isinstance(raised.value.__context__, torch.AcceleratorError)
    failure = classify(raised.value)
    assert failure is not None and (failure.kind, failure.flavour, failure.chained) == (OOM, "CUDA runtime", True)


def test_an_oom_two_links_down_the_chain_is_found() -> None:
    oom = torch.OutOfMemoryError("HIP out of memory. Tried to allocate 1.00 GiB")
    middle = RuntimeError("forward failed")
    middle.__cause__ = oom
    top = KeyError("logits")
    top.__context__ = middle
    failure = classify(top)
    assert failure is not None and (failure.flavour, failure.chained) == ("ROCm (HIP) allocator", True)


def test_the_cause_is_looked_at_before_the_context() -> None:
    top = RuntimeError("step failed")
    top.__cause__ = RuntimeError("nonzero is not supported for tensors with more than INT_MAX elements")
    top.__context__ = torch.OutOfMemoryError(CUDA_ALLOCATOR)
    failure = classify(top)
    assert failure is not None and failure.kind is LIMIT


def test_a_sticky_error_anywhere_in_the_chain_wins_over_out_of_memory() -> None:
    sticky = torch.AcceleratorError("CUDA error: an illegal memory access was encountered" + ASYNC_NOTE)
    top = torch.OutOfMemoryError(CUDA_ALLOCATOR)
    top.__context__ = sticky
    failure = classify(top)
    assert failure is not None
    assert (failure.kind, failure.flavour, failure.chained) == (STICKY, "illegal memory access", True)

    # And when the sticky error is the one raised, with an OOM in its context.
    sticky.__context__ = torch.OutOfMemoryError(CUDA_ALLOCATOR)
    failure = classify(sticky)
    assert failure is not None and (failure.kind, failure.chained) == (STICKY, False)


@pytest.mark.parametrize(
    ("message", "flavour"),
    [
        ("CUDA error: an illegal memory access was encountered", "illegal memory access"),
        ("CUDA error: device-side assert triggered", "device-side assert"),
        ("CUDA error: unspecified launch failure", "unspecified launch failure"),
        ("CUDA error: an illegal instruction was encountered", "illegal instruction"),
        ("CUDA error: misaligned address", "misaligned address"),
        ("CUDA error: uncorrectable ECC error encountered", "uncorrectable ECC error"),
        ("CUDA error: the launch timed out and was terminated", "kernel launch timeout"),
        ("NVML error: GPU is lost", "GPU is lost"),
        ("CUDA error: unknown error", "CUDA unknown error"),
        ("HIP error: an illegal memory access was encountered", "illegal memory access"),
    ],
)
def test_sticky_cuda_errors(message: str, flavour: str) -> None:
    failure = classify(torch.AcceleratorError(message + ASYNC_NOTE))
    assert failure is not None and (failure.kind, failure.flavour, failure.message) == (STICKY, flavour, message)
    assert "restart the kernel" in describe(failure)


@pytest.mark.parametrize(
    ("error", "flavour"),
    [
        (RuntimeError("nonzero is not supported for tensors with more than INT_MAX elements, file a support request"),
         "INT_MAX element limit"),
        (torch.AcceleratorError("CUDA error: invalid configuration argument" + ASYNC_NOTE), "CUDA grid limit"),
        (RuntimeError("Invalid buffer size: 5.00 GB"), "MPS buffer size limit"),
        (RuntimeError("Expected canUse32BitIndexMath(input) && canUse32BitIndexMath(output) to be true, but got "
                      "false."), "32-bit index limit"),
        (RuntimeError("OutOfResources: out of resource: shared memory, Required: 98304, Hardware limit: 65536. "
                      "Reducing block sizes or `num_stages` may help."), "Triton resource limit"),
    ],
)
def test_size_limits_are_not_memory(error: BaseException, flavour: str) -> None:
    failure = classify(error)
    assert failure is not None and (failure.kind, failure.flavour) == (LIMIT, flavour)
    assert "not memory" in describe(failure)


def test_triton_out_of_resources_is_recognised_by_its_class() -> None:
    # Triton is not installed here; a class with the same name and module stands in for
    # triton.runtime.errors.OutOfResources, which subclasses Exception, not RuntimeError.
    triton_error = type("OutOfResources", (Exception,), {"__module__": "triton.runtime.errors"})
    failure = classify(triton_error("out of resource: shared memory, Required: 98304, Hardware limit: 65536"))
    assert failure is not None and (failure.kind, failure.flavour) == (LIMIT, "Triton resource limit")
    # Someone else's OutOfResources is not Triton's.
    unrelated = type("OutOfResources", (Exception,), {"__module__": "dungeon"})
    assert classify(unrelated("Out of gold.")) is None


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(RuntimeError("mat1 and mat2 shapes cannot be multiplied (64x10 and 20x5)"), id="shapes"),
        pytest.param(ValueError("out of range"), id="value-error"),
        pytest.param(ValueError("the dataset ran out of memory-mapped shards"), id="value-error-mentions-memory"),
        pytest.param(RuntimeError("unsupported memory format option Preserve"), id="memory-format"),
        pytest.param(RuntimeError("Expected all tensors to be on the same device, but found at least two devices, "
                                  "cuda:0 and cpu!"), id="device-mismatch"),
        pytest.param(TypeError("forward() missing 1 required positional argument: 'x'"), id="type-error"),
        pytest.param(KeyboardInterrupt(), id="keyboard-interrupt"),
        pytest.param(torch.AcceleratorError("CUDA error: invalid device ordinal"), id="accelerator-other"),
    ],
)
def test_other_errors_are_not_ours(error: BaseException) -> None:
    assert classify(error) is None


def test_a_keyboard_interrupt_during_oom_cleanup_is_not_an_oom() -> None:
    # The user pressed Ctrl-C: the probe must stop, not shrink the batch.
    interrupt = KeyboardInterrupt()
    interrupt.__context__ = torch.OutOfMemoryError(CUDA_ALLOCATOR)
    assert classify(interrupt) is None


@pytest.mark.parametrize("device", ["CPU", "MPS", "XPU"])
def test_a_budget_message_round_trips_as_memory_budget(device: str) -> None:
    message = budget_message(device, requested=12 << 20, held=6 << 30, budget=6 << 30)
    assert message.startswith(f"{device} out of memory {BUDGET_MARKER}.")
    assert "12.0 MiB" in message and "6.0 GiB budget" in message
    failure = classify(torch.OutOfMemoryError(message))
    assert failure == Failure(OOM, "memory budget", message, chained=False)
    assert describe(failure) == "out of memory (memory budget)"


def test_a_cycle_in_the_chain_does_not_hang() -> None:
    first = RuntimeError("first")
    second = RuntimeError("second")
    first.__context__ = second
    second.__context__ = first
    second.__cause__ = second
    assert classify(first) is None
    oom = torch.OutOfMemoryError(CUDA_ALLOCATOR)
    second.__cause__ = oom
    oom.__context__ = first
    failure = classify(first)
    assert failure is not None and failure.chained


def test_a_broken_str_does_not_replace_the_users_error() -> None:
    class Unprintable(RuntimeError):
        def __str__(self) -> str:
            raise ValueError("no")

    assert classify(Unprintable()) is None
    broken = Unprintable()
    broken.__cause__ = MemoryError()
    failure = classify(broken)
    assert failure is not None and (failure.flavour, failure.chained) == ("Python allocator", True)


def test_describe() -> None:
    failure = classify(torch.OutOfMemoryError(CUDA_ALLOCATOR))
    assert failure is not None and describe(failure) == "out of memory (CUDA caching allocator)"
    assert str(FailureKind.STICKY) == "sticky CUDA error"


def test_the_module_imports_neither_torch_nor_ipython() -> None:
    code = "import sys, jupyter_gpu.batchprobe.oom; print(sorted({'torch', 'IPython'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
