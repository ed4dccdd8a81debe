"""The notebook's own variables a step changes as it runs: a step counter (`global_step += 1`), a running loss, a
history list (`losses.append(loss.item())`). A probe calls the step tens to hundreds of times, so without this a
user's counter would end far ahead and their history full of the probe's entries; on a loop lifted by %%gpuprofile
with `if global_step >= max_steps: break` in its body, the step even stopped returning its loss part-way through a
probe once the probe's calls had pushed the counter past the end.

Probe layer. What counts as the step's variables: the globals its code names (`co_names`: read, rebound with
`global`, or mutated through a method), in the step function and in the user's functions it reaches, as
`probekit.reach` walks them (the functions it calls, its closures and bound methods, `reach.MAX_CALL_DEPTH` calls
down: a ready step calls the lifted loop body), the same walk by which `training_state` finds the step's models and
optimizers. Training objects are left to `StateSnapshot`'s other parts, and
functions, classes and modules are not variables. Kept: the binding of each (so a rebinding is undone, and a name
the step created is removed again); the contents of a list, dict, set, deque or bytearray (put back in place, so
every other reference sees them too), and so for the containers inside them, three levels down (`history =
{"train": [], "val": []}` grows through `history["train"].append(...)`); a copy of a small tensor that requires no
gradient (put back in place); and the instance attributes of an object of a class the user wrote (a `Trainer` whose
`fit()` counts `self.global_step` and appends to `self.metrics`, also the `self` of a step that is a bound method),
each kept as a variable is, and so for the user's objects among them, one level down. A library's objects (a wandb
run, a Logger) are left as the step leaves them: their state also lives outside Python (`user_objects`).
"""

from __future__ import annotations

import collections
import collections.abc
import dis
import functools
import inspect
import io
import operator
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from jupyter_gpu.kernel_torch import loaded_torch
from jupyter_gpu.probekit.reach import step_references
from jupyter_gpu.probekit.user_objects import written_by_the_user

MAX_TENSOR_ELEMENTS = 1 << 20  # a counter or a running sum, not a dataset: larger tensors are the user's data
MAX_NESTING = 3            # containers inside containers kept: a history dict of lists, a list of per-epoch dicts
MAX_OBJECT_NESTING = 2     # the user's object (a Trainer) and the user's objects it holds (its `self.state`)
_ABSENT = object()
_CONTAINERS = (list, dict, set, collections.deque, bytearray)


def _assigned_first(code: types.CodeType) -> set[str]:
    """The global names `code` stores before it ever reads them (in bytecode order, nested code where it is made):
    a loop's target, `running_loss = 0.0` before `running_loss += ...`. Their value from before the code ran does
    not reach what it does."""
    first: dict[str, str] = {}

    def walk(current: types.CodeType) -> None:
        for instruction in dis.get_instructions(current):
            if isinstance(instruction.argval, types.CodeType):
                walk(instruction.argval)
            elif instruction.opname in _LOADS:
                first.setdefault(instruction.argval, "load")
            elif instruction.opname in _STORES:
                first.setdefault(instruction.argval, "store")
    walk(code)
    return {name for name, access in first.items() if access == "store"}


_LOADS = {"LOAD_NAME", "LOAD_GLOBAL"}
_STORES = {"STORE_NAME", "STORE_GLOBAL", "DELETE_NAME", "DELETE_GLOBAL"}


def step_globals(step: Any, carried_only: bool = False) -> list[tuple[dict[str, Any], str]]:
    """(namespace, name) of every global the step's code and the user's functions it reaches name, each once, as
    `probekit.reach` walks them (the one rule `training_state` also finds the step's objects by). `step` may be a list
    of steps (a cell's statements and its last expression, each made a function of the notebook). `carried_only`: not
    the names a code assigns before it reads them (a profiled cell's loop variables)."""
    found: dict[tuple[int, str], tuple[dict[str, Any], str]] = {}
    skipped: dict[int, set[str]] = {}
    for reference in step_references(step):
        if carried_only:
            code = reference.code
            if id(code) not in skipped:
                skipped[id(code)] = _assigned_first(code)
            if reference.name in skipped[id(code)]:
                continue
        found.setdefault((id(reference.namespace), reference.name), (reference.namespace, reference.name))
    return list(found.values())


class StepVariables:
    """A snapshot of the step's notebook variables; `restore()` puts them back, any number of times."""

    def __init__(self, entries: list[tuple[dict[str, Any], str, Any, Any]]) -> None:
        self._entries = entries  # (namespace, name, the object bound, a copy of its contents or None)
        self.changed: list[str] = []  # names a restore found changed, in the order first seen
        # Iterators among them, with how far each had gone where it tells (a DataLoader iterator's batches, a
        # list iterator's length hint): an iterator cannot be rewound, so the report says how far the run moved it
        # (`train_iter = iter(loader)` or `itertools.cycle(loader)` before a `next(train_iter)` loop).
        self._iterators = [(name, value, _position(value)) for _, name, value, _ in entries
                           if isinstance(value, collections.abc.Iterator) and not isinstance(value, io.IOBase)]

    @property
    def advanced_iterators(self) -> list[tuple[str, str]]:
        """(name, how far) of each iterator the run may have read from: "10 batches, to its end", "3 items", or
        "how far cannot be told" (itertools.cycle); its binding is put back, its position cannot be."""
        moved = []
        for name, iterator, before in self._iterators:
            after = _position(iterator)
            if before is None or after is None:
                moved.append((name, f"a {type(iterator).__name__}: how far cannot be told"))
            elif after != before:
                unit = "batch" if _is_loader_iterator(iterator) else "item"
                count = abs(after - before)
                ended = ", to its end" if _exhausted(iterator) else ""
                moved.append((name, f"{count} {unit}{'es' if unit == 'batch' and count != 1 else ''}"
                                    f"{'s' if unit == 'item' and count != 1 else ''}{ended}"))
        return moved

    @classmethod
    def take(cls, step: Any, skip: set[int], whole_run: bool = False) -> StepVariables:
        """`skip`: ids of objects another part of the snapshot keeps (the training objects). `whole_run`: the step
        is a profiled cell, run once: the names it creates stay (`losses = []`, for the ready steps lifted from it),
        and so do those it assigns before reading (its loop variables: the next run does not see their old value)."""
        entries = []
        for namespace, name in step_globals(step, carried_only=whole_run):
            value = namespace.get(name, _ABSENT)
            if value is _ABSENT and whole_run:
                continue
            if inspect.isfunction(value):
                counters = _counters(value) if value.__globals__ is namespace else None
                if counters:
                    entries.append((namespace, name, value, counters))
                continue
            if value is not _ABSENT and (id(value) in skip or _not_a_variable(value)):
                continue
            entries.append((namespace, name, value, _contents(value, whole_run)))
        for owner, label in _bound_owners(step):
            if id(owner) not in skip:
                entries.append(({label: owner}, label, owner, _contents(owner, whole_run)))
        return cls(entries)

    def restore(self) -> None:
        for namespace, name, value, contents in self._entries:
            changed = [""] if namespace.get(name, _ABSENT) is not value else []
            if value is _ABSENT:
                namespace.pop(name, None)
            else:
                namespace[name] = value
                if contents is not None:
                    changed += _put_back(value, contents)
            if isinstance(contents, _Counters):
                continue
            for where in changed:
                if name + where not in self.changed:
                    self.changed.append(name + where)


def _bound_owners(step: Any) -> Iterator[tuple[Any, str]]:
    """The user's objects whose bound methods are the step (`profile_training(trainer.fit)`), each with how the
    report names it: its notebook name where the method's module has one, else "self"."""
    for one in step if isinstance(step, list) else [step]:
        func = one
        while isinstance(func, functools.partial):
            func = func.func
        if inspect.ismethod(func) and written_by_the_user(func.__self__):
            owner = func.__self__
            namespace = getattr(func.__func__, "__globals__", {})
            yield owner, next((name for name, value in list(namespace.items()) if value is owner), "self")


class _Counters(dict):
    """The numbers a notebook function keeps on itself (`profile_step.calls`, the loop counter a lifted step
    carries from call to call): put back so every configuration a probe measures starts its calls at the same count.
    Without it a lifted nanoGPT loop ran its `if iter % eval_interval == 0` evaluation in the first baseline run
    only, drew other random batches in the second, and was judged "not the same computation twice"."""


def _is_loader_iterator(value: Any) -> bool:
    torch = loaded_torch()
    loader_iterator = getattr(getattr(getattr(torch, "utils", None), "data", None), "dataloader", None)
    base = getattr(loader_iterator, "_BaseDataLoaderIter", None)
    return base is not None and isinstance(value, base) and isinstance(getattr(value, "_num_yielded", None), int)


def _position(iterator: Any) -> int | None:
    """How many items the iterator has given (a DataLoader iterator) or has left (its length hint, negated so that
    both grow as it is read); None where it cannot tell (itertools.cycle, most C iterators)."""
    if _is_loader_iterator(iterator):
        return int(iterator._num_yielded)
    hint = operator.length_hint(iterator, -1)
    return -hint if hint >= 0 else None


def _exhausted(iterator: Any) -> bool:
    if _is_loader_iterator(iterator):
        try:
            return iterator._num_yielded >= len(iterator)
        except TypeError:  # an IterableDataset's iterator has no length
            return False
    return operator.length_hint(iterator, -1) == 0


def advanced_iterators_notes(advanced: list[tuple[str, str]], who: str) -> list[str]:
    """The sentence on the notebook's iterators `who` ("The cell", "The probe's calls of the step") read from, in a
    list, or an empty list."""
    if not advanced:
        return []
    moved = "; ".join(f"{name}: {how_far}" for name, how_far in advanced)
    return [f"{who} read from iterators of the notebook ({moved}). Their bindings are put back, but an iterator "
            "cannot be rewound: the next run goes on from where this one left it, not from where the real run "
            "would have started; make a new one (`train_iter = iter(loader)`) before it to start an epoch afresh."]


def _counters(func: types.FunctionType) -> _Counters | None:
    found = _Counters({key: value for key, value in vars(func).items()
                       if isinstance(value, int | float) and not isinstance(value, bool)})
    return found or None


def _not_a_variable(value: Any) -> bool:
    """Functions, classes, modules and the like: nothing a step changes as it runs."""
    return (inspect.isroutine(value) or inspect.isclass(value) or inspect.ismodule(value)
            or isinstance(value, functools.partial))


@dataclass
class _Container:
    """A container's items as they were (a dict's as a dict, the others' as a list), and the same for the containers
    among them, each put back in place too."""

    items: Any
    inner: list[tuple[Any, _Container]]


def _container(value: Any, depth: int, seen: set[int]) -> _Container:
    seen.add(id(value))
    items = dict(value) if isinstance(value, dict) else list(value)
    inner = []
    if depth < MAX_NESTING:
        for item in (items.values() if isinstance(items, dict) else items):
            if isinstance(item, _CONTAINERS) and id(item) not in seen:
                inner.append((item, _container(item, depth + 1, seen)))
    return _Container(items, inner)


def _put_back_items(value: Any, items: Any) -> bool:
    if isinstance(value, dict):
        if list(value) == list(items) and all(value[key] is item for key, item in items.items()):
            return False
        value.clear()
        value.update(items)
        return True
    now = list(value)
    if len(now) == len(items) and all(a is b for a, b in zip(now, items, strict=True)):
        return False
    if isinstance(value, set):
        value.clear()
        value.update(items)
    elif isinstance(value, collections.deque):
        value.clear()
        value.extend(items)
    else:
        value[:] = items
    return True


@dataclass
class _Attributes:
    """An object of the user's own class: which object each instance attribute was bound to, the contents of those
    kept as a variable's are, and whether attributes the run added stay (a profiled cell's, as its new names do)."""

    bindings: dict[str, Any]
    contents: dict[str, Any]
    keep_added: bool


def _attributes(value: Any, keep_added: bool, depth: int) -> _Attributes:
    bindings = dict(vars(value))
    contents = {}
    for name, bound in bindings.items():
        if not _not_a_variable(bound):
            inner = _contents(bound, keep_added, depth + 1)
            if inner is not None:
                contents[name] = inner
    return _Attributes(bindings, contents, keep_added)


def _put_back_attributes(value: Any, saved: _Attributes) -> list[str]:
    """Writes the instance dict itself: no property or `__setattr__` of the user's class runs (a frozen dataclass
    would refuse), and an attribute nothing changed is not touched."""
    live = vars(value)
    changed = []
    if not saved.keep_added:
        for name in [name for name in live if name not in saved.bindings]:
            del live[name]
            changed.append(f".{name}")
    for name, bound in saved.bindings.items():
        if live.get(name, _ABSENT) is not bound:
            live[name] = bound
            changed.append(f".{name}")
        if name in saved.contents:
            changed += [f".{name}{where}" for where in _put_back(bound, saved.contents[name])]
    return changed


def _contents(value: Any, keep_added: bool = False, depth: int = 1) -> Any:
    """What is kept of a variable's value besides its binding, or None: `keep_added` is StepVariables.take's
    `whole_run`, for the attributes a run adds to the user's objects."""
    if isinstance(value, _CONTAINERS):
        return _container(value, 1, set())
    if depth <= MAX_OBJECT_NESTING and written_by_the_user(value):
        return _attributes(value, keep_added, depth)
    torch = loaded_torch()
    if (torch is not None and isinstance(value, torch.Tensor) and not value.requires_grad
            and not isinstance(value, torch.nn.Parameter) and value.numel() <= MAX_TENSOR_ELEMENTS):
        return value.detach().to("cpu", copy=True)  # host memory: a probe's device budget is the step's
    return None


def _put_back(value: Any, contents: Any) -> list[str]:
    """Puts the contents back in place; what had changed: "" for the value itself, ".name" for an attribute of the
    user's object (".state.epoch" one level further)."""
    if isinstance(contents, _Attributes):
        return _put_back_attributes(value, contents)
    if isinstance(contents, _Counters):
        changed = any(getattr(value, key, None) != number for key, number in contents.items())
        for key, number in contents.items():
            setattr(value, key, number)
        return [""] if changed else []
    if isinstance(contents, _Container):
        changed = _put_back_items(value, contents.items)
        for inner, inner_contents in contents.inner:
            changed = bool(_put_back(inner, inner_contents)) or changed
        return [""] if changed else []
    torch = loaded_torch()
    if value.shape != contents.shape:
        return [""]  # resized in place: it cannot be written back, but its binding is
    with torch.no_grad():
        same = bool(torch.equal(value.detach().cpu(), contents))
        if not same:
            value.copy_(contents)
    return [] if same else [""]
