"""The tensors an autograd graph saved for backward: what a kept `loss` (any output with a `grad_fn`) holds alive.

Probe ring. Saved activations have no Python object of their own, so neither `gc` nor a walk of the notebook's
variables sees them; they are reached here through each node's `_raw_saved_*` attributes. `SavedTensor.data` is
read rather than `_saved_*`, because unpacking runs the saved-tensor hooks: under activation checkpointing that
would recompute the forward, and under offloading it would copy the tensor back to the GPU. What a hook packed
(a checkpoint's handle, not a tensor) is not memory of this graph, and a graph that already ran backward has
freed its saved tensors (`data` is None).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from typing import Any

MAX_NODES = 200_000  # a graph of a very long unrolled loop is cut off here; the walk reports the cut


@cache
def _saved_attributes(node_type: type) -> tuple[str, ...]:
    # The attributes are defined per node class (AddmmBackward0 has _raw_saved_mat1, _raw_saved_mat2, ...), so one
    # dir() per class, not per node.
    return tuple(name for name in dir(node_type) if name.startswith("_raw_saved_"))


def saved_tensors(grad_fn: Any, owners: dict[int, str], label: str, shared: set[str],
                  tensor_type: type) -> Iterator[Any]:
    """Every tensor the graph ending at `grad_fn` saved, each node visited once across calls sharing `owners`.

    `owners` maps each node visited so far to the label of the graph that reached it first; this graph's nodes get
    `label`. The labels of earlier graphs this one runs into (`loss` computed from a kept `out`) are added to
    `shared`: their saved tensors are this graph's too. Parameters reached through AccumulateGrad nodes are not
    yielded: they are the model's, not the graph's. Raises `GraphTooLarge` past MAX_NODES nodes.
    """
    pending = [grad_fn]
    while pending:
        node = pending.pop()
        if node is None:
            continue
        owner = owners.get(id(node))
        if owner is not None:
            if owner != label:
                shared.add(owner)
            continue
        owners[id(node)] = label
        if len(owners) > MAX_NODES:
            raise GraphTooLarge(MAX_NODES)
        for name in _saved_attributes(type(node)):
            try:
                saved = getattr(node, name)
            except RuntimeError:
                continue  # freed by backward
            for item in saved if isinstance(saved, list | tuple) else (saved,):
                data = getattr(item, "data", None)
                if data is not None and issubclass(type(data), tensor_type):
                    yield data
        yield from _custom_function_tensors(node, tensor_type)
        try:
            pending.extend(next_node for next_node, _ in node.next_functions)
        except (AttributeError, RuntimeError):
            continue


def _custom_function_tensors(node: Any, tensor_type: type) -> Iterator[Any]:
    """A Python `autograd.Function`'s node is its ctx: tensors it kept as attributes (`ctx.mask = mask`).

    What it saved with `save_for_backward` is in `_raw_saved_tensors`, read with the other saved attributes."""
    try:
        state = object.__getattribute__(node, "__dict__")
    except (AttributeError, TypeError):
        return
    for value in list(state.values()):
        if issubclass(type(value), tensor_type):
            yield value


class GraphTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"an autograd graph has more than {limit:,} nodes; the rest of it was not walked")
