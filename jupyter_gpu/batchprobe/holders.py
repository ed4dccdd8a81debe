"""Who holds the memory on the probed device: the model, the optimizer, and the notebook's other variables.

`%batchprobe` counts absolute bytes, so what the notebook already holds on the device lowers the answer; the
report names it. The same walk names what keeps a trial's tensors alive between calls (a hook or a global
that keeps the last output, a list that keeps every loss, and the graphs such losses keep).

It is `%gpumem`'s walk (`jupyter_gpu.gpumem.walk`), from the training objects first and then the namespace's
variables, grouped by holder: each storage is counted once, for the holder that names it best (`name_order`).
It keeps no reference to anything it found.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jupyter_gpu.facts.notebook import IPYTHON_NAMES
from jupyter_gpu.gpumem.roots import USER, Root, merge_aliases
from jupyter_gpu.gpumem.walk import BUFFER, GRADIENT, GRAPH, OPTIMIZER_STATE, PARAMETER, NotebookWalk, name_order
from jupyter_gpu.probekit.training_state import TrainingObjects


@dataclass(frozen=True)
class Holder:
    """One name in the notebook and the bytes of device storages reached through it."""

    name: str  # "model", "opt", "ds", "kept['last']"
    kind: str  # "parameters and buffers", "gradients", "optimizer state", "tensors"
    bytes: int
    tensors: int  # how many storages
    graphs: bool = False  # some of them are an autograd graph's (a kept output with grad_fn), which keeps more alive

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "bytes": self.bytes, "tensors": self.tensors,
                "graphs": self.graphs}


def memory_holders(torch: Any, namespace: Mapping[str, Any], objects: TrainingObjects, device_type: str, *,
                   only: set[int] | None = None) -> list[Holder]:
    """The holders of storages on `device_type`, largest first; with `only`, of those storages (data_ptrs)."""
    optimizer_kinds: dict[str, str] = {}
    roots: list[Root] = []
    for module in objects.modules:
        roots.append(Root(objects.labels.get(id(module), type(module).__name__), USER, module))
    for optimizer in objects.optimizers:
        label = objects.labels.get(id(optimizer), type(optimizer).__name__)
        optimizer_kinds[label] = f"{type(optimizer).__name__} state"
        roots.append(Root(label, USER, optimizer))
    roots += [Root(name, USER, value) for name, value in list(namespace.items())
              if isinstance(name, str) and not name.startswith("_") and name not in IPYTHON_NAMES]
    walk = NotebookWalk(torch).walk(merge_aliases(roots))
    roots.clear()
    totals: dict[tuple[str, str], list[int]] = {}  # (name, kind) -> [bytes, storages, graphs]
    for (device, pointer), record in walk.storages.items():
        if device.split(":")[0] != device_type or (only is not None and pointer not in only):
            continue
        # The holder whose own name for it is best: the model for its parameters (not the optimizer's
        # param_groups), `kept` for what a hook stores in it (not the module whose hook reaches `kept`).
        holder = min(record.holders, key=lambda root: name_order(*record.path_of[root]))
        _, kind = record.path_of[holder]
        if kind in (PARAMETER, BUFFER):
            key = (holder, "parameters and buffers")
        elif kind == GRADIENT:
            key = (f"{holder} gradients", "gradients")
        elif kind == OPTIMIZER_STATE:
            key = (holder, optimizer_kinds.get(holder, "optimizer state"))
        else:
            key = (holder, "tensors")
        total = totals.setdefault(key, [0, 0, 0])
        total[0] += record.bytes
        total[1] += 1
        total[2] |= kind == GRAPH or record.has_graph
    holders = [Holder(name, kind, size, count, bool(graphs)) for (name, kind), (size, count, graphs) in totals.items()]
    return sorted(holders, key=lambda holder: -holder.bytes)
