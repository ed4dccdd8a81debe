"""DataLoader facts: what a live `torch.utils.data.DataLoader` says about the workers it would start.

Probe ring: this module reads a loader and its dataset by their attributes only. It never iterates the loader,
never calls the dataset's `__getitem__`, never imports torch (its classes are passed in as `types`) and never
initialises CUDA: it reads `torch.cuda.is_initialized()` through `jupyter_gpu.kernel_torch`. Both
`%gpucheck` (through `facts.notebook`) and `%dataprobe` (before it starts any worker) read loaders here, so the
worker rules of `diagnose.worker_rules` judge the same facts in both.

`loader_facts()` returns a JSON-serialisable dict. Every key:

- `kind` ("dataloader"), `name` (the variable).
- `batch_size` (None with a batch_sampler), `num_workers`, `pin_memory`, `persistent_workers`.
- `start_method`: the loader's multiprocessing_context, else the process-wide start method, else the platform
  default.
- `dataset_class` (qualified name), `dataset_module` (`type(dataset).__module__`), `dataset_len` (None when
  `len()` is unsupported or raised).
- `prefetch_factor`: batches each worker loads ahead, as the loader holds it (None with num_workers=0).
- `sample_bytes`: bytes of one sample, read from the tensors' shapes of a `TensorDataset`, also inside a `Subset`;
  None for any other dataset.
- `cuda_initialized` (bool): CUDA is initialised in this process, so a forked worker cannot use it.
- `dataset_cuda` (str | None): where the dataset holds CUDA tensors, e.g. "dataset.tensors[0] on cuda:0" (at
  most MAX_CUDA_PLACES places, comma-separated); None when none was found. Found in the attributes of the dataset
  and of each dataset a `Subset` chain wraps, one level deep, also inside lists, tuples and dicts held there.
- `dataset_python_containers` (list of dict): plain Python lists, dicts and sets (subclasses too, named by
  their base type) of at least LARGE_CONTAINER_ITEMS items in those same attributes: `{"path": "dataset.samples",
  "type": "list", "items": 1200000}`. Their length is read with `len()`; their items are never visited.
"""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Iterator
from typing import Any

from jupyter_gpu.kernel_torch import cuda_initialized, loaded_torch

MAX_SUBSET_DEPTH = 8  # Subset(Subset(...)) chains deeper than this are not followed
# A worker copies each memory page whose objects it reads, because reading an object updates its reference count
# (pytorch/pytorch#13246). Python objects take tens of bytes, so 100,000 items are megabytes copied into every
# worker, and the millions in the reports grow each worker by gigabytes; a smaller container costs nothing a
# user would notice.
LARGE_CONTAINER_ITEMS = 100_000
# A list of per-sample CUDA tensors has them from its first item on; looking further only costs time on the
# large containers this module must stay cheap on.
ITEMS_LOOKED_AT = 16
MAX_CUDA_PLACES = 3  # enough to show where the CUDA tensors are, short enough for a headline
ROOT = "dataset"


def loader_types(torch: Any) -> dict[str, Any]:
    """The classes `loader_facts` needs, looked up on the torch the loader came from (never imported here)."""
    data = torch.utils.data
    return {"tensor": (torch.Tensor,), "tensor_dataset": (data.TensorDataset,), "subset": (data.Subset,)}


def loader_facts(name: str, loader: Any, types: dict[str, Any]) -> dict[str, Any]:
    """The facts of one DataLoader bound to `name`, as the module docstring lists them.

    `types` maps "tensor", "tensor_dataset" and "subset" to tuples of torch classes (`loader_types(torch)`, or the
    notebook reader's larger table); an empty tuple means this torch lacks the class.
    """
    dataset = loader.dataset
    try:
        length: int | None = len(dataset)
    except Exception:  # IterableDataset raises TypeError; a user's __len__ may raise anything
        length = None
    prefetch = getattr(loader, "prefetch_factor", None)
    return {
        "kind": "dataloader",
        "name": name,
        "batch_size": loader.batch_size,
        "num_workers": int(loader.num_workers),
        "pin_memory": bool(loader.pin_memory),
        "persistent_workers": bool(loader.persistent_workers),
        "start_method": start_method(loader),
        "dataset_class": type(dataset).__qualname__,
        "dataset_module": type(dataset).__module__,
        "dataset_len": length,
        "prefetch_factor": int(prefetch) if prefetch is not None else None,
        "sample_bytes": _sample_bytes(dataset, types),
        "cuda_initialized": cuda_initialized(loaded_torch()),
        "dataset_cuda": _cuda_places(dataset, types),
        "dataset_python_containers": _large_containers(dataset, types),
        "notebook_defined": _notebook_defined(loader, types),
    }


# What a worker started with spawn or forkserver must import by name: a class or function defined in a notebook
# lives in the kernel's __main__, which the worker's fresh interpreter does not have.
_MAIN_MODULES = ("__main__", "__mp_main__")


def _notebook_defined(loader: Any, types: dict[str, Any]) -> list[dict[str, str]]:
    """What the loader's workers would need from the notebook itself, e.g. {"what": "collate_fn", "name":
    "collate"}, {"what": "dataset class", "name": "Images"} (also inside a Subset chain), sampler classes and the
    worker_init_fn."""
    found = []
    for path, dataset in _datasets(loader.dataset, types):
        if type(dataset).__module__ in _MAIN_MODULES:
            found.append({"what": f"{'dataset' if path == ROOT else path} class",
                          "name": type(dataset).__qualname__})
    for role in ("sampler", "batch_sampler"):
        value = getattr(loader, role, None)
        if value is not None and type(value).__module__ in _MAIN_MODULES:
            found.append({"what": f"{role} class", "name": type(value).__qualname__})
    for role in ("collate_fn", "worker_init_fn"):
        value = getattr(loader, role, None)
        if value is not None and getattr(value, "__module__", None) in _MAIN_MODULES:
            found.append({"what": role, "name": getattr(value, "__qualname__", type(value).__qualname__)})
    return found


def start_method(loader: Any) -> str:
    """How this loader would start its workers: "fork", "spawn" or "forkserver"."""
    context = loader.multiprocessing_context
    if isinstance(context, str):
        return context
    if context is not None:
        return str(context.get_start_method())
    # allow_none=True and get_all_start_methods() both read without fixing the process-wide context.
    chosen = multiprocessing.get_start_method(allow_none=True)
    return chosen or multiprocessing.get_all_start_methods()[0]


def _isa(value: Any, types: dict[str, Any], kind: str) -> bool:
    return bool(types[kind]) and isinstance(value, types[kind])


def _sample_bytes(dataset: Any, types: dict[str, Any]) -> int | None:
    """One sample's bytes from the tensors' shapes alone; None unless that is known without loading a sample."""
    for _ in range(MAX_SUBSET_DEPTH):
        if _isa(dataset, types, "subset"):
            dataset = dataset.dataset
            continue
        if _isa(dataset, types, "tensor_dataset"):
            # Row i of every tensor is sample i: its bytes are one row's elements times the element size.
            return sum(math.prod(t.shape[1:]) * t.element_size() for t in dataset.tensors)
        return None
    return None


def _datasets(dataset: Any, types: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(path, dataset) for the dataset and each dataset its Subset chain wraps: "dataset", "dataset.dataset", ..."""
    path = ROOT
    for _ in range(MAX_SUBSET_DEPTH):
        yield path, dataset
        if not _isa(dataset, types, "subset"):
            return
        dataset, path = dataset.dataset, f"{path}.dataset"


def _attributes(dataset: Any, types: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(path, value) of each attribute the datasets hold in their `__dict__`; a Subset's inner dataset is not one
    (it is visited as a dataset of its own)."""
    for path, level in _datasets(dataset, types):
        try:
            attributes = vars(level)
        except TypeError:  # a class with __slots__ only: nothing held in a __dict__
            continue
        for key, value in list(attributes.items()):
            if key == "dataset" and _isa(level, types, "subset"):
                continue
            yield f"{path}.{key}", value


def _held(value: Any) -> Iterator[tuple[str, Any]]:
    """The value itself, then the first items of a list, tuple or dict, each with the suffix that names it."""
    yield "", value
    if isinstance(value, list | tuple):
        for index, item in enumerate(value[:ITEMS_LOOKED_AT]):
            yield f"[{index}]", item
    elif isinstance(value, dict):
        for count, (key, item) in enumerate(value.items()):
            if count >= ITEMS_LOOKED_AT:
                break
            yield f"[{key!r}]", item


def _cuda_places(dataset: Any, types: dict[str, Any]) -> str | None:
    if not types["tensor"]:
        return None
    places = []
    for path, value in _attributes(dataset, types):
        for suffix, item in _held(value):
            if isinstance(item, types["tensor"]) and item.device.type == "cuda":  # ROCm's devices are "cuda" too
                places.append(f"{path}{suffix} on {item.device}")
                if len(places) == MAX_CUDA_PLACES:
                    return ", ".join(places)
    return ", ".join(places) or None


def _large_containers(dataset: Any, types: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for path, value in _attributes(dataset, types):
        kind = next((k for k in (list, dict, set) if isinstance(value, k)), None)
        if kind is not None and len(value) >= LARGE_CONTAINER_ITEMS:
            # The base type, so a rule need not know OrderedDict or defaultdict to give the right fix.
            found.append({"path": path, "type": kind.__name__, "items": len(value)})
    return found
