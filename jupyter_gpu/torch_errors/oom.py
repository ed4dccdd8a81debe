"""How PyTorch and its libraries word "out of memory": one table for every feature that recognises it.

`%batchprobe` classifies a failed trial with it (`batchprobe.oom`), `%gpucheck` explains the notebook's last
error with it (`gpucheck.diagnose.usage`), so the two can never disagree on what counts as out of memory.
Pure Python: the messages are matched as text, never by importing torch. The strings come from the §1.6 table
of the research notes (timing-batch-memory.md), checked against torch 2.13.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class OomMarker:
    flavour: str  # where it came from, for a report: "CUDA caching allocator", "cuDNN", ...
    marker: str  # the text that identifies it in an exception's message
    memory: str  # whose memory ran out: "cuda", "rocm", "mps", "xpu", "cpu", "hpu"
    probable: bool = False  # the message usually, not always, means memory (the flavour says so)


# Checked in order, the first marker found wins.
OOM_MARKERS: tuple[OomMarker, ...] = (
    OomMarker("CUDA caching allocator", "CUDA out of memory", "cuda"),
    OomMarker("CUDA runtime", "CUDA error: out of memory", "cuda"),
    OomMarker("ROCm (HIP) allocator", "HIP out of memory", "rocm"),
    OomMarker("ROCm (HIP) runtime", "HIP error: out of memory", "rocm"),
    OomMarker("MPS allocator", "MPS backend out of memory", "mps"),
    OomMarker("XPU allocator", "XPU out of memory", "xpu"),
    OomMarker("CPU allocator", "DefaultCPUAllocator: can't allocate memory", "cpu"),
    OomMarker("HPU", "PT_DEVMEM Allocation failed", "hpu"),
    OomMarker("cuBLAS", "CUBLAS_STATUS_ALLOC_FAILED", "cuda"),
    OomMarker("cuDNN", "CUDNN_STATUS_ALLOC_FAILED", "cuda"),
    OomMarker("cuFFT", "CUFFT_ALLOC_FAILED", "cuda"),
    # These two usually mean the library could not allocate its workspace or handle, but they have other causes
    # (a non-contiguous input for cuDNN, pytorch#4107); the flavour says so rather than claiming memory outright.
    OomMarker("cuBLAS (probably out of memory)", "CUBLAS_STATUS_NOT_INITIALIZED", "cuda", probable=True),
    OomMarker("cuDNN (probably out of memory)", "CUDNN_STATUS_NOT_SUPPORTED", "cuda", probable=True),
)

# "NPU out of memory", "MLU out of memory", ...: other accelerators' allocators word it like CUDA's.
DEVICE_OOM = re.compile(r"\b([A-Z][A-Z0-9]+) out of memory")

# torch.OutOfMemoryError (also torch.cuda.OutOfMemoryError): the type says it when the message says less.
TORCH_OOM_TYPE = "OutOfMemoryError"


def find_oom_marker(text: str, *, probable: bool = True) -> OomMarker | None:
    """The first marker of the table in `text`; `probable=False` skips those that only usually mean memory."""
    return next((m for m in OOM_MARKERS if m.marker in text and (probable or not m.probable)), None)


def device_out_of_memory(text: str) -> str | None:
    """The accelerator named in an "XYZ out of memory" message the table does not know ("NPU"), else None."""
    match = DEVICE_OOM.search(text)
    return None if match is None else match.group(1)
