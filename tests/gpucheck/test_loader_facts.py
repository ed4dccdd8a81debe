"""The DataLoader facts reader on real DataLoaders: what `%gpucheck` and `%dataprobe` judge workers by."""

from __future__ import annotations

import json
import multiprocessing

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from jupyter_gpu.facts.loader import LARGE_CONTAINER_ITEMS, loader_facts, loader_types
from jupyter_gpu.facts.notebook import gather_notebook_facts

TYPES = loader_types(torch)


def facts(loader, name="loader"):
    found = loader_facts(name, loader, TYPES)
    return json.loads(json.dumps(found))  # what a saved snapshot holds


class ListDataset(Dataset):
    """Samples kept as one Python list, the way many hand-written datasets keep file names or records."""

    def __init__(self, count: int) -> None:
        self.samples = list(range(count))
        self.labels = {i: i % 10 for i in range(count // 2)}
        self.classes = ["cat", "dog"]
        self.loaded = 0

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> torch.Tensor:
        self.loaded += 1
        return torch.tensor([float(self.samples[index])])


def test_a_tensor_dataset_loader():
    loader = DataLoader(TensorDataset(torch.zeros(100, 3, 8), torch.zeros(100)), batch_size=10, num_workers=2,
                        prefetch_factor=3, persistent_workers=True, multiprocessing_context="fork")
    entry = facts(loader)
    assert entry == {
        "kind": "dataloader", "name": "loader", "batch_size": 10, "num_workers": 2, "pin_memory": False,
        "persistent_workers": True, "start_method": "fork", "dataset_class": "TensorDataset",
        "dataset_module": "torch.utils.data.dataset", "dataset_len": 100, "prefetch_factor": 3,
        "sample_bytes": 3 * 8 * 4 + 4,  # one float32 row of 3 x 8, one float32 target
        "cuda_initialized": False, "dataset_cuda": None, "dataset_python_containers": [], "notebook_defined": [],
    }
    assert not torch.cuda.is_initialized()  # reading the loader never starts CUDA


def test_a_subset_chain_is_followed_for_sample_size_and_containers():
    inner = ListDataset(LARGE_CONTAINER_ITEMS * 2)
    # random_split's Subsets keep their indices as a Python list: a large one is copied per worker too.
    chain = Subset(Subset(inner, list(range(150_000))), list(range(10)))
    entry = facts(DataLoader(chain, batch_size=4))
    assert (entry["dataset_class"], entry["dataset_len"], entry["sample_bytes"]) == ("Subset", 10, None)
    assert entry["dataset_python_containers"] == [
        {"path": "dataset.dataset.indices", "type": "list", "items": 150_000},
        {"path": "dataset.dataset.dataset.samples", "type": "list", "items": 200_000},
        {"path": "dataset.dataset.dataset.labels", "type": "dict", "items": 100_000},
    ]
    tensors = Subset(Subset(TensorDataset(torch.zeros(50, 16, dtype=torch.float64)), [1, 2, 3]), [0])
    assert facts(DataLoader(tensors))["sample_bytes"] == 16 * 8
    assert inner.loaded == 0


def test_a_dataset_with_a_200_000_item_list_names_it_without_reading_a_sample():
    dataset = ListDataset(200_000)
    entry = facts(DataLoader(dataset, batch_size=32, num_workers=2))
    # The 100,000-item dict of labels counts too; the two-item list of classes does not.
    assert entry["dataset_python_containers"] == [
        {"path": "dataset.samples", "type": "list", "items": 200_000},
        {"path": "dataset.labels", "type": "dict", "items": 100_000},
    ]
    assert entry["dataset_cuda"] is None and dataset.loaded == 0


def test_a_small_dataset_has_nothing_to_report():
    dataset = ListDataset(1000)
    entry = facts(DataLoader(dataset, batch_size=8))
    assert entry["dataset_python_containers"] == [] and entry["dataset_cuda"] is None
    assert entry["sample_bytes"] is None and entry["dataset_len"] == 1000 and dataset.loaded == 0


def fake_cuda(*shape: int) -> torch.Tensor:
    """A real torch tensor that reports cuda:0, without CUDA: FakeTensorMode keeps only the metadata."""
    with FakeTensorMode():
        return torch.empty(*shape, device="cuda")


class CachedOnDevice(Dataset):
    def __init__(self) -> None:
        self.images = torch.zeros(8, 3)
        self.cache = {"mean": torch.zeros(3), "std": fake_cuda(3)}

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        raise AssertionError("the reader must not load a sample")


def test_cuda_tensors_are_found_by_attribute_in_tensors_subsets_and_dicts():
    on_gpu = TensorDataset(torch.zeros(4, 2), fake_cuda(4))
    assert facts(DataLoader(on_gpu))["dataset_cuda"] == "dataset.tensors[1] on cuda:0"
    assert facts(DataLoader(Subset(on_gpu, [0, 1])))["dataset_cuda"] == "dataset.dataset.tensors[1] on cuda:0"
    assert facts(DataLoader(CachedOnDevice()))["dataset_cuda"] == "dataset.cache['std'] on cuda:0"
    assert not torch.cuda.is_initialized()


def test_start_method_is_read_without_fixing_the_process_wide_one():
    before = multiprocessing.get_start_method(allow_none=True)
    entry = facts(DataLoader(TensorDataset(torch.zeros(4)), num_workers=1))
    assert entry["start_method"] in multiprocessing.get_all_start_methods()
    assert multiprocessing.get_start_method(allow_none=True) == before
    assert facts(DataLoader(TensorDataset(torch.zeros(4)), num_workers=1,
                            multiprocessing_context="spawn"))["start_method"] == "spawn"


def test_the_notebook_reader_reports_loaders_with_the_same_facts():
    loader = DataLoader(ListDataset(200_000), batch_size=16, num_workers=2)
    (entry,) = gather_notebook_facts({"train_loader": loader})["objects"]
    assert entry == facts(loader, "train_loader")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_dataset_on_a_real_gpu_and_an_initialised_cuda():
    entry = facts(DataLoader(TensorDataset(torch.zeros(4, 2, device="cuda")), num_workers=2))
    assert entry["cuda_initialized"] is True
    assert entry["dataset_cuda"] == f"dataset.tensors[0] on cuda:{torch.cuda.current_device()}"
