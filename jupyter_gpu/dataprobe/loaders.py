"""Fresh DataLoaders built like the user's, and what the probe reads from their batches and workers.

The user's loader is never iterated: iterating it would advance its sampler and, with persistent workers, its live
iterator. Every setting gets a new DataLoader over the same dataset, sampler (or batch sampler), batch size,
collate function, drop_last, timeout, worker_init_fn, start method and generator. Samplers and generators are
shared objects, so their state is put back afterwards (`SamplerStates`). torch is imported inside functions only.

The fresh loaders' collate function is the user's, wrapped to return how many items it was handed along with the
batch (`CountingCollate`): that is the number of indices the sampler drew, or of items taken from an
IterableDataset, whatever shape the batch has (torchvision's detection collate `tuple(zip(*b))` makes a batch of 8
images a tuple of 8 tensors, whose first dimension is an image's channels).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_gpu.dataprobe.result import WorkerMemory
from jupyter_gpu.dataprobe.settings import LoaderSettings
from jupyter_gpu.probekit.batch_structure import leaves, mapped
from jupyter_gpu.probekit.reach import generator_access, reach_from_loader


class LoaderError(ValueError):
    """The object cannot be probed as a DataLoader; the message is one sentence for the user."""


def current_settings(loader: Any) -> LoaderSettings:
    return LoaderSettings(int(loader.num_workers), getattr(loader, "prefetch_factor", None),
                          bool(loader.persistent_workers), bool(loader.pin_memory))


@dataclass
class LoaderRecipe:
    """The user's DataLoader arguments apart from the ones the sweep varies."""

    arguments: dict[str, Any]
    current: LoaderSettings
    iterable: bool
    batch_size: int | None
    dataset_len: int | None

    def build(self, settings: LoaderSettings, counting: bool = True) -> Any:
        """The user's loader with `settings`; `counting`: its batches come as (samples, batch) for the probe's
        count (CountingCollate), else exactly as the user's loader yields them."""
        from torch.utils.data import DataLoader

        arguments = dict(self.arguments)
        batched = arguments.get("batch_size") is not None or "batch_sampler" in arguments
        if counting:
            arguments["collate_fn"] = CountingCollate(arguments["collate_fn"], batched)
        if settings.num_workers == 0:
            arguments.pop("multiprocessing_context", None)  # DataLoader refuses a start method without workers
        with quiet_worker_count():
            return DataLoader(**arguments, **settings.kwargs())


class CountingCollate:
    """The user's collate function, returning (items it was handed, the batch): the samples a batch holds.

    With automatic batching the DataLoader hands it the list of items fetched for one batch (one per index its
    sampler drew); without, one item, which is a batch the dataset made itself: its size is then not known here
    (None). A module-level class, so that workers started with spawn can unpickle it.
    """

    def __init__(self, collate_fn: Any, batched: bool) -> None:
        self.collate_fn = collate_fn
        self.batched = batched

    def __call__(self, items: Any) -> tuple[int | None, Any]:
        return (len(items) if self.batched else None), self.collate_fn(items)


@contextmanager
def quiet_worker_count() -> Iterator[None]:
    """Silence torch's "This DataLoader will create N worker processes" warning (given when a DataLoader is built
    and again when iterated): the result says once, for the whole sweep, which counts exceed the usable CPUs."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        yield


def recipe_of(loader: Any) -> LoaderRecipe:
    from torch.utils.data import DataLoader, IterableDataset

    if not isinstance(loader, DataLoader):
        raise LoaderError(f"it is a {type(loader).__name__}, not a torch.utils.data.DataLoader")
    dataset = loader.dataset
    iterable = isinstance(dataset, IterableDataset)
    arguments: dict[str, Any] = {
        "dataset": dataset, "collate_fn": loader.collate_fn, "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn, "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
    }
    if hasattr(loader, "in_order"):
        arguments["in_order"] = loader.in_order
    if loader.batch_size is not None:
        # DataLoader built its own BatchSampler from these: passing them rebuilds the same one.
        arguments.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
        if not iterable:
            arguments["sampler"] = loader.sampler
    elif loader.batch_sampler is not None:
        # The user's own batch sampler; batch_size, sampler and drop_last must then stay at their defaults.
        arguments["batch_sampler"] = loader.batch_sampler
    else:
        arguments["batch_size"] = None  # no automatic batching: each item is a batch
        if not iterable:
            arguments["sampler"] = loader.sampler
    try:
        length: int | None = len(dataset)
    except TypeError:  # an IterableDataset without __len__
        length = None
    if length == 0:
        raise LoaderError("its dataset is empty (len 0), so it yields no batch to measure")
    batch = loader.batch_size if loader.batch_size is not None else getattr(loader.batch_sampler, "batch_size", None)
    return LoaderRecipe(arguments, current_settings(loader), iterable, batch, length)


# -- sampler and generator state --------------------------------------------------------------------------------


@dataclass
class SamplerStates:
    """The random generators the user's loader reaches, and the plain attributes of its sampler and batch sampler.

    A RandomSampler built with a generator advances it on every epoch; a bucketing batch sampler may shuffle with
    its own `np.random.default_rng` and count epochs in an attribute; a dataset may augment with its own
    `random.Random`, also below a `random_split`/`Subset`/`ConcatDataset`, in its transform, or from a notebook-global
    `rng` its `__getitem__` names; a collator may mask with its own `torch.Generator`. All are shared with the fresh
    loaders (the dataset is used in the kernel's process at num_workers=0), so every generator that
    `probekit.reach.reach_from_loader` finds is put back. The dataset's other attributes are left alone: it may cache
    what it loads.
    """

    generators: list[tuple[Any, Any, Any]] = field(default_factory=list)  # (generator, its state, set_state)
    attributes: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)  # (object, shallow copy of __dict__)
    paths: list[str] = field(default_factory=list)  # how the user names each generator: "full_ds.rng", "rng"

    @classmethod
    def take(cls, loader: Any, namespace: Mapping[str, Any] | None = None) -> SamplerStates:
        states = cls()
        seen: set[int] = set()
        for owner in [loader.sampler, loader.batch_sampler, getattr(loader.batch_sampler, "sampler", None)]:
            if owner is None or id(owner) in seen:
                continue
            seen.add(id(owner))
            attributes = getattr(owner, "__dict__", None)
            if isinstance(attributes, dict):
                states.attributes.append((owner, dict(attributes)))
        for reached in reach_from_loader(loader, namespace or {}):
            access = generator_access(reached.value) if reached.kind == "generator" else None
            if access is not None:
                get_state, set_state = access
                states.generators.append((reached.value, get_state(), set_state))
                states.paths.append(reached.path)
        return states

    def restore(self) -> None:
        for owner, attributes in self.attributes:
            owner.__dict__.clear()
            owner.__dict__.update(attributes)
        for _, state, set_state in self.generators:
            set_state(state)


# -- batches --------------------------------------------------------------------------------------------------


def _tensors(batch: Any) -> Iterator[Any]:
    import torch

    return (value for value in leaves(batch) if isinstance(value, torch.Tensor))


def batch_samples(batch: Any, items: int | None) -> int:
    """How many samples a batch holds: the items its collate function was handed (the indices drawn), else its
    outer length (see `outer_length`)."""
    return items if items is not None else outer_length(batch)


def outer_length(batch: Any) -> int:
    """The samples in a batch the dataset made itself (no automatic batching): the leading dimension that every
    tensor in it shares (one tensor: its own), else 1, one item.

    A sample such as (image 3xHxW, label) counts 1, not 3: its tensors do not share a leading dimension.
    """
    leading = {int(tensor.shape[0]) if tensor.dim() > 0 else None for tensor in _tensors(batch)}
    if len(leading) == 1 and None not in leading:
        return leading.pop() or 1
    return 1


def batch_cuda_device(batch: Any) -> str | None:
    """The CUDA device of the first CUDA tensor in a batch ("cuda:0"), or None."""
    return next((str(tensor.device) for tensor in _tensors(batch) if tensor.is_cuda), None)


def batch_bytes(batch: Any) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in _tensors(batch))


def to_device(batch: Any, device: Any, *, non_blocking: bool = False) -> Any:
    """The batch with every tensor on `device`, its structure kept (probekit.batch_structure)."""
    import torch

    return mapped(batch, lambda value: value.to(device, non_blocking=non_blocking)
                  if isinstance(value, torch.Tensor) else value)


# -- worker processes -----------------------------------------------------------------------------------------


def worker_pids(iterator: Any) -> list[int]:
    """The worker processes of a multi-process DataLoader iterator (none for num_workers=0)."""
    return [worker.pid for worker in getattr(iterator, "_workers", []) if worker.pid is not None]


def worker_memory(pids: list[int], proc: Path = Path("/proc")) -> WorkerMemory | None:
    """The largest worker's resident and private bytes, from /proc/PID/smaps_rollup; None where /proc has none."""
    largest_rss, largest_private, read = 0, None, 0
    for pid in pids:
        fields = _smaps_rollup(proc / str(pid) / "smaps_rollup")
        if fields is None:
            continue
        read += 1
        largest_rss = max(largest_rss, fields.get("Rss", 0))
        if "Private_Clean" in fields or "Private_Dirty" in fields:
            private = fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
            largest_private = max(largest_private or 0, private)
    if read == 0:
        return None
    return WorkerMemory(workers=len(pids), rss_bytes=largest_rss, private_bytes=largest_private)


def _smaps_rollup(path: Path) -> dict[str, int] | None:
    try:
        text = path.read_text()
    except OSError:  # not Linux, or the worker has just exited
        return None
    fields: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            fields[name] = int(parts[0]) * 1024
    return fields


def shut_down(iterator: Any) -> None:
    """Stop the iterator's workers now and wait for them (garbage collection would do it some time later)."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity), which a container or `taskset` may make fewer than all."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return len(affinity(0))
    return os.cpu_count() or 1
