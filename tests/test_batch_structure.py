"""The shapes a collate function gives a batch, walked alike by the probes that move, resize or count it: tuples,
lists, dicts and other mappings, namedtuples and dataclasses, nested; real tensors (CPU torch)."""

from __future__ import annotations

from collections import UserDict, namedtuple
from dataclasses import dataclass, field

import torch

from jupyter_gpu.dataprobe.loaders import batch_bytes, to_device
from jupyter_gpu.gpuprofile.batches import resize_batch
from jupyter_gpu.probekit.batch_structure import first_dimension, leaves, mapped

Pair = namedtuple("Pair", "x y")


@dataclass
class Batch:
    x: torch.Tensor
    y: torch.Tensor
    ids: list = field(default_factory=list)


class Encoding(UserDict):
    """Like Hugging Face's BatchEncoding: a mapping that is not a dict."""


def test_a_namedtuple_batch_is_resized_as_a_namedtuple() -> None:
    batch = Pair(torch.arange(4).float().unsqueeze(1), torch.arange(4))
    resized = resize_batch(batch, 6)
    assert type(resized) is Pair and resized.y.tolist() == [0, 1, 2, 3, 0, 1] and resized.x.shape == (6, 1)


def test_a_dataclass_batch_with_per_sample_ids_is_resized_field_by_field() -> None:
    batch = Batch(torch.zeros(3, 2), torch.tensor([5, 6, 7]), ["a", "b", "c"])
    resized = resize_batch(batch, 5)
    assert type(resized) is Batch and resized.y.tolist() == [5, 6, 7, 5, 6] and resized.ids == list("abcab")
    assert first_dimension(batch, torch.Tensor) == 3
    ids = resize_batch((torch.zeros(3, 2), ("a", "b", "c")), 4)[1]
    assert ids == ("a", "b", "c", "a")  # per-sample names in a tuple too


def test_a_mapping_that_is_not_a_dict_keeps_its_type_and_nested_parts_are_reached() -> None:
    batch = Encoding({"input_ids": torch.ones(2, 8, dtype=torch.long), "extra": {"mask": (torch.ones(2, 8),)}})
    resized = resize_batch(batch, 4)
    assert type(resized) is Encoding and resized["input_ids"].shape == (4, 8)
    assert resized["extra"]["mask"][0].shape == (4, 8)
    assert batch_bytes(batch) == 2 * 8 * 8 + 2 * 8 * 4


def test_to_device_keeps_every_container_type_and_moves_every_tensor() -> None:
    batch = {"pair": Pair(torch.ones(2), torch.zeros(2)), "rows": [Batch(torch.ones(1), torch.ones(1), ["id"])]}
    moved = to_device(batch, torch.device("cpu"))
    assert type(moved["pair"]) is Pair and type(moved["rows"][0]) is Batch and moved["rows"][0].ids == ["id"]
    assert [type(value).__name__ for value in leaves(moved)] == ["Tensor", "Tensor", "Tensor", "Tensor", "str"]


def test_a_structure_that_contains_itself_stops_instead_of_recursing_forever() -> None:
    looped: list = [torch.ones(1)]
    looped.append(looped)
    assert mapped(looped, lambda value: value) is not None
    assert first_dimension(looped, torch.Tensor) == 1
