"""The CPython holders a notebook keeps memory in without a container's items or an object's attributes: frames,
tracebacks and exceptions, suspended generators and coroutines, the user's own classes, weak-keyed dictionaries and
C iterators (`itertools.cycle` keeps every item of its first pass, pytorch/pytorch#23900).

Probe ring: it reads them the way the interpreter's own C code does and runs none of the user's code. Descriptors
are taken from the built-in type's own `__dict__` (a subclass's property does not run), a weak reference is
dereferenced by `weakref.ref`'s own C call (torch's `WeakIdRef.__call__` is not run), and what has no Python name
is listed by `gc.get_referents`, which calls the C type's `tp_traverse`.
"""

from __future__ import annotations

import gc
import sys
import types
import weakref
from collections.abc import Container, Iterable
from typing import Any

from jupyter_gpu.probekit.library_code import library_code_prefixes

# Objects that own a suspended frame: (the frame's attribute, the attribute naming what it awaits or delegates to).
FRAME_OWNERS: dict[type, tuple[str, str]] = {
    types.GeneratorType: ("gi_frame", "gi_yieldfrom"),
    types.CoroutineType: ("cr_frame", "cr_await"),
    types.AsyncGeneratorType: ("ag_frame", "ag_await"),
}
# Modules whose C iterators are labelled and read through their referents.
_C_ITERATOR_MODULES = frozenset({"builtins", "itertools", "collections", "_collections", "operator"})
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python (or by a C extension at run time)
_read_weakref = weakref.ReferenceType.__call__  # the C dereference; a subclass's __call__ is not run
_BASE_EXCEPTION = BaseException.__dict__
_FRAME = types.FrameType.__dict__
# What a frame's referents list beside its stack: its code, its function, names.
_NOT_STACK_VALUES = frozenset({types.CodeType, types.FrameType, str, types.FunctionType})


def _type_flags(klass: type) -> int:
    return type.__dict__["__flags__"].__get__(klass)  # a metaclass's own `__flags__` is not read


def c_iterator_label(item_type: type) -> str | None:
    """`itertools.cycle`, `enumerate`, `list_iterator`: a C iterator (or an itertools or operator object) whose
    references no attribute names; None for anything else."""
    if _type_flags(item_type) & _HEAP_TYPE or item_type in FRAME_OWNERS:
        return None
    module = type.__dict__["__module__"].__get__(item_type)
    if module not in _C_ITERATOR_MODULES:
        return None
    if module not in ("itertools", "operator") and "__next__" not in item_type.__dict__:
        return None  # a container (deque) or another built-in the walk reads by its items
    return item_type.__name__ if module in ("builtins", "_collections", "collections") \
        else f"{module}.{item_type.__name__}"


def exception_children(error: BaseException, path: str) -> list[tuple[Any, str]]:
    """An exception's arguments, traceback, cause and context: `failures[3].__traceback__`."""
    children: list[tuple[Any, str]] = [(arg, f"{path}.args[{index}]")
                                       for index, arg in enumerate(_BASE_EXCEPTION["args"].__get__(error))]
    for name in ("__traceback__", "__cause__", "__context__"):
        value = _BASE_EXCEPTION[name].__get__(error)
        if value is not None:
            children.append((value, f"{path}.{name}"))
    return children


def traceback_children(traceback: types.TracebackType, path: str, limit: int) -> list[tuple[Any, str]]:
    """Every frame down the chain, each one step below the traceback (a deep stack does not use up the walk's
    depth): `e.__traceback__.tb_frame`, `e.__traceback__.tb_next.tb_frame`, ..."""
    children: list[tuple[Any, str]] = []
    current: types.TracebackType | None = traceback
    hops = ""
    while current is not None and len(children) < limit:
        children.append((current.tb_frame, f"{path}{hops}.tb_frame"))
        current, hops = current.tb_next, hops + ".tb_next"
    return children


def frame_children(frame: types.FrameType, path: str, reader: HolderReader, visited: Container[int], *,
                   callers: bool = True) -> list[tuple[Any, str]]:
    """A frame's locals, `frame.f_locals['x']`, and (with `callers`) the user's frames that called it, which it
    keeps alive, up to one the walk has already looked into: `frame.f_back.f_locals['y']`. A module's frame is
    left out: its locals are a namespace the walk starts from (the notebook's, or a module's globals); a library's
    frame (IPython running the cell) too."""
    children: list[tuple[Any, str]] = []
    hops = ""
    current: types.FrameType | None = frame
    while current is not None and reader.user_frame(current) and (current is frame or id(current) not in visited):
        if _FRAME["f_locals"].__get__(current) is not _FRAME["f_globals"].__get__(current):
            for name, value in list(_FRAME["f_locals"].__get__(current).items()):
                children.append((value, f"{path}{hops}.f_locals[{name!r}]"))
        if not callers:
            break
        current, hops = _FRAME["f_back"].__get__(current), hops + ".f_back"
    return children


def weak_keyed_data(item: Any) -> list[tuple[Any, Any]] | None:
    """(key, value) of a weak-keyed mapping, its key dereferenced (None when dead): `weakref.WeakKeyDictionary`
    and anything built like it (torch's `WeakIdKeyDictionary`), a `data` dict keyed by weak references. None for
    anything else."""
    try:
        state = object.__getattribute__(item, "__dict__")
    except AttributeError:
        return None
    data = state.get("data") if type(state) is dict else None
    if type(data) is not dict or not data:
        return None
    # Items, never `data[key]`: looking a key up hashes it, and a weak reference's hash is its referent's __hash__.
    pairs = list(data.items())
    if not all(issubclass(type(key), weakref.ReferenceType) for key, _ in pairs[:8]):
        return None
    return [(_read_weakref(key) if issubclass(type(key), weakref.ReferenceType) else key, value)
            for key, value in pairs]


class HolderReader:
    """What the walk asks of one notebook's interpreter, answered once per module or class."""

    def __init__(self) -> None:
        self._library_folders = library_code_prefixes()
        self._user_modules: dict[str, bool] = {}

    def user_module(self, name: str) -> bool:
        """The notebook (`__main__`) or a module imported from the user's own folder."""
        known = self._user_modules.get(name)
        if known is None:
            known = self._user_modules[name] = self._is_user_module(name)
        return known

    def _is_user_module(self, name: str) -> bool:
        from jupyter_gpu.gpumem.roots import FOREIGN_PACKAGES

        if name == "__main__":
            return True
        if name.split(".", 1)[0] in FOREIGN_PACKAGES:
            return False
        module = sys.modules.get(name)
        path = getattr(module, "__dict__", {}).get("__file__") if module is not None else None
        return isinstance(path, str) and not path.startswith(self._library_folders)

    def user_class(self, klass: type) -> type | None:
        """The class itself when it was defined in the notebook or the user's own module, else None."""
        # type(), not isinstance(): isinstance reads a `__class__` the object may compute.
        if not issubclass(type(klass), type) or not _type_flags(klass) & _HEAP_TYPE:
            return None
        module = type.__dict__["__module__"].__get__(klass)
        return klass if isinstance(module, str) and self.user_module(module) else None

    def class_children(self, klass: type, path: str) -> list[tuple[Any, str]]:
        """A user class's own attributes (a method's lru_cache wrapper, a class-level cache dict), and those of
        its user base classes, by the name a user types: `Encoder.embed`, `type(enc).__mro__[1].shared`."""
        children: list[tuple[Any, str]] = []
        for index, base in enumerate(type.__dict__["__mro__"].__get__(klass)):
            if self.user_class(base) is not base:
                continue
            prefix = path if index == 0 else f"{path}.__mro__[{index}]"
            for name, value in list(type.__dict__["__dict__"].__get__(base).items()):
                if not (name.startswith("__") and name.endswith("__")):
                    children.append((value, f"{prefix}.{name}"))
        return children

    def user_frame(self, frame: types.FrameType) -> bool:
        """A frame of the notebook's or the user's own code (not IPython's, a library's or the interpreter's)."""
        filename = frame.f_code.co_filename
        if filename.startswith(self._library_folders):
            return False
        module = dict.get(_FRAME["f_globals"].__get__(frame), "__name__")
        return not isinstance(module, str) or self.user_module(module) or module == "__main__"

    @staticmethod
    def referents(item: Any) -> list[Any]:
        return gc.get_referents(item)

    @staticmethod
    def stack_values(owner: Any, frame: types.FrameType) -> Iterable[Any]:
        """What a suspended generator's frame holds beyond its named locals: the value stack (the iterator of the
        `for` loop it is suspended in). The frame's globals, builtins and code are not the frame's to hold."""
        skip = {id(_FRAME["f_globals"].__get__(frame)), id(_FRAME["f_builtins"].__get__(frame)),
                id(_FRAME["f_locals"].__get__(frame))}  # the named locals' snapshot: walked by name already
        for value in gc.get_referents(owner):
            if id(value) in skip or type(value) in _NOT_STACK_VALUES:
                continue
            yield value
