"""Walk everything reachable from the notebook and name each tensor storage by the path a user would type.

Probe ring: it reads objects and never calls their code. Attributes are read from `__dict__` and slots, never
through `getattr` on the object (a property or a failing `__getattr__` does not run), containers are read item by
item, functions only through their closure cells and defaults, an `lru_cache`'d function through the references the
garbage collector follows (`gpumem/caches.py`), a NumPy array through numpy's own `base` getter. Each storage is
counted once however many tensors (views) and names reach it; the walk keeps no reference to anything it found once
it returns: the records hold names, sizes and data pointers only.

Every kind of CPython object that can keep a reference is either walked or its bytes are named with the holder's
type (`gpumem/holders.py` reads them): frames, tracebacks and exceptions, generators and coroutines (by
`gi_frame.f_locals`, the path a user types), the user's own classes (a method's `lru_cache` lives there), weak-keyed
dictionaries (by the key's own name), and C iterators such as `itertools.cycle`, whose referents only the garbage
collector lists: what lies under one is named `train_iter (itertools.cycle)`, the holder's typeable name and type.

Bounded: at most `Limits.depth` steps below a root, `Limits.items` items per container and `Limits.visits` objects
in all; every cut is reported in `notes` so a short count is never silent.
"""

from __future__ import annotations

import functools
import itertools
import re
import sys
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpu.gpumem.caches import LRU_CACHE_TYPE, cache_entries
from jupyter_gpu.gpumem.graph import GraphTooLarge, saved_tensors
from jupyter_gpu.gpumem.holders import (
    FRAME_OWNERS,
    HolderReader,
    c_iterator_label,
    exception_children,
    frame_children,
    traceback_children,
    weak_keyed_data,
)
from jupyter_gpu.gpumem.result import KIND_RANK, MAX_NAMES, MemoryEntry
from jupyter_gpu.gpumem.roots import FOREIGN_PACKAGES, Root

PARAMETER, BUFFER, GRADIENT, OPTIMIZER_STATE, GRAPH = (
    "parameter", "buffer", "gradient", "optimizer state", "autograd graph")
# Classes are not opaque: the user's own are walked (their dictionaries hold method caches and class attributes).
_OPAQUE = (str, bytes, bytearray, int, float, complex, bool, type(None), range, memoryview, types.ModuleType,
           types.BuiltinFunctionType, types.BuiltinMethodType, types.CodeType)
# Module attributes the walk reads through named_parameters / named_buffers / named_modules instead.
_MODULE_TABLES = frozenset({"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"})


@dataclass(frozen=True)
class Limits:
    depth: int = 12             # steps below a root: history['val'][3] is two
    items: int = 100_000        # items read per container (a list of 10,000 activations is read whole)
    visits: int = 1_000_000     # objects looked into in one walk


@dataclass
class StorageRecord:
    """What the walk knows about one storage: its size and every name that reaches it. No reference to it."""

    device: str
    dtype: str
    shape: tuple[int, ...]
    bytes: int
    path: str
    kind: str
    names: list[str] = field(default_factory=list)
    more_names: int = 0
    address: int = 0
    has_graph: bool = False  # a tensor on it carries a grad_fn (a kept output): its graph keeps more alive
    holders: dict[str, str] = field(default_factory=dict)  # root path (or alias) it is reached from -> root kind
    # holder -> (the first name it reaches this storage by, that name's kind)
    path_of: dict[str, tuple[str, str]] = field(default_factory=dict)

    def add_name(self, path: str, kind: str) -> None:
        if path in self.names:
            return
        if name_order(path, kind) < name_order(self.path, self.kind):
            self.path, self.kind = path, kind  # the most specific holder names the entry, by its shortest path
            self.names.insert(0, path)
        elif len(self.names) < MAX_NAMES:
            self.names.append(path)
        else:
            self.more_names += 1
        del self.names[MAX_NAMES:]

    def entry(self) -> MemoryEntry:
        return MemoryEntry(path=self.path, kind=self.kind, device=self.device, dtype=self.dtype, shape=self.shape,
                           bytes=self.bytes, names=tuple(self.names), more_names=self.more_names,
                           address=self.address)


def name_order(path: str, kind: str) -> tuple[int, bool, bool, bool, int]:
    """Which of two names of one storage names it: the more specific kind (a parameter over a variable holding
    it), then the model's name for a parameter over the optimizer's slot for it (`model.encoder.linear1.weight`,
    not `opt.param_groups[0]['params'][6]`, however long) or over a list the notebook keeps it in (`decay[3]`, a
    weight-decay parameter group built by hand), then the shorter path (`kept['last']` over the hook's closure
    that also reaches it)."""
    in_a_list = kind in (PARAMETER, BUFFER, GRADIENT) and "[" in path
    # A name with a holder's label (`it (itertools.cycle)`) cannot be typed: any typeable name goes first.
    return KIND_RANK[kind], " (" in path, ".param_groups[" in path, in_a_list, len(path)


@dataclass
class _Origin:
    """The root a path starts from: its other names get the same path with their own prefix."""

    root: Root

    def paths(self, path: str, kind: str) -> Iterable[tuple[str, str, str, str]]:
        """(path, kind, holder, holder kind) for the path and each alias of its root."""
        yield path, kind, self.root.path, self.root.kind
        suffix = path[len(self.root.path):] if path.startswith(self.root.path) else None
        for alias, alias_kind in self.root.aliases:
            if suffix is not None:
                # Through an alias the tensor has the alias's kind, unless the walk found something more specific.
                yield alias + suffix, kind if kind != "user variable" else alias_kind, alias, alias_kind
            else:
                yield path, kind, alias, alias_kind  # "graph of loss" keeps its label; the alias still holds it


class NotebookWalk:
    """One walk over a list of roots; `storages` maps (device, data pointer) to what was found there."""

    def __init__(self, torch: Any, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._tensor = torch.Tensor
        self._module = torch.nn.Module
        self._optimizer = torch.optim.Optimizer
        # NumPy is loaded by the time an array exists; without it there is no array to look into.
        self._ndarray: type | None = getattr(sys.modules.get("numpy"), "ndarray", None)
        self.storages: dict[tuple[str, int], StorageRecord] = {}
        self.visits = 0
        self.notes: list[str] = []
        self.lru_caches: list[str] = []  # paths of the lru_cache'd functions walked: `f.cache_clear()` empties them
        # (line, name prefixes it empties, holder in words, what stays) for holders a line empties in place:
        # `failures[3].with_traceback(None)`, `batches.close()`
        self.releasable: list[tuple[str, tuple[str, ...], str, str]] = []
        self._holders = HolderReader()
        self._visited: dict[int, str] = {}  # id of each object looked into -> the path it was first reached by
        self._late_roots: list[tuple[str, _Origin]] = []  # roots an earlier root's walk had already looked into
        self._param_paths: dict[int, str] = {}
        self._graphs: list[tuple[Any, str, _Origin]] = []
        self._graph_nodes: dict[int, str] = {}
        self._unreadable: dict[str, int] = {}
        self._deep: list[str] = []
        self._long: list[str] = []
        self._without_storage = 0
        self._stopped = False

    def walk(self, roots: list[Root]) -> NotebookWalk:
        for root in roots:
            if self._stopped:
                break
            origin = _Origin(root)
            self._walk_from(root.value, root.path, root.kind, origin)
        self._walk_graphs()
        self._name_late_roots()
        self._summarise_cuts()
        return self

    def entries(self) -> list[MemoryEntry]:
        """Every storage found, largest first."""
        return sorted((record.entry() for record in self.storages.values()),
                      key=lambda entry: (-entry.bytes, _natural(entry.path)))

    # The walk proper -------------------------------------------------------------------------------------------

    def _walk_from(self, value: Any, path: str, kind: str, origin: _Origin) -> None:
        # A sealed item lies under a holder Python gives no name for (a C iterator): it and all below it carry
        # the holder's label as their path.
        pending: list[tuple[Any, str, int, bool]] = [(value, path, 0, False)]
        while pending:
            item, item_path, depth, sealed = pending.pop()
            item_type = type(item)
            if item_type in _OPAQUE_TYPES or issubclass(item_type, _OPAQUE):  # not isinstance: it reads __class__
                continue
            if issubclass(item_type, self._tensor):
                self._tensor_found(item, item_path, kind, origin)
                continue
            if id(item) in self._visited:
                if depth == 0:
                    self._late_roots.append((self._visited[id(item)], origin))
                continue
            if depth >= self.limits.depth:
                self._deep.append(item_path)
                continue
            self.visits += 1
            if self.visits > self.limits.visits:
                self._stopped = True
                self.notes.append(f"the walk stopped after {self.limits.visits:,} objects; what lies beyond them "
                                  "is not named")
                return
            self._visited[id(item)] = item_path
            try:
                children, seals = self._children(item, item_type, item_path, origin)
                owner = self._holders.user_class(item_type)
                if owner is not None and id(owner) not in self._visited:
                    children.append((owner, f"type({item_path})"))  # a method's lru_cache lives on the class
            except Exception as error:  # a broken object must not stop the walk; it is counted and reported
                self._unreadable[f"{type(error).__name__} reading a {item_type.__name__}"] = (
                    self._unreadable.get(f"{type(error).__name__} reading a {item_type.__name__}", 0) + 1)
                continue
            if sealed:
                children = [(child, item_path) for child, _ in children]
            pending.extend((child, child_path, depth + 1, sealed or seals) for child, child_path in reversed(children))

    def _children(self, item: Any, item_type: type, path: str, origin: _Origin) -> tuple[list[tuple[Any, str]], bool]:
        """The item's children with their paths, and whether they are sealed under the item's label."""
        label = c_iterator_label(item_type)
        if label is not None and not issubclass(item_type, self._tensor):
            # No attribute names what it holds: the garbage collector's referents, under the holder's label.
            return [(child, f"{path} ({label})") for child in self._holders.referents(item)], True
        return self._named_children(item, item_type, path, origin), False

    def _named_children(self, item: Any, item_type: type, path: str, origin: _Origin) -> list[tuple[Any, str]]:
        if issubclass(item_type, self._module):
            return self._module_found(item, path, origin)
        if issubclass(item_type, self._optimizer):
            return self._optimizer_found(item, path, origin)
        if issubclass(item_type, dict):
            return [(value, f"{path}[{_key_text(key)}]") for key, value in self._items(item.items(), len(item), path)]
        if issubclass(item_type, tuple) and hasattr(item_type, "_fields"):
            return [(value, f"{path}.{name}") for name, value in zip(item_type._fields, item, strict=False)]
        if issubclass(item_type, list | tuple) or item_type.__name__ == "deque":
            return [(value, f"{path}[{index}]") for index, value in self._items(enumerate(item), len(item), path)]
        if issubclass(item_type, set | frozenset):
            return [(value, f"list({path})[{index}]") for index, value in self._items(enumerate(item), len(item), path)]
        if item_type is types.FunctionType:
            return _function_children(item, path)
        if item_type is types.MethodType:
            return [(item.__self__, f"{path}.__self__")]
        if item_type is functools.partial:
            return [(item.func, f"{path}.func"), *((arg, f"{path}.args[{i}]") for i, arg in enumerate(item.args)),
                    *((value, f"{path}.keywords[{key!r}]") for key, value in item.keywords.items())]
        if item_type in FRAME_OWNERS:
            return self._suspended_found(item, item_type, path)
        if item_type is types.FrameType:
            return frame_children(item, path, self._holders, self._visited)
        if item_type is types.TracebackType:
            return traceback_children(item, path, self.limits.items)
        if issubclass(item_type, BaseException):
            children = exception_children(item, path)
            if any(child_path.endswith(".__traceback__") for _, child_path in children) and _typeable(path):
                self.releasable.append((f"{path}.with_traceback(None)", (f"{path}.__traceback__",),
                                        f"the traceback of {path}", "the exception and its message stay"))
            return children + self._attributes(item, item_type, path)
        if issubclass(item_type, type):
            return self._holders.class_children(item, path) if self._holders.user_class(item) is item else []
        if item_type is types.CellType:
            try:
                return [(item.cell_contents, f"{path}.cell_contents")]
            except ValueError:
                return []  # an empty cell
        if item_type is LRU_CACHE_TYPE:  # None without CPython's C wrapper: the walk reads the Python one's closure
            return self._lru_cache_found(item, item_type, path)
        if self._ndarray is not None and issubclass(item_type, self._ndarray):
            return self._array_found(item, item_type, path, self._ndarray)
        if item_type.__module__.split(".", 1)[0] in FOREIGN_PACKAGES:
            return []
        weak = weak_keyed_data(item)
        if weak is not None:  # a WeakKeyDictionary (or torch's WeakIdKeyDictionary): entries by the key's name
            return [(value, f"{path}[{self._key_name(referent)}]") for referent, value in
                    self._items(weak, len(weak), path)] + [
                (value, child) for value, child in self._attributes(item, item_type, path)
                if not child.endswith((".data", "._remove"))]
        return self._attributes(item, item_type, path)

    def _suspended_found(self, item: Any, item_type: type, path: str) -> list[tuple[Any, str]]:
        """A generator's or coroutine's suspended frame: its locals as `gen.gi_frame.f_locals['batch']`, what it
        delegates to as `gen.gi_yieldfrom`, and what only its value stack holds (the loop's iterator) labelled."""
        frame_name, delegate_name = FRAME_OWNERS[item_type]
        frame = item_type.__dict__[frame_name].__get__(item)  # None once it finished
        if frame is None:
            return []
        children = frame_children(frame, f"{path}.{frame_name}", self._holders, self._visited, callers=False)
        delegate = item_type.__dict__[delegate_name].__get__(item)
        if delegate is not None:
            children.append((delegate, f"{path}.{delegate_name}"))
        named = {id(child) for child, _ in children}
        label = f"{path} ({item_type.__name__}'s suspended frame)"
        children += [(child, label) for child in self._holders.stack_values(item, frame) if id(child) not in named]
        if _typeable(path):
            self.releasable.append((f"{path}.close()", (f"{path}.{frame_name}", f"{path}.{delegate_name}", label),
                                    f"the suspended frame of {path}", "it then ends; a new one starts over"))
        return children

    def _key_name(self, referent: Any) -> str:
        """A weak key by the name the walk reached it by (`model.fc1`), else by its type and address."""
        known = self._visited.get(id(referent)) or self._param_paths.get(id(referent))
        if known is not None and referent is not None:
            return known
        return "<dead reference>" if referent is None else f"<{type(referent).__name__} at {id(referent):#x}>"

    def _lru_cache_found(self, wrapper: Any, item_type: type, path: str) -> list[tuple[Any, str]]:
        """Each cached call's result as `f.cache[3]`, what its key holds as `f.cache[(<Tensor>,)].<key>`, then the
        wrapper's attributes (`__wrapped__`, the function, with its closure)."""
        children: list[tuple[Any, str]] = []
        entries, size = cache_entries(wrapper, self.limits.items)
        if size > self.limits.items:
            self._long.append(f"{path}'s lru_cache ({size:,} items)")
        for text, key, result in entries:
            entry = f"{path}.cache[{text}]"
            children.append((result, entry))
            if type(key) is tuple:
                children.append((key, f"{entry}.<key>"))
        if children:
            self.lru_caches.append(path)
        return children + self._attributes(wrapper, item_type, path)

    def _array_found(self, array: Any, item_type: type, path: str, ndarray: type) -> list[tuple[Any, str]]:
        """The tensor a NumPy array shares its memory with (`tensor.numpy()` sets the array's `base` to it), named
        `embeddings (NumPy array)`; the tensor itself may be gone from every name."""
        read_base = ndarray.__dict__["base"].__get__  # numpy's own getter: no subclass's property runs
        base = read_base(array)
        while base is not None and issubclass(type(base), ndarray):
            base = read_base(base)  # a view of a view
        children: list[tuple[Any, str]] = []
        if base is not None:
            label = f"{path} (NumPy array)" if issubclass(type(base), self._tensor) else f"{path}.base"
            children.append((base, label))
        if item_type is not ndarray:  # a subclass (a memmap, a masked array) keeps more in its attributes
            children += self._attributes(array, item_type, path)
        return children

    def _items(self, items: Iterable[Any], size: int, path: str) -> list[Any]:
        if size > self.limits.items:
            self._long.append(f"{path} ({size:,} items)")
        return list(itertools.islice(items, self.limits.items))

    def _attributes(self, item: Any, item_type: type, path: str) -> list[tuple[Any, str]]:
        found: list[tuple[Any, str]] = []
        try:
            state = object.__getattribute__(item, "__dict__")
        except AttributeError:
            state = None
        if issubclass(type(state), dict):
            found += [(value, f"{path}.{name}") for name, value in self._items(state.items(), len(state), path)]
        for klass in item_type.__mro__:
            slots = klass.__dict__.get("__slots__", ())
            for slot in (slots,) if isinstance(slots, str) else slots:
                descriptor = klass.__dict__.get(slot)
                if slot in ("__dict__", "__weakref__") or descriptor is None or not hasattr(descriptor, "__get__"):
                    continue
                try:
                    found.append((descriptor.__get__(item, klass), f"{path}.{slot}"))
                except AttributeError:
                    continue  # an unset slot
        return found

    # Torch objects -------------------------------------------------------------------------------------------------

    def _tensor_found(self, tensor: Any, path: str, kind: str, origin: _Origin) -> None:
        record = self._record(tensor, path, kind, origin)
        if tensor.is_leaf:
            grad = tensor.grad  # a non-leaf's .grad warns and is None unless retain_grad() was called
            if grad is not None:
                self._record(grad, f"{path}.grad", GRADIENT, origin)
        elif tensor.grad_fn is not None:
            self._graphs.append((tensor.grad_fn, f"graph of {path}", origin))
            if record is not None:
                record.has_graph = True

    def _module_found(self, module: Any, path: str, origin: _Origin) -> list[tuple[Any, str]]:
        for name, parameter in module.named_parameters(prefix=path, remove_duplicate=False):
            self._param_paths.setdefault(id(parameter), name)
            self._record(parameter, name, PARAMETER, origin)
            if parameter.grad is not None:
                self._record(parameter.grad, f"{name}.grad", GRADIENT, origin)
        for name, buffer in module.named_buffers(prefix=path, remove_duplicate=False):
            if buffer is not None:
                self._record(buffer, name, BUFFER, origin)
        children: list[tuple[Any, str]] = []
        for name, submodule in module.named_modules(prefix=path):
            self._visited.setdefault(id(submodule), name)
            state = object.__getattribute__(submodule, "__dict__")
            children += [(value, f"{name}.{attribute}") for attribute, value in state.items()
                         if attribute not in _MODULE_TABLES]
        return children

    def _optimizer_found(self, optimizer: Any, path: str, origin: _Origin) -> list[tuple[Any, str]]:
        children: list[tuple[Any, str]] = []
        state = optimizer.state
        for group_index, group in enumerate(optimizer.param_groups):
            for index, parameter in enumerate(group["params"]):
                slot = f"{path}.param_groups[{group_index}]['params'][{index}]"
                self._record(parameter, slot, PARAMETER, origin)
                owner = self._param_paths.get(id(parameter), slot)
                per_parameter = state.get(parameter) if isinstance(state, dict) else None
                for key, value in (per_parameter or {}).items():
                    value_path = f"{path}.state[{owner}][{_key_text(key)}]"
                    if issubclass(type(value), self._tensor):
                        self._record(value, value_path, OPTIMIZER_STATE, origin)
                    else:
                        children.append((value, value_path))
        attributes = object.__getattribute__(optimizer, "__dict__")
        children += [(value, f"{path}.{name}") for name, value in attributes.items()
                     if name not in ("state", "param_groups", "defaults")]
        return children

    def _record(self, tensor: Any, path: str, kind: str, origin: _Origin) -> StorageRecord | None:
        try:
            storage = tensor.untyped_storage()
            pointer = storage.data_ptr()
            size = storage.nbytes()
        except (RuntimeError, NotImplementedError, TypeError, AttributeError):
            self._without_storage += 1  # sparse, nested, fake and meta tensors hold no plain storage to count
            return None
        if not pointer:
            return None  # an empty tensor, or one on the meta device
        device = str(tensor.device)
        key = (device, pointer)
        record = self.storages.get(key)
        for name, name_kind, holder, holder_kind in origin.paths(path, kind):
            if record is None:
                record = StorageRecord(device=device, dtype=_dtype_name(tensor.dtype), shape=tuple(tensor.shape),
                                       bytes=size, path=name, kind=name_kind, names=[name], address=pointer)
                self.storages[key] = record
            else:
                record.add_name(name, name_kind)
            record.holders[holder] = holder_kind
            record.path_of.setdefault(holder, (name, name_kind))
        return record

    def _walk_graphs(self) -> None:
        """The saved tensors behind every kept output with a grad_fn, after everything else is named."""
        for grad_fn, label, origin in self._graphs:
            shared: set[str] = set()
            try:
                for tensor in saved_tensors(grad_fn, self._graph_nodes, label, shared, self._tensor):
                    self._record(tensor, label, GRAPH, origin)
            except GraphTooLarge as error:
                self.notes.append(f"{label}: {error}")
            if shared:
                # Part of this graph was reached first from another kept output: its saved tensors hold for both.
                for record in self.storages.values():
                    if any(name in shared for name in record.names):
                        for name, kind, holder, holder_kind in origin.paths(label, GRAPH):
                            record.add_name(name, kind)
                            record.holders[holder] = holder_kind
                            record.path_of.setdefault(holder, (name, kind))
        self._graphs.clear()

    def _name_late_roots(self) -> None:
        """A variable that an earlier root's walk reached first (`kept`, which a model's forward hook closes over)
        names what lies under it too: `kept['last']` beside `net.1._forward_hooks[0].<closure>.kept['last']`."""
        for first_path, origin in self._late_roots:
            root = origin.root
            for record in self.storages.values():
                for name, kind in list(record.path_of.values()):
                    rest = name[len(first_path):]
                    if not name.startswith(first_path) or rest[:1] not in ("", ".", "["):
                        continue
                    kind = kind if kind in (PARAMETER, BUFFER, GRADIENT, OPTIMIZER_STATE) else root.kind
                    for alias, alias_kind, holder, holder_kind in origin.paths(root.path + rest, kind):
                        record.add_name(alias, alias_kind)
                        record.holders[holder] = holder_kind
                        record.path_of.setdefault(holder, (alias, alias_kind))
                    break
        self._late_roots.clear()

    def _summarise_cuts(self) -> None:
        if self._deep:
            self.notes.append(f"{len(self._deep):,} objects more than {self.limits.depth} steps deep were not looked "
                              f"into, e.g. {self._deep[0]}")
        if self._long:
            shown = ", ".join(self._long[:3])
            self.notes.append(f"only the first {self.limits.items:,} items of {len(self._long)} large container(s) "
                              f"were read: {shown}")
        for what, count in self._unreadable.items():
            self.notes.append(f"{count} object(s) could not be read ({what}); the walk went on without them")
        if self._without_storage:
            self.notes.append(f"{self._without_storage} tensor(s) without a plain storage (sparse, nested, meta) "
                              "are not counted")
        self._deep.clear()
        self._long.clear()


_OPAQUE_TYPES = frozenset(_OPAQUE)
_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(dtype: Any) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def _natural(path: str) -> tuple[Any, ...]:
    """Sort key that puts `batches[2]` before `batches[10]`."""
    return tuple(int(part) if part.isdigit() else part for part in _DIGITS.split(path))


_DIGITS = re.compile(r"(\d+)")


def _key_text(key: Any) -> str:
    """A dict key as the user would type it: 'val', 3, (0, 1); anything else by its type."""
    # type(), not isinstance(): isinstance reads a `__class__` a user's key may compute.
    if issubclass(type(key), str | int | float | bool | type(None)) or (
            type(key) is tuple and all(issubclass(type(k), str | int) for k in key) and len(key) <= 4):
        text = repr(key)
        return text if len(text) <= 60 else text[:57] + "..."
    return f"<{type(key).__name__}>"


def _typeable(path: str) -> bool:
    """A path a user can type into a cell: no label, no placeholder."""
    return " " not in path and "<" not in path


def _function_children(function: types.FunctionType, path: str) -> list[tuple[Any, str]]:
    """A notebook function's closure cells and default values: where a tensor hides in a function."""
    children: list[tuple[Any, str]] = []
    for name, cell in zip(function.__code__.co_freevars, function.__closure__ or (), strict=False):
        try:
            children.append((cell.cell_contents, f"{path}.<closure>.{name}"))
        except ValueError:
            continue  # an empty cell: the variable was never assigned
    for index, value in enumerate(function.__defaults__ or ()):
        children.append((value, f"{path}.__defaults__[{index}]"))
    for name, value in (function.__kwdefaults__ or {}).items():
        children.append((value, f"{path}.__kwdefaults__[{name!r}]"))
    return children
