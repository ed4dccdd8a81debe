"""Who holds the memory on the probed device: the model, the optimizer, and the notebook's other variables.

`%batchprobe` counts absolute bytes, so what the notebook already holds on the device lowers the answer; the
report names it. The same walk names what keeps a trial's tensors alive between calls (a hook or a global
that keeps the last output, a list that keeps every loss).

It reads the namespace and the training objects only, a few levels deep, and keeps no reference to anything
it found. Each storage is counted once, for the first holder that reaches it: the training objects first,
then the variables in namespace order.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from jupyter_gpu.batchprobe.state import TrainingObjects

# IPython's own names and history: Out would list every tensor a cell ever displayed.
from jupyter_gpu.gpucheck.facts.notebook import IPYTHON_NAMES

# How far the walk looks inside a variable (ds.tensors[0] is two steps) and how many items per container:
# the point is naming the big holders cheaply, not a full map (a list of a million samples is one holder).
_MAX_DEPTH = 3
_MAX_ITEMS = 1000
_MAX_VISITS = 20_000
# Values never looked into: they hold no training data, and walking a Python module would walk the library.
_OPAQUE = (str, bytes, int, float, complex, bool, type, types.ModuleType, types.FunctionType,
           types.BuiltinFunctionType, types.MethodType)


@dataclass(frozen=True)
class Holder:
    """One name in the notebook and the bytes of device storages reached through it."""

    name: str  # "model", "opt", "ds", "kept['last']"
    kind: str  # "parameters and buffers", "gradients", "optimizer state", "tensors"
    bytes: int
    tensors: int  # how many tensors hold those storages
    graphs: bool = False  # some of them carry an autograd graph (grad_fn), which keeps more memory alive

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "bytes": self.bytes, "tensors": self.tensors,
                "graphs": self.graphs}


def memory_holders(torch: Any, namespace: Mapping[str, Any], objects: TrainingObjects, device_type: str, *,
                   only: set[int] | None = None) -> list[Holder]:
    """The holders of storages on `device_type`, largest first; with `only`, of those storages (data_ptrs)."""
    counted: set[int] = set()
    holders: list[Holder] = []

    def add(name: str, kind: str, tensors: Iterator[Any]) -> None:
        total = count = 0
        graphs = False
        for tensor in tensors:
            pointer, size = _storage_of(tensor, device_type)
            if not pointer or pointer in counted or (only is not None and pointer not in only):
                continue
            counted.add(pointer)
            total += size
            count += 1
            graphs = graphs or tensor.grad_fn is not None
        if total:
            holders.append(Holder(name, kind, total, count, graphs))

    for module in objects.modules:
        name = objects.labels.get(id(module), type(module).__name__)
        add(name, "parameters and buffers", _module_tensors(module))
        add(f"{name} gradients", "gradients",
            (p.grad for p in module.parameters() if p.grad is not None))
    for optimizer in objects.optimizers:
        name = objects.labels.get(id(optimizer), type(optimizer).__name__)
        add(name, f"{type(optimizer).__name__} state", _optimizer_tensors(optimizer))
    tensor_type = torch.Tensor
    for name, value in list(namespace.items()):
        if isinstance(name, str) and not name.startswith("_") and name not in IPYTHON_NAMES:
            add(name, "tensors", _tensors_under(value, tensor_type))
    return sorted(holders, key=lambda holder: -holder.bytes)


def _storage_of(tensor: Any, device_type: str) -> tuple[int, int]:
    try:
        if tensor.device.type != device_type:
            return 0, 0
        storage = tensor.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):
        return 0, 0  # sparse, fake and meta tensors hold no storage to count here


def _module_tensors(module: Any) -> Iterator[Any]:
    yield from module.parameters()
    yield from module.buffers()


def _optimizer_tensors(optimizer: Any) -> Iterator[Any]:
    for state in list(optimizer.state.values()):
        for value in list(state.values()):
            if hasattr(value, "untyped_storage"):
                yield value


def _tensors_under(value: Any, tensor_type: type) -> Iterator[Any]:
    """Tensors in a value: itself, containers' items, objects' attributes (read from __dict__: no property runs).

    Python modules, functions and classes are not looked into. A torch module that is not a training object
    (a frozen teacher) is named through its parameters and buffers. At most _MAX_VISITS objects per variable.
    """
    visited: set[int] = set()
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending and len(visited) < _MAX_VISITS:
        item, depth = pending.pop()
        if id(item) in visited:
            continue
        visited.add(id(item))
        if isinstance(item, tensor_type):
            yield item
            if item.is_leaf and item.grad is not None:  # .grad of a non-leaf warns and is always None
                yield item.grad
            continue
        if depth >= _MAX_DEPTH or isinstance(item, _OPAQUE):
            continue
        if hasattr(item, "parameters") and hasattr(item, "buffers") and callable(item.parameters):
            yield from _module_tensors(item)
            continue
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple | set | frozenset):
            children = item
        else:
            try:
                children = vars(item).values()
            except TypeError:  # no __dict__ (a C type, a slotted object)
                continue
        pending.extend((child, depth + 1) for child in list(itertools.islice(children, _MAX_ITEMS)))
