"""The DataLoader worker rules over plain fact dicts (the JSON a saved snapshot holds, or `%dataprobe` builds)."""

from __future__ import annotations

import json

from jupyter_gpu.gpucheck.diagnose.worker_rules import fits_shm, worker_findings, workers_blocked

MIB = 1 << 20
# torch/cuda/__init__.py, raised in a forked child once the parent initialised CUDA (torch 2.13).
TORCH_FORK_ERROR = (
    "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, "
    "you must use the 'spawn' start method"
)


def loader(name="train_loader", *, workers=2, start="fork", cuda_initialized=False, dataset_cuda=None,
           containers=(), module_name="torch.utils.data.dataset"):
    return {
        "kind": "dataloader", "name": name, "batch_size": 32, "num_workers": workers, "pin_memory": False,
        "persistent_workers": False, "start_method": start, "dataset_class": "FaceDataset",
        "dataset_module": module_name, "dataset_len": 50_000, "prefetch_factor": 2 if workers else None,
        "sample_bytes": None, "cuda_initialized": cuda_initialized, "dataset_cuda": dataset_cuda,
        "dataset_python_containers": list(containers),
    }


def codes(findings):
    return [f.code for f in findings]


def judge(*loaders, shm_bytes=None):
    return worker_findings(list(loaders), shm_bytes=shm_bytes, hosting=None)


CUDA_LOADER = {"cuda_initialized": True, "dataset_cuda": "dataset.tensors[0] on cuda:0"}


def test_cuda_tensors_in_a_forked_workers_dataset_name_torchs_own_error():
    (f,) = judge(loader(**CUDA_LOADER))
    assert f.code == "CUDA_IN_FORKED_WORKER" and f.severity == "warn"
    # The user searches for the message they will see, so the headline carries torch's exact words.
    assert TORCH_FORK_ERROR in f.headline
    assert "`train_loader`" in f.headline and "dataset.tensors[0] on cuda:0" in f.headline
    assert f.evidence == {"variable": "train_loader", "start_method": "fork", "num_workers": 2,
                          "cuda_initialized": True, "dataset_cuda": "dataset.tensors[0] on cuda:0"}
    assert 'data = torch.load(path, map_location="cpu")  # or tensor.cpu() before building the dataset' in f.fix
    assert any(line.startswith('batch = batch.to("cuda"') for line in f.fix)
    assert "# or load in the kernel's process: train_loader = DataLoader(..., num_workers=0)" in f.fix


def test_cuda_in_forked_worker_needs_fork_workers_an_initialised_cuda_and_cuda_tensors():
    assert judge(loader(**{**CUDA_LOADER, "cuda_initialized": False})) == []
    assert judge(loader(**{**CUDA_LOADER, "dataset_cuda": None})) == []
    assert judge(loader(workers=0, **CUDA_LOADER)) == []
    # spawn starts a fresh interpreter, which may initialise CUDA itself.
    assert judge(loader(start="spawn", **CUDA_LOADER)) == []
    # A snapshot saved before these keys existed has no such finding, and no KeyError.
    old = {k: v for k, v in loader().items() if k not in ("cuda_initialized", "dataset_cuda",
                                                          "dataset_python_containers")}
    assert judge(old) == []


def test_large_python_containers_give_copy_on_read_with_their_sizes():
    containers = [{"path": "dataset.samples", "type": "list", "items": 1_200_000},
                  {"path": "dataset.labels", "type": "dict", "items": 300_000}]
    (f,) = judge(loader(workers=4, containers=containers))
    assert f.code == "DATASET_COPY_ON_READ" and f.severity == "info"
    assert "`dataset.samples` (list, 1,200,000 items)" in f.headline and "each of its 4 workers" in f.headline
    assert f.evidence["containers"] == ["dataset.samples: list of 1,200,000 items",
                                        "dataset.labels: dict of 300,000 items"]
    assert f.fix[0].startswith("self.samples = np.array(self.samples)")
    assert f.fix[-1].startswith("%dataprobe train_loader ") and "worker memory" in f.fix[-1]
    assert "https://github.com/pytorch/pytorch/issues/13246" in f.refs


def test_copy_on_read_fixes_a_dict_with_arrays_of_its_keys_and_values():
    (f,) = judge(loader(containers=[{"path": "dataset.dataset.index", "type": "dict", "items": 200_000}]))
    assert f.fix[:2] == [
        "self.index_keys = np.array(list(self.index))  # in the Dataset's __init__: one buffer, no object per item",
        "self.index_values = np.array(list(self.index.values()))  # np.searchsorted finds a key",
    ]


def test_copy_on_read_needs_workers():
    containers = [{"path": "dataset.samples", "type": "list", "items": 1_200_000}]
    assert judge(loader(workers=0, containers=containers)) == []


def test_findings_come_per_loader_then_shared_memory_over_all():
    spawn = loader("a", start="spawn", module_name="__main__",
                   containers=[{"path": "dataset.rows", "type": "list", "items": 500_000}])
    found = judge(spawn, loader("b", **CUDA_LOADER), shm_bytes=64 * MIB)
    assert codes(found) == ["NOTEBOOK_SPAWN_PICKLING", "DATASET_COPY_ON_READ", "CUDA_IN_FORKED_WORKER",
                            "SHM_TOO_SMALL"]
    assert found[-1].evidence["dataloaders"] == ["a", "b"]
    assert json.loads(json.dumps([f.to_dict() for f in found]))  # a snapshot keeps them


def test_workers_blocked_names_each_reason_and_only_blocking_ones():
    spawn = loader("a", start="spawn", module_name="__main__")
    sentence = workers_blocked(judge(spawn, loader("b", **CUDA_LOADER)))
    assert sentence.startswith("No worker setting can run: workers started with 'spawn' cannot import the dataset "
                               "class `FaceDataset`")
    assert "(dataset.tensors[0] on cuda:0)" in sentence and sentence.endswith("only num_workers=0 loads here.")
    containers = [{"path": "dataset.samples", "type": "list", "items": 1_200_000}]
    assert workers_blocked(judge(loader(containers=containers), shm_bytes=64 * MIB)) is None


def test_a_measured_batch_size_counts_before_the_sample_size():
    measured = {**loader(workers=2), "sample_bytes": 1024, "batch_bytes": 48 * MIB}
    (f,) = judge(measured, shm_bytes=64 * MIB)
    assert f.evidence["batches_in_flight"] == [
        "`train_loader`: 2 workers x prefetch_factor 2 x 48.0 MiB per batch (measured) = 192.0 MiB"]
    assert "192.0 MiB" in f.headline


def test_fits_shm_applies_the_headroom_shm_too_small_sizes_with():
    # 2 workers x 2 batches x 16 MiB = 64 MiB in flight, doubled: 128 MiB.
    assert fits_shm(2, 2, 16 * MIB, 128 * MIB) and not fits_shm(2, 2, 16 * MIB, 127 * MIB)
    assert fits_shm(2, None, 16 * MIB, 128 * MIB)  # torch's default prefetch of 2
    assert not fits_shm(2, 4, 16 * MIB, 128 * MIB)


def test_a_notebook_collate_fn_under_spawn_is_named_with_a_library_dataset():
    spawn = loader("a", start="spawn")
    spawn["notebook_defined"] = [{"what": "collate_fn", "name": "pad_batch"},
                                 {"what": "sampler class", "name": "BucketSampler"}]
    (finding,) = judge(spawn)
    assert finding.code == "NOTEBOOK_SPAWN_PICKLING"
    assert "the collate_fn `pad_batch` and the sampler class `BucketSampler`" in finding.headline
    assert "from datasets import pad_batch, BucketSampler" in finding.fix
    assert workers_blocked([finding]).startswith("No worker setting can run: workers started with 'spawn' cannot "
                                                 "import the collate_fn `pad_batch` and the sampler class")
