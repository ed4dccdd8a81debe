"""Give memory back without restarting the kernel: the output cache, the last error's frames, named variables, and
the allocator's cache. Each release measures before and after, names what it could not free and who holds it,
and says what to type next time so the memory is never held.

Probe ring: it changes the notebook's namespaces and IPython's caches, never a variable the user did not name.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, MutableMapping
from typing import Any

from jupyter_gpu.gpumem.allocator import cuda_indices, levels
from jupyter_gpu.gpumem.caches import is_lru_cache
from jupyter_gpu.gpumem.result import KIND_RANK, DeviceLevel, FreeReport, StillHeld
from jupyter_gpu.gpumem.roots import OUTPUT, TRACEBACK, USER, forget_outputs
from jupyter_gpu.gpumem.runner import GpuMemError, walk_notebook
from jupyter_gpu.gpumem.walk import NotebookWalk
from jupyter_gpu.kernel_torch import cuda_initialized, loaded_torch
from jupyter_gpu.probekit.release import release_last_error

KEYWORDS = ("outputs", "traceback", "cache")
CACHED_BLOCKS = ("the freed blocks stay in PyTorch's cache for the next allocation; %gpumem --free cache hands "
                 "them back to the GPU for other processes")
SEMICOLON = "end a line that shows a tensor with ; (IPython then keeps no copy of it in Out, _ or _N)"


def free(what: list[str], namespace: MutableMapping[str, Any], shell: Any | None) -> FreeReport:
    """`--free outputs`, `--free traceback`, `--free cache`, or `--free NAME [NAME ...]`."""
    torch = loaded_torch()
    if torch is None:
        raise GpuMemError("torch is not imported in this kernel: there is no tensor memory to free")
    if what in (["outputs"], ["traceback"], ["cache"]):
        return {"outputs": free_outputs, "traceback": free_traceback, "cache": free_cache}[what[0]](
            torch, namespace, shell)
    keywords = [word for word in what if word in KEYWORDS]
    if keywords:
        raise GpuMemError(f"--free {keywords[0]} goes alone; free variables in a separate call "
                          f"(--free {' '.join(w for w in what if w not in KEYWORDS)})")
    holders = [name for name in what if name not in namespace]
    if holders and len(holders) == len(what):
        return free_holders(torch, holders, namespace, shell)
    if holders:
        variables = " ".join(name for name in what if name not in holders)
        raise GpuMemError(f"--free {holders[0]} empties a holder in place and --free {variables} deletes variables: "
                          "free them in separate calls")
    return free_names(torch, what, namespace, shell)


def free_holders(torch: Any, holders: list[str], namespace: MutableMapping[str, Any], shell: Any | None
                 ) -> FreeReport:
    """`--free Encoder.embed` or `--free failures[3]`: run the line the map offers for a holder it names (the
    cache's `cache_clear()`, the exception's `with_traceback(None)`, the generator's `close()`), which empties it
    in place and keeps the variable. Only a line the map built from a typeable path is run."""
    from jupyter_gpu.gpumem.runner import cache_releases

    before_walk, before = _measure(torch, namespace, shell)
    offered = {release.target: release for release in cache_releases(before_walk, _all_devices(before_walk))}
    missing = [name for name in holders if name not in offered]
    if missing:
        known = ", ".join(sorted(offered)) or "none"
        raise GpuMemError(f"there is no variable {missing[0]!r} in the notebook, and no holder by that name that "
                          f"%gpumem can empty in place (holders it can empty now: {known})")
    lines = [offered[name].line for name in holders]
    prefixes = tuple(prefix for name in holders for prefix in _release_prefixes(before_walk, offered[name].line))
    for line in lines:
        exec(compile(line, "<%gpumem --free>", "exec"), namespace)  # the line a user would type, in their notebook
    gc.collect()
    after_walk = walk_notebook(torch, namespace, shell)
    still: list[StillHeld] = []
    for key, was in sorted(before_walk.storages.items(), key=lambda item: -item[1].bytes):
        emptied = next((name for name in was.names if name.startswith(prefixes)), None)
        record = after_walk.storages.get(key)
        if emptied is not None and record is not None:
            still.append(StillHeld(path=emptied, bytes=was.bytes, held_by=tuple(record.names)))
    notes = [CACHED_BLOCKS] if cuda_initialized(torch) else []
    return FreeReport(target=", ".join(holders), before=tuple(before), after=tuple(levels(torch, after_walk)),
                      released=tuple(lines), still_held=tuple(still), notes=tuple(notes),
                      next_time=tuple(f"{line} empties {offered[name].holder}; {offered[name].keeps}"
                                      for name, line in zip(holders, lines, strict=True)))


def _release_prefixes(walk: NotebookWalk, line: str) -> tuple[str, ...]:
    target = line.rsplit(".", 1)[0]
    if line.endswith(".cache_clear()"):
        return (f"{target}.cache[",)
    return next((prefixes for offered, prefixes, _, _ in walk.releasable if offered == line), ())


def _all_devices(walk: NotebookWalk) -> set[str]:
    return {record.device for record in walk.storages.values()}



def free_outputs(torch: Any, namespace: MutableMapping[str, Any], shell: Any | None) -> FreeReport:
    before_walk, before = _measure(torch, namespace, shell)
    released = forget_outputs(namespace, shell)
    return _finish(torch, "outputs", namespace, shell, before_walk, before, released, _is_output, next_time=[
        SEMICOLON, "%xdel NAME instead of del NAME deletes a variable and IPython's copies of it"])


def free_traceback(torch: Any, namespace: MutableMapping[str, Any], shell: Any | None) -> FreeReport:
    before_walk, before = _measure(torch, namespace, shell)
    frames = sorted({holder.split(",")[0].removeprefix("last error: ") for record in before_walk.storages.values()
                     for holder, kind in record.holders.items() if kind == TRACEBACK})
    cleared = release_last_error(shell)
    notes = [] if cleared else ["no failed cell keeps frames alive"]
    return _finish(torch, "traceback", namespace, shell, before_walk, before, frames,
                   lambda holder, kind: kind == TRACEBACK, notes=notes, next_time=[
        "run %gpumem --free traceback right after an out-of-memory error; the traceback stays printable, but "
        "%debug then shows no local variables"])


def free_cache(torch: Any, namespace: MutableMapping[str, Any], shell: Any | None) -> FreeReport:
    walk, before = _measure(torch, namespace, shell)
    if not cuda_initialized(torch):
        return FreeReport(target="cache", before=tuple(before), after=tuple(before), notes=(
            "CUDA is not initialised in this kernel: there is no GPU allocator cache to return, and the CPU "
            "allocator keeps none",))
    indices = cuda_indices(torch)  # after emptying, a device may hold nothing: it is still shown, at 0
    gc.collect()
    torch.cuda.empty_cache()
    return FreeReport(target="cache", before=tuple(before), after=tuple(levels(torch, walk, indices)),
                      released=("torch.cuda.empty_cache()",), notes=(
                          "PyTorch reserves memory again on its next allocation: this helps another process, or "
                          "a notebook that will not need that much again",))


def free_names(torch: Any, names: list[str], namespace: MutableMapping[str, Any], shell: Any | None) -> FreeReport:
    missing = [name for name in names if name not in namespace]
    if missing:
        raise GpuMemError(f"there is no variable {missing[0]!r} in the notebook")
    before_walk, before = _measure(torch, namespace, shell)
    def named(holder: str, kind: str) -> bool:
        return kind == USER and holder in names

    targets = _holding(before_walk, named)
    cached = {holder for key in targets for holder, kind in before_walk.storages[key].holders.items()
              if _is_output(holder, kind)}
    released = list(names)
    cached_functions = [name for name in names if is_lru_cache(type(namespace[name]))]
    for name in names:
        del namespace[name]
    released += forget_outputs(namespace, shell, only=cached)
    shown = ", ".join(names)
    next_time = [f"%xdel {shown}" if cached else f"del {shown}"]
    if cached:
        next_time.append(SEMICOLON)
    next_time += [f"{name}.cache_clear() empties its lru_cache and keeps the function" for name in cached_functions]
    return _finish(torch, shown, namespace, shell, before_walk, before, released,
                   lambda holder, kind: named(holder, kind) or holder in cached, next_time=next_time)


def _finish(torch: Any, target: str, namespace: MutableMapping[str, Any], shell: Any | None,
            before_walk: NotebookWalk, before: list[DeviceLevel], released: list[str],
            freed: Callable[[str, str], bool], *, next_time: list[str], notes: list[str] | None = None) -> FreeReport:
    """Measure after the release, and name what the release should have freed but something else still holds.

    `freed(holder, kind)` tells the holders (roots) the release dropped. A storage they held that is still alive is
    reported when the name the release dropped was as specific as what keeps it (`y` kept by `alias`, a model's
    parameters kept by the optimizer); one whose owner is more specific (the weights a kept loss's graph saved,
    still the model's) is not a surprise, and not reported.
    """
    gc.collect()  # tensors inside reference cycles (a graph, a module that kept its output) need the collector
    after_walk = walk_notebook(torch, namespace, shell)
    still: list[StillHeld] = []
    targets = _holding(before_walk, freed)
    for key in sorted(targets, key=lambda k: -before_walk.storages[k].bytes):
        record = after_walk.storages.get(key)
        if record is None:
            continue
        was = before_walk.storages[key]
        asked, asked_kind = next(was.path_of[h] for h, kind in was.holders.items() if freed(h, kind))
        if KIND_RANK[asked_kind] <= KIND_RANK[record.kind]:
            still.append(StillHeld(path=asked, bytes=was.bytes, held_by=tuple(record.names)))
    notes = list(notes or [])
    if cuda_initialized(torch) and targets:
        notes.append(CACHED_BLOCKS)
    return FreeReport(target=target, before=tuple(before), after=tuple(levels(torch, after_walk)),
                      released=tuple(released), still_held=tuple(still), next_time=tuple(next_time),
                      notes=tuple(notes))


def _measure(torch: Any, namespace: MutableMapping[str, Any], shell: Any | None
             ) -> tuple[NotebookWalk, list[DeviceLevel]]:
    """The walk and the levels before a release."""
    walk = walk_notebook(torch, namespace, shell)
    return walk, levels(torch, walk)


def _holding(walk: NotebookWalk, holder_matches: Callable[[str, str], bool]) -> set[tuple[str, int]]:
    """The storages that some holder (root path, root kind) passing the test keeps alive."""
    return {key for key, record in walk.storages.items()
            if any(holder_matches(holder, kind) for holder, kind in record.holders.items())}


def _is_output(holder: str, kind: str) -> bool:
    return kind == OUTPUT
