"""The check that worker settings deliver the same data as num_workers=0, on batches real DataLoaders yield."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from jupyter_gpu.dataprobe.repeats import fingerprint, repeated, repeats


class Stream(IterableDataset):
    """64 items; `split`: each worker keeps its share; `augment`: random noise on every image (each worker's torch
    RNG is seeded apart, so workers' copies of an image differ while its label and id do not)."""

    def __init__(self, *, split: bool = False, augment: bool = False, constant: bool = False) -> None:
        self.split, self.augment, self.constant = split, augment, constant

    def __iter__(self):
        info = get_worker_info()
        items = range(64)
        if self.split and info is not None:
            items = items[info.id::info.num_workers]
        for index in items:
            image = torch.zeros(3, 4, 4) if self.constant else torch.full((3, 4, 4), float(index))
            if self.augment:
                image = image + torch.randn(3, 4, 4)
            yield image, {"id": 0 if self.constant else index}


def first_batches(dataset: IterableDataset, workers: int, count: int = 8) -> list:
    loader = DataLoader(dataset, batch_size=4, num_workers=workers)
    return [fingerprint(batch) for batch in itertools.islice(loader, count)]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_workers_that_each_yield_the_whole_stream_repeat_every_batch_once_per_worker() -> None:
    reference = first_batches(Stream(), 0)
    assert repeats(reference, first_batches(Stream(), 2)) == 2.0
    assert repeats(reference, first_batches(Stream(), 4)) == 4.0
    assert repeated(2.0)


def test_workers_that_split_the_stream_deliver_what_num_workers_0_does() -> None:
    reference = first_batches(Stream(split=True), 0)
    assert repeats(reference, first_batches(Stream(split=True), 2)) == 1.0
    assert not repeated(1.0) and not repeated(None)


def test_augmented_images_do_not_hide_the_repeated_labels() -> None:
    reference = first_batches(Stream(augment=True), 0)
    assert repeats(reference, first_batches(Stream(augment=True), 2)) == 2.0


def test_batches_alike_at_num_workers_0_give_no_evidence() -> None:
    reference = first_batches(Stream(constant=True), 0)
    assert repeats(reference, first_batches(Stream(constant=True), 2)) is None
    assert repeats(reference[:1], first_batches(Stream(), 2)) is None  # one batch compares nothing


def test_a_detection_batch_and_plain_values_are_fingerprinted_by_content() -> None:
    images = tuple(torch.full((3, 4, 4), float(i)) for i in range(3))
    batch = (images, ({"boxes": torch.zeros(1, 4)},) * 3, ["a.jpg", "b.jpg", "c.jpg"])
    assert fingerprint(batch) == fingerprint((tuple(t.clone() for t in images), batch[1], list(batch[2])))
    assert fingerprint(batch) != fingerprint((images, batch[1], ["a.jpg", "b.jpg", "d.jpg"]))
    large = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB: evenly spaced elements are hashed
    assert fingerprint(large) != fingerprint(large + 1)
