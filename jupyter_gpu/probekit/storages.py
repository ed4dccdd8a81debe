"""The tensor storages Python can reach: what `%batchprobe`'s CPU budget, `%gpumem`'s device totals and the test
suite's leak checks count, each storage once.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from itertools import compress
from typing import Any


def live_tensor_bytes(torch: Any, device_type: str) -> int:
    """Bytes held by every tensor storage on `device_type` that Python can reach, each storage once."""
    return sum(storage.nbytes() for storage in live_storages(torch, device_type))


def live_storages(torch: Any, device_type: str | None = None) -> Iterator[Any]:
    """Every tensor storage on `device_type` (None: on every device) that Python can reach, each once (empty ones
    left out).

    Gradients are reached through their parameters: a `.grad` may have no Python object of its own.
    """
    seen: set[tuple[Any, int]] = set()  # (device, data pointer): two devices can reuse one address
    tensor_types = _tensor_types(torch.Tensor)
    # type(), not isinstance(): isinstance reads `__class__`, which some lazy module proxies warn about. A set
    # lookup per object in C (map, compress), not issubclass() in a Python loop: this scan runs at each
    # %batchprobe trial over every object Python tracks (a quarter of a million in a notebook).
    objects = gc.get_objects()
    for obj in list(compress(objects, map(tensor_types.__contains__, map(type, objects)))):
        for tensor in (obj, obj.grad) if obj.is_leaf and obj.requires_grad else (obj,):
            if tensor is None or (device_type is not None and tensor.device.type != device_type) or _is_fake(tensor):
                continue
            try:
                storage = tensor.untyped_storage()
                pointer = storage.data_ptr()
            except (RuntimeError, NotImplementedError, TypeError):
                continue
            if pointer and (tensor.device, pointer) not in seen:
                seen.add((tensor.device, pointer))
                yield storage


def _tensor_types(tensor_type: type) -> set[type]:
    """torch.Tensor and every subclass defined so far (Parameter, Buffer, the user's own), found afresh each call."""
    found, pending = {tensor_type}, [tensor_type]
    while pending:
        for subclass in pending.pop().__subclasses__():
            if subclass not in found:
                found.add(subclass)
                pending.append(subclass)
    return found


def _is_fake(tensor: Any) -> bool:
    return type(tensor).__name__ == "FakeTensor" or tensor.is_meta
