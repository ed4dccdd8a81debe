"""`%gpumem` end to end: walk the notebook, read the allocator, reconcile, and return a `MemoryMap`.

Probe ring. Never imports torch (a kernel without torch has no tensors) and never initialises CUDA.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from jupyter_gpu.gpumem.allocator import device_totals
from jupyter_gpu.gpumem.collector import collector_paused
from jupyter_gpu.gpumem.reconcile import remainders
from jupyter_gpu.gpumem.result import DeviceTotals, MemoryMap, Release
from jupyter_gpu.gpumem.roots import notebook_roots
from jupyter_gpu.gpumem.walk import Limits, NotebookWalk
from jupyter_gpu.kernel_torch import cuda_initialized, loaded_torch
from jupyter_gpu.rendering.units import format_bytes
from jupyter_gpu.running_shell import running_shell

NO_TORCH = "torch is not imported in this kernel: no tensors to explain"
NO_CUDA = ("CUDA is not initialised in this kernel, so there is no GPU memory to explain (and %gpumem does not "
           "start CUDA); these are the CPU tensors")

CUDA_EMPTY = ("CUDA is initialised in this kernel, but PyTorch holds no GPU memory (its context, outside PyTorch's "
              "allocator, is nvidia-smi's to show); these are the CPU tensors")


class GpuMemError(ValueError):
    """A request %gpumem cannot answer (an unknown device); its message is one sentence for the user."""


def walk_notebook(torch: Any, namespace: Mapping[str, Any], shell: Any | None,
                  limits: Limits | None = None) -> NotebookWalk:
    """One walk from every root of the notebook; the roots (strong references) are dropped on return."""
    with collector_paused():
        roots = notebook_roots(namespace, shell)
        try:
            return NotebookWalk(torch, limits).walk(roots)
        finally:
            roots.clear()


def map_memory(namespace: Mapping[str, Any], shell: Any | None = None, *, device: str | None = None,
               top: int = 20, limits: Limits | None = None) -> MemoryMap:
    """Every tensor storage reachable from the notebook, named, with each device's reconciliation.

    `device`: "cuda", "cuda:1", "cpu" or "all"; by default the CUDA devices when this kernel uses CUDA, else the CPU.
    """
    started = time.perf_counter()
    torch = loaded_torch()
    if torch is None:
        return MemoryMap(entries=(), devices=(), notes=(NO_TORCH,), top=top, seconds=time.perf_counter() - started)
    walk = walk_notebook(torch, namespace, shell, limits)
    with collector_paused():
        totals = device_totals(torch, walk)
    chosen, notes = _chosen_devices(torch, totals, device)
    entries = tuple(entry for entry in walk.entries() if entry.device in chosen)
    shown = tuple(t for t in totals if t.device in chosen)
    found = tuple(remainder for t in shown for remainder in remainders(t))
    return MemoryMap(entries=entries, devices=shown, remainders=found, releases=cache_releases(walk, chosen),
                     notes=tuple(notes + walk.notes), top=top, objects_visited=walk.visits,
                     seconds=time.perf_counter() - started)


def cache_releases(walk: NotebookWalk, devices: set[str]) -> tuple[Release, ...]:
    """`f.cache_clear()` for each lru_cache'd function whose cache holds storages on `devices`, largest first.

    Only for a function the user can name (`featstore.embed`, not one reached through a closure or a traceback)."""
    holders = [(f"{path}.cache_clear()", (f"{path}.cache[",), f"the lru_cache of {path}", "the function stays", path)
               for path in walk.lru_caches]
    # An exception's traceback (`failures[3].with_traceback(None)`), a suspended generator (`batches.close()`).
    holders += [(line, prefixes, holder, keeps, line.rsplit(".", 1)[0]) for line, prefixes, holder, keeps
                in walk.releasable]
    found: list[Release] = []
    for line, prefixes, holder, keeps, target in holders:
        if " " in target or "<" in target:
            continue
        size = sum(record.bytes for record in walk.storages.values() if record.device in devices and any(
            name.startswith(prefixes) for name in (*record.names, *(named for named, _ in record.path_of.values()))))
        if size:
            found.append(Release(line, holder, size, keeps, target=target))
    return tuple(sorted(found, key=lambda release: -release.bytes))


def _chosen_devices(torch: Any, totals: list[DeviceTotals], device: str | None) -> tuple[set[str], list[str]]:
    present = [t.device for t in totals]
    notes: list[str] = []
    if device in (None, ""):
        cuda = [name for name in present if name.startswith("cuda")]
        if cuda:
            cpu = next((t for t in totals if t.device == "cpu"), None)
            if cpu is not None:
                notes.append(f"the CPU holds {format_bytes(cpu.total_bytes)} in tensors too: %gpumem --device cpu "
                             "lists them")
            return set(cuda), notes
        notes.append(NO_CUDA if not cuda_initialized(torch) else CUDA_EMPTY)
        return {"cpu"}, notes
    if device == "all":
        return set(present), notes
    if device == "cuda" or device.startswith("cuda:"):
        if not cuda_initialized(torch):
            raise GpuMemError("CUDA is not initialised in this kernel, so no tensor lives on a GPU; "
                              "%gpumem --device cpu lists the CPU tensors")
        if device == "cuda":
            return {name for name in present if name.startswith("cuda")}, notes
    if device == "cpu" or (device.startswith("cuda:") and device[5:].isdigit()):
        if device.startswith("cuda") and device not in present:
            raise GpuMemError(f"this kernel holds no memory on {device}; it has memory on "
                              f"{', '.join(present) or 'no device'}")
        return {device}, notes
    raise GpuMemError(f"unknown device {device!r}: use cpu, cuda, cuda:N or all")


def memory_map(namespace: Mapping[str, Any] | None = None, *, device: str | None = None,
               top: int = 20) -> MemoryMap:
    """`%gpumem` from code: the memory map of `namespace` (a script's `globals()`), or of the running notebook.

    In a notebook the output cache and the last error's frames are walked too.
    """
    shell = running_shell()
    if namespace is None:
        if shell is None:
            raise GpuMemError("memory_map() needs a namespace outside IPython, e.g. memory_map(globals())")
        namespace = shell.user_ns
    elif shell is not None and namespace is not shell.user_ns:
        shell = None  # another namespace: the notebook's caches are not its holders
    return map_memory(namespace, shell, device=device, top=top)
