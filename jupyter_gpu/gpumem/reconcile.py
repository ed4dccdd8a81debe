"""What the named storages leave unexplained on each device, labelled with its holder and the advice that fits.

Pure: it takes the figures the allocator probe read (`DeviceTotals`) and returns `Remainder`s, CUDA in the order
the memory stacks up: tensors no path names, the allocator's cache (fragmentation within it), then what the
process holds outside PyTorch's allocator.
"""

from __future__ import annotations

from jupyter_gpu.gpumem.result import DeviceTotals, Remainder
from jupyter_gpu.rendering.units import format_bytes

MIB = 1024 * 1024
# Below this a remainder is rounding (a 512-byte allocation granule per tensor, a CUDA-side 0-dim step counter),
# not something to explain.
NOISE_BYTES = MIB
# Inactive split blocks are fragmentation worth acting on when they are this share of the cache (and over 64 MiB):
# below that, empty_cache() returns most of it.
FRAGMENTED_SHARE = 0.25
FRAGMENTED_BYTES = 64 * MIB

UNREACHABLE_CUDA = "not reachable from Python (autograd buffers, C++ caches)"
UNREACHED = ("tensors Python holds outside the notebook's names (in objects the walk does not enter, such as "
             "classes' attributes and libraries' internals, or deeper than it looks)")
CACHE = "the allocator's cache (reserved by PyTorch, not allocated to any tensor)"
FRAGMENTATION = "of which fragmentation (inactive split blocks, which empty_cache() cannot return)"
CONTEXT = "CUDA context and libraries outside PyTorch (cuBLAS/cuDNN workspaces, NCCL, other CUDA code)"
UNREACHABLE_CPU = "not reachable from Python (autograd buffers, C++ caches)"

EMPTY_CACHE_ADVICE = ("%gpumem --free cache (torch.cuda.empty_cache()) hands it back to other processes; PyTorch "
                      "reserves it again when it needs it, so it only helps another process or a later peak")
EXPANDABLE_ADVICE = ("start the kernel with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (set it before CUDA "
                     "starts): the allocator then grows one segment page by page, so freed blocks always merge; the "
                     "trade-off is a small cost each time the pool grows, and blocks that stay alive still pin "
                     "their pages")
EXPANDABLE_ON = ("expandable_segments is already on: what is left is blocks that stay alive between freed ones; "
                 "free or move the long-lived tensors (the model, the optimizer state) before the short-lived ones")


def remainders(totals: DeviceTotals) -> list[Remainder]:
    """The labelled remainders of one device, largest holder first within the order above; empty when all is named."""
    found: list[Remainder] = []
    device = totals.device
    if totals.unreached_bytes >= NOISE_BYTES:
        found.append(Remainder(device, UNREACHED, totals.unreached_bytes,
                               "gc.get_referrers(tensor) shows who holds one of them"))
    if totals.total_bytes is not None:
        unnamed = totals.total_bytes - totals.named_bytes - totals.unreached_bytes
        if unnamed >= NOISE_BYTES:
            label = UNREACHABLE_CUDA if device.startswith("cuda") else UNREACHABLE_CPU
            found.append(Remainder(device, label, unnamed))
    if totals.reserved_bytes is not None and totals.total_bytes is not None:
        cache = totals.reserved_bytes - totals.total_bytes
        if cache >= NOISE_BYTES:
            found.append(Remainder(device, CACHE, cache, EMPTY_CACHE_ADVICE))
            split = totals.inactive_split_bytes or 0
            if split >= FRAGMENTED_BYTES and split >= FRAGMENTED_SHARE * cache:
                found.append(Remainder(device, FRAGMENTATION, split,
                                       EXPANDABLE_ON if totals.expandable_segments else EXPANDABLE_ADVICE))
    if totals.process_bytes is not None and totals.reserved_bytes is not None:
        outside = totals.process_bytes - totals.reserved_bytes
        if outside >= NOISE_BYTES:
            found.append(Remainder(device, CONTEXT, outside))
    return found


def total_line(totals: DeviceTotals) -> str:
    """"cuda:0: 1.2 GiB named of 1.3 GiB allocated (96%)", the headline of one device."""
    named = format_bytes(totals.named_bytes)
    if totals.total_bytes is None:
        return f"{totals.device}: {named} named ({totals.total_source} unknown)"
    coverage = totals.coverage
    share = f" ({coverage:.0%})" if coverage is not None else ""
    return f"{totals.device}: {named} named of {format_bytes(totals.total_bytes)} {totals.total_source}{share}"
