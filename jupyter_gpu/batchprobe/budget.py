"""Memory budgets: how much a trial may use, what it used, and the out-of-memory error when it is crossed.

Two ways to account, one interface:

- `AllocatorBudget` (CUDA): the caching allocator is the truth. `--max-memory` becomes
  `set_per_process_memory_fraction`, so PyTorch itself raises its real out-of-memory error; the peak is
  the allocator's reserved peak (what the cap limits), with the allocated peak reported beside it.
- `TensorBudget` (the CPU, and any device without allocator statistics): a `TorchDispatchMode` adds up
  the storages that live tensors hold, frees them through weak references to the storage (a tensor can
  die while autograd keeps its storage for backward), and raises `torch.OutOfMemoryError` the moment the
  total crosses the budget. This is how the whole probe runs for real on a machine without a GPU.

Both count absolute bytes: tensors that existed before the probe (the model, the optimizer state, data
already on the device) are part of the total, as they are on a real card.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from jupyter_gpu.batchprobe.oom import budget_message
from jupyter_gpu.kernel_torch import handler_mode
from jupyter_gpu.probekit.storages import live_storages, live_tensor_bytes


class BudgetError(RuntimeError):
    """The budget cannot be set up (no free-memory figure for this device and no --max-memory)."""


@dataclass(frozen=True)
class Peak:
    bytes: int  # what the search compares with the budget
    allocated_bytes: int | None = None  # CUDA: allocated peak (the reserved peak is `bytes`)
    # Live bytes right after each allocation the trial made, in order (None: the budget cannot see allocations).
    # Two trials of the same step make the same allocations, so the curves line up event by event.
    curve: tuple[int, ...] | None = None


class Budget(Protocol):
    device: str
    accounting: str
    # Whether every storage a trial makes is tracked while it lives (the dispatch mode sees each one), so that
    # `leftovers()` is complete. The CUDA ledger only sees storages that have a Python tensor when it scans.
    tracks_every_storage: bool
    limit_bytes: int
    source: str

    def trial(self) -> AbstractContextManager[Any]: ...
    def exclude(self, tensors: Iterable[Any]) -> None: ...
    def end_trial(self) -> None: ...
    def refused_at(self) -> int | None: ...
    def leftovers(self) -> dict[int, int]: ...
    def live_after_step(self) -> int: ...
    def peak(self) -> Peak: ...
    def in_use(self) -> int: ...
    def release_cache(self) -> None: ...
    def synchronize(self) -> None: ...
    def close(self) -> None: ...


# A storage's origin: it existed before the first trial (or was put back by a restore), or trial n made it.
BEFORE_TRIALS = -1


class StorageCounter:
    """Counts the storages live tensors hold on one device type; raises torch's OutOfMemoryError past a limit.

    Storages are counted when an operator creates them (inside `trial()`) or when `track` is given one that
    already exists, and drop out through a weak reference to the storage when they are freed.

    A storage an earlier trial made that is still alive when a trial starts (a forward hook or a global that
    keeps the last output) is *inherited*: it is left out of what the trial is charged, because training at
    this size would hold its own copy instead, which the trial does count once it makes it.
    """

    def __init__(self, torch: Any, device_type: str, limit_bytes: int | None = None, baseline: int = 0) -> None:
        self._torch = torch
        self.device = device_type
        self.limit_bytes = limit_bytes
        self.baseline = baseline
        self.devices_seen: set[str] = set()
        self.live = baseline
        self.inherited = 0  # bytes of storages earlier trials made that are still alive
        self.peak_bytes = baseline
        self._trial_number = 0
        # id(storage) -> (weak reference, bytes, origin: BEFORE_TRIALS or the trial that made it)
        self._storages: dict[int, tuple[weakref.ref, int, int]] = {}
        self._inherited_keys: set[int] = set()
        self._excluded: dict[int, weakref.ref] = {}
        self._curve: list[int] = []
        self._refused_at = None

    @property
    def charged(self) -> int:
        """What the running trial is charged: live bytes less what it inherited."""
        return self.live - self.inherited

    def trial(self) -> AbstractContextManager[Any]:
        self.start_trial()
        return handler_mode(self._run)

    def start_trial(self) -> None:
        """A new trial: what earlier trials left alive is inherited; the peaks and the curve start again."""
        self._trial_number += 1
        self._inherited_keys = {key for key, (_, _, origin) in self._storages.items()
                                if origin != BEFORE_TRIALS and origin < self._trial_number}
        self.inherited = sum(self._storages[key][1] for key in self._inherited_keys)
        self.peak_bytes = self.charged
        self._curve = []
        self._refused_at: int | None = None

    def refused_at(self) -> int | None:
        """What the trial would have held had the budget let its last allocation through (None: not refused)."""
        return self._refused_at

    def scan(self, origin: int | None = None) -> None:
        """Track every live storage on the device not tracked yet, as made by `origin` (default: before trials).

        Storages made outside any operator the dispatch mode saw (a restore making a gradient again from its
        host copy, or any CUDA work when only the allocator counts) get their origin this way.
        """
        origin = BEFORE_TRIALS if origin is None else origin
        for storage in live_storages(self._torch, self.device):
            if id(storage) not in self._excluded or self._excluded[id(storage)]() is not storage:
                self._add(storage, origin)

    def exclude(self, tensors: Iterable[Any]) -> None:
        """Never count these tensors' storages: the probe's own host copies of the training state."""
        for tensor in tensors:
            storage = tensor.untyped_storage()
            self._excluded[id(storage)] = weakref.ref(storage)

    @property
    def trial_number(self) -> int:
        return self._trial_number

    def leftovers(self) -> dict[int, int]:
        """data_ptr -> bytes of the live storages that trials made (asked between trials, after the restore)."""
        found = {}
        for ref, size, origin in list(self._storages.values()):
            storage = ref()
            if origin != BEFORE_TRIALS and storage is not None:
                found[storage.data_ptr()] = size
        return found

    def _run(self, func: Any, args: tuple, kwargs: dict) -> Any:
        out = func(*args, **kwargs)
        self.record(func, out)
        return out

    def live_after_step(self) -> int:
        """What a call of the step left live, as charged: compared call to call, growth is a leak."""
        return self.charged

    def peak(self) -> Peak:
        return Peak(self.peak_bytes, curve=tuple(self._curve))

    def close(self) -> None:
        self._storages.clear()  # the weak-reference callbacks must not outlive the probe

    def track(self, tensor: Any) -> None:
        """Count a storage that exists before the trial (a swapped-in parameter, gradient or state)."""
        self._add(tensor.untyped_storage(), BEFORE_TRIALS)

    def leftover_storages(self) -> dict[int, int]:
        """data_ptr -> bytes of the live storages a trial made (called between trials, after the restore)."""
        found = {}
        for ref, size, origin in self._storages.values():
            storage = ref()
            if origin != BEFORE_TRIALS and storage is not None:
                found[storage.data_ptr()] = size
        return found

    # Called by the dispatch mode for every operator's outputs.
    def record(self, func: Any, out: Any) -> None:
        returns = func._schema.returns
        for position, tensor in enumerate(out if isinstance(out, (tuple, list)) else (out,)):
            if not isinstance(tensor, self._torch.Tensor):
                continue
            device_type = tensor.device.type
            self.devices_seen.add(device_type)
            if device_type != self.device:
                continue
            # An output with alias information is a view or the in-place input: no new memory.
            if position < len(returns) and returns[position].alias_info is not None:
                continue
            try:
                storage = tensor.untyped_storage()
            except (RuntimeError, NotImplementedError, TypeError):
                continue  # sparse and some subclass tensors have no plain storage to measure
            size = self._add(storage, self._trial_number)
            if size:
                charged = self.charged
                self._curve.append(charged)
                if self.limit_bytes is not None and charged > self.limit_bytes:
                    self._refused_at = charged
                    raise self._torch.OutOfMemoryError(
                        budget_message(self.device.upper(), size, charged - size, self.limit_bytes))

    def _add(self, storage: Any, origin: int) -> int:
        """Count a storage once (tied parameters, views of one buffer); returns the bytes added."""
        key = id(storage)
        if key in self._storages and self._storages[key][0]() is storage:
            return 0
        size = storage.nbytes()
        self._storages[key] = (weakref.ref(storage, self._freed(key, size)), size, origin)
        self.live += size
        charged = self.charged
        self.peak_bytes = max(self.peak_bytes, charged)
        return size

    def _freed(self, key: int, size: int) -> Any:
        def freed(_: Any) -> None:
            self.live -= size
            if key in self._inherited_keys:
                self._inherited_keys.discard(key)
                self.inherited -= size
            self._storages.pop(key, None)
        return freed
class TensorBudget(StorageCounter):
    """The memory budget on the CPU (or any device without allocator statistics), counted from live tensors.

    The baseline is every tensor already alive on the device: the budget is absolute, as on a real card. Each
    trial starts by counting every live storage one by one, so one that dies during the trial (a gradient left
    by an earlier step, freed by the step's own `zero_grad()`) gives its bytes back.
    """

    accounting = "live tensor bytes"
    tracks_every_storage = True

    def __init__(self, torch: Any, device_type: str = "cpu", limit_bytes: int | None = None) -> None:
        baseline = live_tensor_bytes(torch, device_type)
        if limit_bytes is None:
            free = _free_memory(torch, device_type)
            if free is None:
                raise BudgetError(f"jupyter-gpu cannot read how much {device_type.upper()} memory is free; "
                                  "give the budget with --max-memory, e.g. --max-memory 6GiB.")
            limit_bytes = baseline + free
            self.source = f"free {device_type.upper()} memory"
        else:
            self.source = "--max-memory"
        super().__init__(torch, device_type, limit_bytes, 0)
        self.baseline = baseline
        self.limit_bytes: int = limit_bytes
        self.scan()

    def trial(self) -> AbstractContextManager[Any]:
        self.scan()
        return super().trial()

    def end_trial(self) -> None:
        return None  # the dispatch mode saw every storage the trial made

    def in_use(self) -> int:
        return live_tensor_bytes(self._torch, self.device)

    def release_cache(self) -> None:
        return None  # no allocator cache: freed storages are gone already

    def synchronize(self) -> None:
        sync = getattr(getattr(self._torch, self.device, None), "synchronize", None)
        if self.device != "cpu" and callable(sync):
            sync()


class AllocatorBudget:
    """CUDA: the caching allocator's own statistics, and its per-process cap for --max-memory."""

    accounting = "CUDA caching allocator"
    tracks_every_storage = False

    def __init__(self, torch: Any, limit_bytes: int | None = None, index: int | None = None) -> None:
        self._cuda = torch.cuda
        index = self._cuda.current_device() if index is None else index
        self.device = f"cuda:{index}"
        self._index = index
        self._cuda.empty_cache()
        total = self._cuda.get_device_properties(index).total_memory
        self._previous_fraction: float | None = None
        if limit_bytes is None:
            free, _ = self._cuda.mem_get_info(index)
            self.limit_bytes = free + self._cuda.memory_reserved(index)
            self.source = f"free memory on {self.device}"
        else:
            self.limit_bytes = limit_bytes
            self.source = "--max-memory"
            self._previous_fraction = self._cuda.get_per_process_memory_fraction(index)
            self._cuda.set_per_process_memory_fraction(min(1.0, limit_bytes / total), index)
        # Only to tell which CUDA storages trials left alive: the allocator, not this count, is the budget.
        self._ledger = StorageCounter(torch, "cuda")

    def trial(self) -> AbstractContextManager[Any]:
        from contextlib import nullcontext

        self._ledger.scan()
        self._ledger.start_trial()
        # reset_peak_memory_stats sets the reserved peak to what is reserved now: without emptying the cache first,
        # the cache an earlier, bigger trial left would read as this trial's peak.
        self._cuda.empty_cache()
        self._cuda.reset_peak_memory_stats(self._index)
        return nullcontext()

    def end_trial(self) -> None:
        # Before the restore: what is live now and new was made by this trial (or is its optimizer state).
        self._ledger.scan(self._ledger.trial_number)

    def live_after_step(self) -> int:
        return self._cuda.memory_allocated(self._index)

    def peak(self) -> Peak:
        return Peak(self._cuda.max_memory_reserved(self._index), self._cuda.max_memory_allocated(self._index))

    def leftovers(self) -> dict[int, int]:
        return self._ledger.leftovers()

    def refused_at(self) -> int | None:
        return None  # the allocator's error says what it tried to allocate, not what the step held then

    def exclude(self, tensors: Iterable[Any]) -> None:
        self._ledger.exclude(tensors)

    def in_use(self) -> int:
        return self._cuda.memory_allocated(self._index)

    def release_cache(self) -> None:
        self._cuda.empty_cache()

    def synchronize(self) -> None:
        self._cuda.synchronize(self._index)

    def close(self) -> None:
        self._ledger.close()
        if self._previous_fraction is not None:
            self._cuda.set_per_process_memory_fraction(self._previous_fraction, self._index)
            self._previous_fraction = None


def _free_memory(torch: Any, device_type: str) -> int | None:
    if device_type == "cpu":
        return _available_host_memory()
    if device_type == "mps" and hasattr(torch, "mps"):
        recommended = getattr(torch.mps, "recommended_max_memory", None)
        allocated = getattr(torch.mps, "driver_allocated_memory", None)
        if callable(recommended) and callable(allocated):
            return max(recommended() - allocated(), 0)
    if device_type == "xpu" and hasattr(torch, "xpu"):
        return torch.xpu.mem_get_info()[0]
    return None


def _available_host_memory() -> int | None:
    """MemAvailable from /proc/meminfo (Linux); None elsewhere, where the user gives --max-memory."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
