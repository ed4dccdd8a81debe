"""The shape of a training batch, whatever the loader's collate function made: a tensor, a tuple or list, a dict
(or another mapping, such as Hugging Face's BatchEncoding), a namedtuple, a dataclass instance, nested. The probes
that move a batch (`%dataprobe`), resize it (`%%gpuprofile`'s sized step) or count its samples walk it the same
way, and `%speedprobe` walks a model's output (a tuple, a dict, a ModelOutput) with it. Pure Python."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

MAX_DEPTH = 6  # deeper than any batch; stops a structure that contains itself


def parts(batch: Any) -> list[Any]:
    """What a container batch holds, in order (a mapping's values, a dataclass's fields); [] for anything else."""
    if isinstance(batch, Mapping):
        return list(batch.values())
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return [getattr(batch, field.name) for field in dataclasses.fields(batch)]
    if isinstance(batch, list | tuple):
        return list(batch)
    return []


def rebuilt(batch: Any, new_parts: list[Any]) -> Any:
    """The container `batch` with `new_parts` in place of its parts, of its own type where that type allows."""
    if isinstance(batch, Mapping):
        values = dict(zip(batch.keys(), new_parts, strict=True))
        try:
            return type(batch)(values)  # OrderedDict, BatchEncoding and other mappings built from a dict
        except TypeError:
            return values
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        names = [field.name for field in dataclasses.fields(batch) if field.init]
        by_name = dict(zip([field.name for field in dataclasses.fields(batch)], new_parts, strict=True))
        return dataclasses.replace(batch, **{name: by_name[name] for name in names})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple takes its fields as arguments
        return type(batch)(*new_parts)
    if isinstance(batch, list | tuple):
        return type(batch)(new_parts)
    return batch


def mapped(batch: Any, leaf: Callable[[Any], Any], *, depth: int = 0) -> Any:
    """The batch with `leaf(value)` in place of each value that is not a container, its structure kept."""
    inner = parts(batch)
    if not inner or depth >= MAX_DEPTH:
        return leaf(batch)
    return rebuilt(batch, [mapped(part, leaf, depth=depth + 1) for part in inner])


def leaves(batch: Any, *, depth: int = 0) -> Iterator[Any]:
    """Each value of the batch that is not a container, depth first in order."""
    inner = parts(batch)
    if not inner or depth >= MAX_DEPTH:
        yield batch
        return
    for part in inner:
        yield from leaves(part, depth=depth + 1)


def first_dimension(batch: Any, tensor_type: type) -> int | None:
    """The samples in a batch: the first dimension of its first tensor with one (None without such a tensor)."""
    return next((int(value.shape[0]) for value in leaves(batch)
                 if isinstance(value, tensor_type) and value.dim()), None)
