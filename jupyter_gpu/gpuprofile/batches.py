"""A batch resized to any number of samples, for `profile_sized_step(batch_size)`: the batch the loop last saw,
its samples repeated (or cut) along the first dimension, whatever its shape (a tensor, a tuple or list, a dict, a
namedtuple, a dataclass; see probekit.batch_structure)."""

from __future__ import annotations

from typing import Any

from jupyter_gpu.probekit.batch_structure import MAX_DEPTH, first_dimension, parts, rebuilt


def resize_batch(batch: Any, size: int) -> Any:
    """`batch` with `size` samples: sample i of the result is sample i % n of the batch (n its samples)."""
    import torch

    samples = first_dimension(batch, torch.Tensor)
    if samples is None:
        raise ValueError("resize_batch needs a batch with a tensor whose first dimension counts its samples")
    if size < 1:
        raise ValueError(f"batch_size must be at least 1, not {size}")
    index = torch.arange(size) % samples
    return _resized(torch, batch, samples, size, index, 0)


def _resized(torch: Any, value: Any, samples: int, size: int, index: Any, depth: int) -> Any:
    # A module-level function, not a closure over `index`: a nested function that calls itself is a reference cycle,
    # which kept each call's index tensor (8 bytes a sample) alive until a garbage collection, and %batchprobe
    # took the growth for a leak of the step's (512 KiB a call at batch 65,536).
    if isinstance(value, torch.Tensor):
        return value[index.to(value.device)] if value.dim() and value.shape[0] == samples else value
    inner = parts(value)
    if (isinstance(value, list | tuple) and not hasattr(value, "_fields") and len(value) == samples
            and not any(isinstance(item, torch.Tensor) or parts(item) for item in value)):
        return type(value)(value[i % samples] for i in range(size))  # per-sample labels, file names
    if not inner or depth >= MAX_DEPTH:
        return value
    return rebuilt(value, [_resized(torch, item, samples, size, index, depth + 1) for item in inner])
