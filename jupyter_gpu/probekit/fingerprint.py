"""Check a probe's "restored ... exactly as before" instead of asserting it.

Before a probe runs, everything it claims to put back (its training objects, the global generators, the sampler,
the step's notebook variables) and everything the discovery walk (`probekit.reach`) found is fingerprinted: cheap
checksums, not copies. After the probe's last restore the same objects are fingerprinted again and compared. The
report's "restored" line then lists only what compared equal; anything that moved is named with what moved
(`full_ds.rng (NumPy Generator): advanced, not restored`), whoever was meant to put it back.

What a fingerprint covers, by kind:
- module: every parameter's and buffer's bytes, the gradients' bytes, which tensor objects sit in the parameter
  slots (the optimizer holds them by identity), and each submodule's train/eval flag;
- optimizer: the per-parameter state (tensors by bytes, step counters by value) and every param group's
  hyper-parameters; scheduler and AMP scaler: their `state_dict()` values;
- generator: its state (torch.Generator.get_state(), NumPy's bit_generator.state or get_state(), random.getstate());
  the process-wide generators of torch (CPU, and CUDA where the kernel initialised it), `random` and NumPy;
- variable: its binding and value; a container by its length and its first `MAX_ITEMS` items, three levels down;
  an object of the user's own class by its instance attributes; anything else (an iterator, a library's object) by
  identity only, since reading more would run its code.

Tensors are hashed where they live: a CPU tensor's buffer with zlib's CRC-32 (2.2 GB/s on this project's CI core,
against 0.5 for BLAKE2b and 0.07 for a position-weighted sum in torch; torch.hash_tensor is as fast but XORs the
elements, so a swap of two weights would go unseen); a GPU tensor by a position-weighted sum of its 32-bit words
computed on the device, in chunks, and read back once per fingerprint, never copied to the host. Nothing here
calls a property, `__getattr__` or any other code of the user's: instance attributes are read with `vars()`.
"""

from __future__ import annotations

import collections
import inspect
import math
import random
import sys
import zlib
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpu.kernel_torch import loaded_torch
from jupyter_gpu.probekit.user_objects import written_by_the_user

MAX_ITEMS = 1000          # items of one container fingerprinted; its length always is
MAX_DEPTH = 3             # containers and the user's objects inside a variable, as step_variables keeps them
MAX_SCALAR_TEXT = 256     # a string longer than this is kept as its length and checksum
CHUNK_ELEMENTS = 1 << 22  # 32-bit words a device reduction handles at once: 32 MiB of int64 temporaries
# Odd 64-bit multiplier of the position weights (Knuth's golden-ratio constant, as a signed int64).
_WEIGHT = 0x9E3779B97F4A7C15 - (1 << 64)
_ABSENT = object()


class GlobalGenerators:
    """The process-wide generators: torch's CPU and (when the kernel initialised CUDA) CUDA ones, `random`'s and
    NumPy's legacy global RandomState. One instance, `GLOBAL_RNG`, stands for them in a claim."""

    def __repr__(self) -> str:
        return "GLOBAL_RNG"


GLOBAL_RNG = GlobalGenerators()


@dataclass(frozen=True)
class Custom:
    """A claim a probe checks with its own reader (%speedprobe's global flags): `read()` returns a comparable
    value, taken before and after."""

    what: str
    read: Callable[[], Hashable]


@dataclass(frozen=True)
class Change:
    """One thing that is not as it was before the probe."""

    path: str   # how the user names it: "full_ds.rng", "train_step_fn → optimizer"
    what: str   # its kind, as a user knows it: "NumPy Generator", "Adam", "list"
    how: str    # "advanced", "state changed", "last_epoch 0 → 6"

    def line(self) -> str:
        """The report's warning for a probe that meant to leave everything as it was."""
        return f"{self.path} ({self.what}): {self.how}, not restored"

    def kept_line(self) -> str:
        """The same change where the user asked to keep what the run did (`--keep`)."""
        return f"{self.path} ({self.what}): {self.how}"


@dataclass
class Verdict:
    """What a probe may say it restored (verified equal), and what moved."""

    restored: list[str]
    changes: list[Change]

    @property
    def not_restored(self) -> list[str]:
        return [change.line() for change in self.changes]


@dataclass
class _Entry:
    path: str
    kind: str
    value: Any
    claimed: bool
    binding: tuple[Mapping[str, Any], str] | None = None
    before: dict[str, Any] = field(default_factory=dict)
    what: str = ""  # its kind in the user's words, read when fingerprinted first


class Fingerprint:
    """Checksums of a probe's claims and of what the discovery walk reached, taken when it is made."""

    def __init__(self, entries: list[_Entry]) -> None:
        self._entries = entries

    @classmethod
    def take(cls, claims: Sequence[tuple[str, Any]], reached: Iterable[Any] = (),
             namespace: Mapping[str, Any] | None = None) -> Fingerprint:
        """`claims`: (name, value) the probe's report names, in its order: a training object, `GLOBAL_RNG`, a
        `Custom` reader, a `sampler_of(loader)`, or a notebook variable's value. `reached`: `probekit.reach.Reached`
        items (path, value, kind). `namespace`: where a variable's binding lives (its rebinding is a change)."""
        namespace = namespace or {}
        entries: list[_Entry] = []
        seen: dict[int, _Entry] = {}
        for name, value in claims:
            entry = _Entry(name, _kind(value, "variable"), value, True, _binding(namespace, name, value))
            entries.append(entry)
            if not isinstance(value, GlobalGenerators | Custom | _Sampler):
                seen.setdefault(id(value), entry)
        for item in reached:
            path, value, kind = item.path, item.value, item.kind
            if kind != "variable" and id(value) in seen:
                continue  # a training object the probe claims: checked once, under the report's name for it
            entry = _Entry(path, kind, value, False, _binding(namespace, path, value) if kind == "variable" else None)
            if kind != "variable":
                seen[id(value)] = entry
            entries.append(entry)
        digests = _Digests()
        for entry in entries:
            entry.before = _digest(entry, digests)
            entry.what = _what(entry)
            if entry.binding is not None:
                # Read through its binding from now on: holding the value would keep a batch the step rebinds
                # alive, and %batchprobe would count it as memory the probe left behind.
                entry.value = None
        digests.resolve()
        return cls(entries)

    def verify(self, claimed: Sequence[str] | None = None) -> Verdict:
        """Fingerprint the same objects again and compare. `claimed`: the names the report would list as restored
        (default: the claims given to `take`); a name not fingerprinted before cannot be verified and is left out.
        A name such as "trainer.global_step" is checked by its variable, `trainer`."""
        digests = _Digests()
        after = [(entry, _digest(entry, digests)) for entry in self._entries]
        digests.resolve()
        moved: dict[str, Change] = {}
        for entry, now in after:
            how = _difference(entry, entry.before, now)
            if how is not None and entry.path not in moved:
                moved[entry.path] = Change(entry.path, entry.what, how)
        names = [entry.path for entry in self._entries if entry.claimed] if claimed is None else list(claimed)
        known = {entry.path for entry in self._entries}
        restored = [name for name in names if _root(name, known) is not None and _root(name, known) not in moved]
        return Verdict(restored, list(moved.values()))

    def reached_generators(self) -> list[str]:
        """The paths of the generators the walk reached (not claimed by name), in the order found."""
        return [entry.path for entry in self._entries if entry.kind == "generator" and not entry.claimed]


def object_claims(objects: Any) -> list[tuple[str, Any]]:
    """(the report's name, the object) of a `TrainingObjects`' modules, optimizers, schedulers and scalers."""
    return list(zip(objects.names(), objects.objects(), strict=True))


def reach_of(step: Any = None, loader: Any = None, namespace: Mapping[str, Any] | None = None) -> list[Any]:
    """What the discovery walk finds from the step and from the loader: the one rule for what to check."""
    from jupyter_gpu.probekit.reach import reach_from_loader, reach_from_step

    found: list[Any] = []
    if step is not None:
        found += reach_from_step(step, namespace or {})
    if loader is not None:
        found += reach_from_loader(loader, namespace or {})
    return found


def sampler_of(loader: Any) -> _Sampler:
    """The "sampler" claim of a DataLoader: the generators of the loader, its sampler and batch sampler, and the
    samplers' own plain attributes (an epoch counter), read from their `__dict__`s."""
    return _Sampler(loader)


@dataclass(frozen=True)
class _Sampler:
    loader: Any


def _root(name: str, known: set[str]) -> str | None:
    """The fingerprinted path a claimed name is checked by: itself, or the variable it is an attribute or item of."""
    if name in known:
        return name
    for cut in range(len(name) - 1, 0, -1):
        if name[cut] in ".[" and name[:cut] in known:
            return name[:cut]
    return None


def _binding(namespace: Mapping[str, Any], name: str, value: Any) -> tuple[Mapping[str, Any], str] | None:
    return (namespace, name) if namespace.get(name, _ABSENT) is value else None


def _kind(value: Any, default: str) -> str:
    if isinstance(value, GlobalGenerators):
        return "global generators"
    if isinstance(value, Custom):
        return "custom"
    if isinstance(value, _Sampler):
        return "sampler"
    torch = loaded_torch()
    if torch is not None:
        lr_scheduler = torch.optim.lr_scheduler
        for kind, classes in (("module", (torch.nn.Module,)), ("optimizer", (torch.optim.Optimizer,)),
                              ("scheduler", (lr_scheduler.LRScheduler, lr_scheduler.ReduceLROnPlateau)),
                              ("scaler", (torch.amp.GradScaler,)), ("generator", (torch.Generator,))):
            if isinstance(value, classes):
                return kind
    if _generator_state(value) is not None:
        return "generator"
    return default


def _what(entry: _Entry) -> str:
    if entry.kind == "global generators":
        return "global random generators"
    if isinstance(entry.value, Custom):
        return entry.value.what
    if entry.kind == "sampler":
        return "sampler and its generators"
    value = entry.value
    numpy = sys.modules.get("numpy")
    torch = loaded_torch()
    if torch is not None and isinstance(value, torch.Generator):
        return "torch Generator"
    if numpy is not None and isinstance(value, numpy.random.Generator):
        return "NumPy Generator"
    if numpy is not None and isinstance(value, numpy.random.RandomState):
        return "NumPy RandomState"
    if isinstance(value, random.Random):
        return "random.Random"
    return type(value).__name__


# -- digests ----------------------------------------------------------------------------------------------------


class _Digests:
    """Collects the device-side reductions of one fingerprint so they are read back together, one transfer per
    device instead of one synchronisation per tensor."""

    def __init__(self) -> None:
        self._pending: list[tuple[list[Any], int, Any]] = []

    def tensor(self, tensor: Any) -> tuple[Any, ...]:
        """A comparable digest of a tensor's shape, dtype, device and bytes."""
        torch = loaded_torch()
        assert torch is not None
        tensor = tensor.detach()
        head = (tuple(tensor.shape), str(tensor.dtype), str(tensor.device))
        if tensor.is_meta or tensor.numel() == 0:
            return head
        if tensor.layout != torch.strided:  # sparse: its parts, coalesced, by the same rule
            tensor = tensor.to_dense()
        if tensor.is_quantized:
            tensor = tensor.int_repr()
        words = _as_words(torch, tensor)
        if words.device.type == "cpu":
            return (*head, zlib.crc32(words.numpy()))
        slot: list[Any] = [None]
        self._pending.append((slot, 0, device_checksum(torch, words)))
        return (*head, slot)

    def resolve(self) -> None:
        """Read every device checksum back (grouped by device) into the digests that hold a slot for it."""
        torch = loaded_torch()
        if not self._pending or torch is None:
            return
        by_device: dict[Any, list[tuple[list[Any], int, Any]]] = collections.defaultdict(list)
        for item in self._pending:
            by_device[item[2].device].append(item)
        for items in by_device.values():
            values = torch.stack([checksum for _, _, checksum in items]).cpu().tolist()
            for (slot, index, _), value in zip(items, values, strict=True):
                slot[index] = value
        self._pending.clear()


def _as_words(torch: Any, tensor: Any) -> Any:
    """The tensor's bytes as a flat contiguous tensor of 32-bit words (or bytes, when its size is not a multiple
    of four), on its own device: a view where the tensor is contiguous, one same-device copy where it is not."""
    flat = tensor.contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    nbytes = flat.numel() * flat.element_size()
    try:
        return flat.view(torch.int32) if nbytes % 4 == 0 else flat.view(torch.uint8)
    except RuntimeError:  # a dtype view() refuses: its bytes through an untyped view
        return flat.view(torch.uint8)


def device_checksum(torch: Any, words: Any) -> Any:
    """A 0-d int64 tensor on `words`' device: the sum of each word times an odd weight from its position,
    wrapping modulo 2**64, chunk by chunk. A changed word, or two swapped, changes it (unless by a 2**-64 chance)."""
    total = torch.zeros((), dtype=torch.int64, device=words.device)
    for start in range(0, words.numel(), CHUNK_ELEMENTS):
        chunk = words[start:start + CHUNK_ELEMENTS].to(torch.int64)
        positions = torch.arange(start, start + chunk.numel(), dtype=torch.int64, device=words.device)
        total += (chunk * (positions * _WEIGHT + 1)).sum()
    return total


def _digest(entry: _Entry, digests: _Digests) -> dict[str, Any]:
    """The entry's components (name -> comparable digest), read now."""
    value = entry.value
    if entry.binding is not None:
        namespace, name = entry.binding
        value = namespace.get(name, _ABSENT)
        if value is _ABSENT:
            return {"binding": "deleted"}
    kind = entry.kind
    try:
        if kind == "global generators":
            return _global_generators(digests)
        if kind == "custom":
            return {"value": value.read()}
        if kind == "sampler":
            return _sampler(value.loader, digests)
        if kind == "module":
            return _module(value, digests)
        if kind == "optimizer":
            return _optimizer(value, digests)
        if kind == "scheduler":
            return {"state": _state_dict(value.state_dict(), digests)}
        if kind == "scaler":
            return {"state": _state_dict(value.state_dict(), digests) if value.is_enabled() else "disabled"}
        if kind == "generator":
            return {"state": _value(_generator_state(value), digests, 0)}
        return {"value": _value(value, digests, 0), "identity": id(value)}
    except Exception as exc:  # an object that cannot be read is reported as unreadable, never raised into the probe
        return {"unreadable": type(exc).__name__}


def _module(module: Any, digests: _Digests) -> dict[str, Any]:
    params = list(module.named_parameters())
    return {
        "parameters replaced": tuple((name, id(param)) for name, param in params),
        "weights": tuple(digests.tensor(param) for _, param in params),
        "gradients": tuple(None if param.grad is None else digests.tensor(param.grad) for _, param in params),
        "buffers": tuple((name, digests.tensor(buffer)) for name, buffer in module.named_buffers()),
        "train/eval mode": tuple(sub.training for sub in module.modules()),
    }


def _optimizer(optimizer: Any, digests: _Digests) -> dict[str, Any]:
    groups = optimizer.param_groups
    return {
        "hyper-parameters": tuple(_state_dict({key: value for key, value in group.items() if key != "params"},
                                              digests) for group in groups),
        "parameters replaced": tuple(tuple(id(param) for param in group["params"]) for group in groups),
        "state": tuple((id(param), _state_dict(dict(entry), digests)) for param, entry in optimizer.state.items()),
    }


def _state_dict(state: Mapping[str, Any], digests: _Digests) -> tuple[tuple[str, Any], ...]:
    return tuple((str(key), _value(value, digests, 1)) for key, value in state.items())


def _global_generators(digests: _Digests) -> dict[str, Any]:
    torch = loaded_torch()
    found: dict[str, Any] = {"random": hash(random.getstate())}
    if torch is not None:
        found["torch"] = digests.tensor(torch.get_rng_state())
        if torch.cuda.is_initialized():  # reading it otherwise would initialise CUDA in the user's kernel
            found["CUDA"] = tuple(digests.tensor(state) for state in torch.cuda.get_rng_state_all())
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        found["NumPy"] = _value(numpy_random.get_state(), digests, 0)
    return found


def _sampler(loader: Any, digests: _Digests) -> dict[str, Any]:
    attributes = vars(loader)
    owners = [attributes.get("sampler"), attributes.get("batch_sampler")]
    owners.append(vars(owners[1]).get("sampler") if hasattr(owners[1], "__dict__") else None)
    found: dict[str, Any] = {"loader generator": _value(_generator_state(attributes.get("generator")), digests, 0)}
    for index, owner in enumerate(owners):
        if owner is None or not isinstance(getattr(owner, "__dict__", None), dict):
            continue
        state = []
        for name, item in vars(owner).items():
            generator = _generator_state(item)
            if generator is not None:
                state.append((name, _value(generator, digests, 0)))
            elif _scalar(item):
                state.append((name, _value(item, digests, 0)))
        found[f"sampler {index}"] = tuple(state)
    return found


def _generator_state(value: Any) -> Any:
    """A generator's state, or None for anything that is not one (or has no state: SystemRandom)."""
    torch = loaded_torch()
    if torch is not None and isinstance(value, torch.Generator):
        return value.get_state()
    if isinstance(value, random.Random):
        return None if isinstance(value, random.SystemRandom) else value.getstate()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        if isinstance(value, numpy.random.Generator):
            return value.bit_generator.state
        if isinstance(value, numpy.random.RandomState):
            return value.get_state()
    return None


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | complex | str | bytes)


def _value(value: Any, digests: _Digests, depth: int) -> Any:
    """A comparable digest of a value, bounded: see the module docstring."""
    if _scalar(value):
        if isinstance(value, str | bytes) and len(value) > MAX_SCALAR_TEXT:
            data = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
            return (type(value).__name__, len(value), zlib.crc32(data))
        if isinstance(value, float) and math.isnan(value):
            return ("nan",)  # nan != nan: an unchanged NaN loss must compare equal
        return ("=", value)
    torch = loaded_torch()
    if torch is not None and isinstance(value, torch.Tensor):
        return ("tensor", digests.tensor(value))
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        if value.dtype.hasobject:
            return ("array", value.shape, str(value.dtype), _items(list(value.flat), digests, depth))
        return ("array", value.shape, str(value.dtype), zlib.crc32(numpy.ascontiguousarray(value).view(numpy.uint8)))
    if numpy is not None and isinstance(value, numpy.generic):
        return ("=", value.item()) if value.dtype.kind != "O" else ("object", id(value))
    if isinstance(value, list | tuple | collections.deque):
        return (type(value).__name__, len(value), _items(value, digests, depth))
    if isinstance(value, dict):
        return ("dict", len(value), _items(value, digests, depth))
    if isinstance(value, set | frozenset):
        try:
            return (type(value).__name__, len(value), hash(frozenset(value)))
        except TypeError:
            return (type(value).__name__, len(value))
    # The user's own objects by their attributes (a Trainer's counters); a library's (a wandb run, a Logger) by
    # identity: their state also lives outside Python, and step_variables leaves them as the step leaves them.
    if depth < MAX_DEPTH and not inspect.isroutine(value) and not inspect.isclass(value) \
            and written_by_the_user(value):
        return (type(value).__qualname__, _value(dict(vars(value)), digests, depth + 1))
    return ("object", type(value).__qualname__, id(value))


def _items(items: Sequence[Any] | collections.deque | dict[Any, Any], digests: _Digests, depth: int) -> Any:
    """The first MAX_ITEMS items' digests (a dict's keys and values), or None below MAX_DEPTH."""
    if depth >= MAX_DEPTH:
        return None
    if isinstance(items, dict):
        pairs = [pair for _, pair in zip(range(MAX_ITEMS), items.items(), strict=False)]
        return tuple((_value(key, digests, depth + 1), _value(item, digests, depth + 1)) for key, item in pairs)
    head = [item for _, item in zip(range(MAX_ITEMS), items, strict=False)]
    return tuple(_value(item, digests, depth + 1) for item in head)


# -- differences ------------------------------------------------------------------------------------------------


def _difference(entry: _Entry, before: dict[str, Any], after: dict[str, Any]) -> str | None:
    """How the entry changed, in a few words, or None when every component compares equal."""
    if before == after:
        return None
    if after.get("binding") == "deleted":
        return "deleted"
    if "unreadable" in after or "unreadable" in before:
        return f"could not be read to check ({after.get('unreadable') or before.get('unreadable')})"
    if entry.kind in ("generator", "global generators"):
        if entry.kind == "global generators":
            moved = [name for name in after if before.get(name) != after.get(name)]
            return f"{', '.join(moved)} {'generator' if len(moved) == 1 else 'generators'} advanced"
        return "advanced"
    if entry.kind in ("module", "optimizer", "scheduler", "scaler", "sampler", "custom"):
        parts = [name for name in after if before.get(name) != after.get(name)]
        details = [_scalar_change(before.get(name), after.get(name)) for name in parts]
        detail = next((text for text in details if text is not None), None)
        if detail is not None:
            return detail
        if entry.kind == "optimizer" and parts == ["state"] and len(before["state"]) != len(after["state"]):
            count = len(after["state"])
            if not before["state"]:  # a fresh Adam's moments, made by the probe's steps
                return f"state created for {count} parameter{'s' if count != 1 else ''}"
            return f"state for {count} parameters, {len(before['state'])} before"
        return f"{', '.join(parts)} changed" if entry.kind in ("module", "optimizer") else "state changed"
    old, new = before.get("value"), after.get("value")
    if old == new:
        return "rebound to another object with the same value"
    if isinstance(old, tuple) and isinstance(new, tuple) and old[:1] == ("=",) and new[:1] == ("=",):
        return f"{_short(old[1])} → {_short(new[1])}"
    if (isinstance(old, tuple) and isinstance(new, tuple) and len(old) == 3 and len(new) == 3 and old[0] == new[0]
            and isinstance(old[1], int) and isinstance(new[1], int) and old[1] != new[1]):
        return f"length {old[1]} → {new[1]}"
    return "value changed"


def _scalar_change(before: Any, after: Any) -> str | None:
    """`last_epoch 0 → 6`: the first named scalar that differs in two state digests, or None."""
    if not isinstance(before, tuple) or not isinstance(after, tuple):
        return None
    old = dict(item for item in before if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str))
    new = dict(item for item in after if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str))
    for key, value in new.items():
        previous = old.get(key, _ABSENT)
        if previous != value and isinstance(value, tuple) and value[:1] == ("=",) and isinstance(previous, tuple) \
                and previous[:1] == ("=",):
            return f"{key} {_short(previous[1])} → {_short(value[1])}"
    for one, other in zip(before, after, strict=False):  # param groups: a tuple of state tuples each
        detail = _scalar_change(one, other)
        if detail is not None:
            return detail
    return None


def _short(value: Any) -> str:
    # A float as a user reads it (an lr of 1.0000000000000005e-07 after six StepLR steps reads 1e-07).
    text = f"{value:.4g}" if isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
