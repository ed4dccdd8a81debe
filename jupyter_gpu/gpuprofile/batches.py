"""A batch resized to any number of samples, for `profile_sized_step(batch_size)`: the batch the loop last saw,
its samples repeated (or cut) along the first dimension, whatever its shape (a tensor, a tuple or list, a dict)."""

from __future__ import annotations

from typing import Any


def resize_batch(batch: Any, size: int) -> Any:
    """`batch` with `size` samples: sample i of the result is sample i % n of the batch (n its samples)."""
    import torch

    samples = _samples(batch, torch)
    if samples is None:
        raise ValueError("resize_batch needs a batch with a tensor whose first dimension counts its samples")
    if size < 1:
        raise ValueError(f"batch_size must be at least 1, not {size}")
    index = torch.arange(size) % samples

    def resized(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == samples:
            return value[index.to(value.device)]
        if isinstance(value, dict):
            return {key: resized(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)) and len(value) == samples and not any(
                isinstance(item, (torch.Tensor, dict, list, tuple)) for item in value):
            return type(value)(value[i % samples] for i in range(size))  # per-sample labels, file names
        if isinstance(value, (list, tuple)):
            return type(value)(resized(item) for item in value)
        return value
    return resized(batch)


def _samples(batch: Any, torch: Any) -> int | None:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        found = _samples(item, torch)
        if found is not None:
            return found
    return None
