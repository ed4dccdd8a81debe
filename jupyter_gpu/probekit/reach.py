"""What a training step or a DataLoader reaches: the one discovery rule every probe uses, both for what it may change
(the models and optimizers an option applies to) and for what it must put back (the generators, the step's notebook
variables).

A bounded walk that never runs user code: it reads `__dict__` (`vars`), closure cells' `cell_contents`,
`__defaults__`/`__kwdefaults__`, bound methods' `__self__`/`__func__`, `functools.partial`'s parts, the names a code
object uses (`co_names`, nested code included) resolved in its function's `__globals__`, and class dictionaries
along the MRO, never a property, `__getattr__` or `__call__`. It follows

- from a step: its closure, defaults and globals, and the user's functions, bound methods and closures it calls or
  holds, `MAX_CALL_DEPTH` calls down (PyTorch's DQN tutorial: the loop calls `optimize_model()`, which uses the
  notebook's `optimizer`; the neural-style-transfer tutorial's LBFGS closure calls the notebook's `cnn`), and the
  user's objects they hold (a `Trainer`'s attributes, its class's methods);
- from a loader: its generator, sampler, batch sampler, dataset through any `.dataset`/`.datasets` (`Subset`,
  `random_split`, `ConcatDataset`, the user's wrappers), its collate function (a collator object's attributes and
  `__call__`, a closure) and `worker_init_fn`, and the notebook globals those functions name (a dataset's
  `__getitem__` drawing from a notebook-global `rng = np.random.default_rng()`).

Only code the user wrote is followed (`library_code`): torch's or a library's functions are not walked. Each thing
found comes with a path a user can type: its notebook name when it has one (`optimizer`, `full_ds.rng`,
`collator.generator`), else the way to it (`optimize_model → memory`). torch and NumPy are never imported here:
only their classes already loaded are looked for.
"""

from __future__ import annotations

import collections
import functools
import inspect
import random
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpu.kernel_torch import loaded_torch
from jupyter_gpu.probekit.library_code import is_library_file
from jupyter_gpu.probekit.user_objects import holds_attributes

MAX_CALL_DEPTH = 3     # the step, the functions it calls, theirs, and theirs
MAX_OBJECT_DEPTH = 5   # loader → batch_sampler → sampler → data_source (a Subset) → dataset → its rng
MAX_ITEMS = 256        # items looked at in one container: a dataset's list of samples holds no generator past these

KINDS = ("module", "optimizer", "scheduler", "scaler", "generator", "variable")
# IPython's input and output history: the cached outputs would list every model a cell ever displayed.
_HISTORY_NAMES = frozenset({"In", "Out"})
# The DataLoader fields the walk follows; its other attributes include a live persistent-workers iterator.
_LOADER_FIELDS = ("generator", "batch_sampler", "sampler", "dataset", "collate_fn", "worker_init_fn")
_CONTAINERS = (dict, list, tuple, set, frozenset, collections.deque)


@dataclass(frozen=True)
class Reached:
    path: str        # how the user names it: "optimizer", "full_ds.rng", "collator.generator"
    value: object
    kind: str        # "module" | "optimizer" | "scheduler" | "scaler" | "generator" | "variable"


@dataclass(frozen=True)
class GlobalReference:
    """A global name a walked function's code (or code nested in it) uses: in which namespace, and the function's
    code (whether that code assigns the name before reading it is `step_variables`' question)."""

    namespace: dict[str, Any]
    name: str
    code: types.CodeType


def reach_from_step(step: Any, namespace: Mapping[str, Any]) -> list[Reached]:
    """Everything `step` (a callable, or a list of them: a cell's statements) reaches; see the module docstring.
    Without a namespace, the notebook's names are read from the step's own module when it is the notebook's
    (`__main__`): a closure factory's `optimizer` is then named `optimizer`, not `train_step_fn → optimizer`."""
    walk = _Walk(namespace or _notebook_of(step), variables=True)
    walk.step(step)
    return list(walk.found.values())


def reach_from_loader(loader: Any, namespace: Mapping[str, Any]) -> list[Reached]:
    """The generators (and any training objects) a DataLoader's sampler, dataset, collate function and
    worker_init_fn reach; see the module docstring."""
    walk = _Walk(namespace, variables=False)
    walk.visit(walk.names.get(id(loader), "loader"), loader, 0, 0)
    return list(walk.found.values())


def _notebook_of(step: Any) -> Mapping[str, Any]:
    for one in step if isinstance(step, list) else [step]:
        func = one
        while isinstance(func, functools.partial):
            func = func.func
        func = getattr(func, "__func__", func)
        namespace = getattr(func, "__globals__", None) if inspect.isfunction(func) else None
        if isinstance(namespace, dict) and namespace.get("__name__") == "__main__":
            return namespace
    return {}


def step_references(step: Any) -> list[GlobalReference]:
    """The global names the step's code and the user's functions it reaches use, each (namespace, name, code)
    once: the notebook variables `step_variables` keeps, found by the same walk as `reach_from_step`."""
    walk = _Walk({}, variables=True)
    walk.step(step)
    return walk.references


def generator_access(value: object) -> tuple[Callable[[], Any], Callable[[Any], None]] | None:
    """(get the state, set it) of a random generator whose state can be read and put back: torch.Generator, NumPy's
    Generator and RandomState, Python's random.Random (not SystemRandom, which has no state); None for anything else.
    NumPy and torch are only looked at where the kernel imported them."""
    torch = loaded_torch()
    try:
        if torch is not None and isinstance(value, torch.Generator):
            return value.get_state, value.set_state
        if isinstance(value, random.Random):
            return None if isinstance(value, random.SystemRandom) else (value.getstate, value.setstate)
        numpy = sys.modules.get("numpy")
        if numpy is not None and isinstance(value, numpy.random.Generator):
            bits = value.bit_generator
            return (lambda: bits.state), (lambda state: setattr(bits, "state", state))
        if numpy is not None and isinstance(value, numpy.random.RandomState):
            return value.get_state, value.set_state
    except Exception:  # a proxy whose __class__ raises
        return None
    return None


def generator_kind(value: object) -> bool:
    return generator_access(value) is not None


def training_kinds() -> tuple[tuple[str, tuple[type, ...]], ...]:
    """The torch classes of each training-object kind; empty where the kernel has not imported torch."""
    torch = loaded_torch()
    if torch is None:
        return ()
    lr_scheduler = torch.optim.lr_scheduler
    return (
        ("module", (torch.nn.Module,)),
        ("optimizer", (torch.optim.Optimizer,)),
        ("scheduler", (lr_scheduler.LRScheduler, lr_scheduler.ReduceLROnPlateau)),
        ("scaler", (torch.amp.GradScaler,)),  # torch.cuda.amp.GradScaler is a subclass
    )


def training_kind(value: object, kinds: tuple[tuple[str, tuple[type, ...]], ...]) -> str | None:
    """The training-object kind of `value` ("module", "optimizer", "scheduler", "scaler"), or None."""
    try:
        return next((kind for kind, classes in kinds if isinstance(value, classes)), None)
    except Exception:  # a proxy whose __class__ raises is not a training object
        return None


def _not_a_variable(value: Any) -> bool:
    """Functions, classes, modules and the like: nothing a step changes as it runs."""
    return (inspect.isroutine(value) or inspect.isclass(value) or inspect.ismodule(value)
            or isinstance(value, functools.partial))


def _code_names(code: types.CodeType) -> Iterator[str]:
    """The global names a code object and those nested in it (comprehensions, lambdas, inner functions) use."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_names(const)


def _user_function(func: Any) -> bool:
    code = getattr(func, "__code__", None)
    return isinstance(code, types.CodeType) and not is_library_file(code.co_filename)


def _user_class(cls: type) -> bool:
    """A class defined in the notebook (`__main__`) or in a file of the user's own (`train_lib.py`)."""
    module = getattr(cls, "__module__", "") or ""
    if module == "__main__":
        return True
    path = getattr(sys.modules.get(module), "__file__", None)
    return path is not None and not is_library_file(path)


def _is_loader(value: object) -> bool:
    torch = loaded_torch()
    data = getattr(getattr(torch, "utils", None), "data", None)
    loader = getattr(data, "DataLoader", None)
    return loader is not None and isinstance(value, loader)


def _walkable(value: object) -> bool:
    """An object whose instance attributes the walk reads: the user's own (a Trainer; a Dataset or sampler, even
    though its class derives from torch's), a library's plain object (a collator), or torch's data-pipeline objects
    (Subset, ConcatDataset, samplers), which hold the user's dataset and generators."""
    if holds_attributes(value):
        return True
    if not isinstance(getattr(value, "__dict__", None), dict):
        return False
    module = getattr(type(value), "__module__", "") or ""
    return module.startswith("torch.utils.data") or _user_class(type(value))


@dataclass
class _Walk:
    namespace: Mapping[str, Any]
    variables: bool
    found: dict[Any, Reached] = field(default_factory=dict)
    references: list[GlobalReference] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)
    _kinds: tuple[tuple[str, tuple[type, ...]], ...] = ()
    # id -> the (object depth, call depth) it was walked at: reached again nearer the start, it is walked again,
    # so a depth-first order never cuts off what a shorter way reaches.
    _seen: dict[int, tuple[int, int]] = field(default_factory=dict)
    _functions: dict[int, int] = field(default_factory=dict)
    _referenced: set[tuple[int, str, int]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._kinds = training_kinds()
        for name, value in list(self.namespace.items()):
            if isinstance(name, str) and not name.startswith("_") and name not in _HISTORY_NAMES:
                self.names.setdefault(id(value), name)

    # -- the step ------------------------------------------------------------------------------------------

    def step(self, step: Any) -> None:
        for one in step if isinstance(step, list) else [step]:
            func = one
            while isinstance(func, functools.partial):
                name = getattr(func.func, "__name__", "step")
                for index, argument in enumerate(func.args):
                    self.visit(f"{name} argument {index}", argument, 0, 0)
                for key, argument in func.keywords.items():
                    self.visit(key, argument, 0, 0)
                func = func.func
            if inspect.ismethod(func):
                owner = func.__self__
                self.visit(self.names.get(id(owner), type(owner).__name__), owner, 0, 0)
                func = func.__func__
            if inspect.isfunction(func):
                self.function(getattr(func, "__name__", "step"), func, 0, own=True)
            else:
                # A callable object (a Trainer instance): its attributes, and its class's methods.
                self.visit(self.names.get(id(func), type(func).__name__), func, 0, 0)

    # -- one value -----------------------------------------------------------------------------------------

    def kind_of(self, value: object) -> str | None:
        kind = training_kind(value, self._kinds)
        return kind if kind is not None else ("generator" if generator_kind(value) else None)

    def record(self, path: str, value: object, kind: str) -> None:
        # A variable by its name: two counters at 0 are one int object and two variables.
        key: Any = ("variable", path) if kind == "variable" else id(value)
        if key not in self.found:
            self.found[key] = Reached(path, value, kind)

    def visit(self, path: str, value: Any, depth: int, calls: int) -> None:
        path = self.names.get(id(value), path)  # the notebook's own name, where it has one, is what a user types
        kind = self.kind_of(value)
        if kind is not None:
            self.record(path, value, kind)
            return  # a model's or optimizer's insides are its own snapshot's business
        if inspect.isfunction(value):
            if calls <= MAX_CALL_DEPTH:
                self.function(path, value, calls)
            return
        before = self._seen.get(id(value))
        if before is not None and before[0] <= depth and before[1] <= calls:
            return
        self._seen[id(value)] = (depth, calls)
        if inspect.ismethod(value):
            owner = value.__self__
            self.visit(self.names.get(id(owner), path.rpartition(".")[0] or type(owner).__name__), owner, depth,
                       calls)
            self.visit(path, value.__func__, depth, calls)
        elif isinstance(value, functools.partial):
            self.visit(path, value.func, depth, calls)
            for index, argument in enumerate(value.args):
                self.visit(f"{path}.args[{index}]", argument, depth + 1, calls)
            for key, argument in value.keywords.items():
                self.visit(f"{path}.keywords[{key!r}]", argument, depth + 1, calls)
        elif _not_a_variable(value) or depth >= MAX_OBJECT_DEPTH:
            return
        elif isinstance(value, _CONTAINERS):
            self.container(path, value, depth, calls)
        elif _is_loader(value):
            attributes = vars(value)
            for name in _LOADER_FIELDS:
                if name in attributes:
                    self.visit(f"{path}.{name}", attributes[name], depth + 1, calls)
        elif _walkable(value):
            self.attributes(path, value, depth, calls)

    def container(self, path: str, value: Any, depth: int, calls: int) -> None:
        items = value.items() if isinstance(value, dict) else enumerate(value)
        try:
            for count, (key, item) in enumerate(items):
                if count >= MAX_ITEMS:
                    return
                if isinstance(item, int | float | str | bytes | bool | type(None)):
                    continue  # a Subset's indices: nothing to reach
                label = f"{path}[{key!r}]" if not isinstance(value, set | frozenset) else f"{path} item"
                self.visit(label, item, depth + 1, calls)
        except RuntimeError:  # changed size during iteration (another thread's list): what was read is enough
            return

    def attributes(self, path: str, value: Any, depth: int, calls: int) -> None:
        for name, attribute in list(vars(value).items()):
            if isinstance(name, str):
                self.visit(f"{path}.{name}", attribute, depth + 1, calls)
        if calls >= MAX_CALL_DEPTH:
            return
        # The methods of the user's own class (a dataset's __getitem__, a collator's __call__, a Trainer's fit), read
        # from the class dictionaries (`inspect.getattr_static`'s way): they may draw from notebook globals.
        for cls in type(value).__mro__:
            if cls is object:
                continue
            for name, member in list(vars(cls).items()):
                if isinstance(member, staticmethod | classmethod):
                    member = member.__func__
                if inspect.isfunction(member) and _user_function(member):
                    self.function(f"{path}.{name}", member, calls + 1)

    # -- one function --------------------------------------------------------------------------------------

    def function(self, path: str, func: types.FunctionType, calls: int, own: bool = False) -> None:
        """`own`: the step itself, whose closure variables the report names by their own names."""
        before = self._functions.get(id(func))
        if (before is not None and before <= calls) or not _user_function(func):
            return
        self._functions[id(func)] = calls
        unwrapped = inspect.unwrap(func, stop=lambda f: not inspect.isfunction(f))  # functools.wraps: the body
        if unwrapped is not func and inspect.isfunction(unwrapped):
            self.function(path, unwrapped, calls, own)
        code = func.__code__
        for name, cell in zip(code.co_freevars, func.__closure__ or (), strict=False):
            try:
                contents = cell.cell_contents
            except ValueError:  # a cell whose variable is not assigned yet
                continue
            self.visit(name if own else f"{path} → {name}", contents, 0, calls + 1)
        for index, default in enumerate(func.__defaults__ or ()):
            self.visit(f"{path}.__defaults__[{index}]", default, 0, calls + 1)
        for key, default in (func.__kwdefaults__ or {}).items():
            self.visit(f"{path}.__kwdefaults__[{key!r}]", default, 0, calls + 1)
        namespace = func.__globals__
        for name in _code_names(code):
            key = (id(namespace), name, id(code))
            if key not in self._referenced:
                self._referenced.add(key)
                self.references.append(GlobalReference(namespace, name, code))
            if name not in namespace:
                continue
            value = namespace[name]
            module = namespace.get("__name__", "__main__")
            label = name if module == "__main__" else f"{module}.{name}"  # a user's train_lib.py: train_lib.name
            if self.variables and self.kind_of(value) is None and not _not_a_variable(value):
                self.record(self.names.get(id(value), label), value, "variable")
            self.visit(label, value, 0, calls + 1)
