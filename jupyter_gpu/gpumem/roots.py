"""Where a notebook's memory can be held from: the user's variables, the globals of the modules they imported from
their own folders, IPython's output cache (the hidden `_` that `%reset out` misses included) and the frames the last
error keeps, each with the name a user would type.

Probe ring: it reads the shell's namespaces and the last exception, and changes nothing. The roots hold strong
references only while one walk runs; the caller drops them with the walk.
"""

from __future__ import annotations

import os
import re
import sys
import types
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpu.probekit.library_code import library_code_prefixes
from jupyter_gpu.probekit.release import last_error_frames

USER = "user variable"
OUTPUT = "output cache"
TRACEBACK = "traceback"

UNDERSCORES = ("_", "__", "___")
_OUTPUT_NUMBER = re.compile(r"_\d+")
# IPython's input history (strings) and its own objects: nothing of the user's lives there.
_INPUT_HISTORY = re.compile(r"_i+\d*|_ih|_dh|_sh|In|exit|quit|get_ipython")
# Values that hold no tensors: not worth a root (a notebook has many).
_SCALARS = (str, bytes, int, float, complex, bool, type(None))
# Packages whose objects hold the notebook itself (the shell, its kernel, its event loop): walking them would walk
# the namespace again under another name and a large configuration graph with it. Neither their objects nor their
# modules' globals are walked.
FOREIGN_PACKAGES = ("IPython", "ipykernel", "traitlets", "zmq", "tornado", "asyncio", "jupyter_client",
                    "ipywidgets", "comm", "jupyter_gpu")


@dataclass
class Root:
    """One starting point of the walk: a name, what kind of holder it is, and the value (held during one walk)."""

    path: str                    # "model", "Out[3]", "hidden _", "last error: frame train_step, local x"
    kind: str                    # USER, OUTPUT or TRACEBACK
    value: Any
    name: str | None = None      # the user_ns key for a user variable (what `--free NAME` deletes)
    forget: Callable[[], None] | None = None  # an output cache root: drops IPython's reference (`--free outputs`)
    aliases: list[tuple[str, str]] = field(default_factory=list)  # other (path, kind) naming the same object


def notebook_roots(namespace: Mapping[str, Any], shell: Any | None) -> list[Root]:
    """The roots in walk order, one per distinct object, its other names kept as aliases.

    Order: models first, then optimizers (so parameters are named `model.fc.weight` and optimizer state through
    them), then the other user variables and the globals of the user's own modules, the output cache, and the last
    error's frames.
    """
    hidden: Mapping[str, Any] = getattr(shell, "user_ns_hidden", None) or {}
    roots = sorted([*user_roots(namespace, hidden), *module_roots(namespace)], key=_user_order)
    roots += output_roots(namespace, shell)
    roots += traceback_roots(shell)
    return merge_aliases(roots)


def user_roots(namespace: Mapping[str, Any], hidden: Mapping[str, Any]) -> Iterator[Root]:
    """The user's own variables: every name except what IPython put there itself (pushed as hidden)."""
    for name, value in list(namespace.items()):
        if not isinstance(name, str) or _scalar(value) or _is_ipython_name(name, value, hidden):
            continue
        yield Root(name, USER, value, name=name)


def module_roots(namespace: Mapping[str, Any]) -> list[Root]:
    """The globals of every module imported from outside the interpreter's and site-packages' folders (the user's
    own `featstore.py` next to the notebook), each a root named `featstore.CACHE`.

    Libraries are left out: their globals are not the notebook's to explain, and walking all of them would cost
    each call. A module without a file (built in, frozen, a namespace package) is a library's too.
    """
    found: list[Root] = []
    library_folders = library_code_prefixes()
    for name, module in list(sys.modules.items()):
        state = _own_module_globals(name, module, namespace, library_folders)
        for attribute, value in list(state.items()):
            if (isinstance(attribute, str) and not attribute.startswith("__")
                    and not issubclass(type(value), _SCALARS + _NOT_HOLDERS)):
                found.append(Root(f"{name}.{attribute}", USER, value))
    return found


def _scalar(value: Any) -> bool:
    # type(), not isinstance(): isinstance reads a `__class__` that a user's object may compute (the walk runs none
    # of the user's code).
    return issubclass(type(value), _SCALARS)


# A module's globals that hold no tensor the walk would look into: imported modules and classes.
_NOT_HOLDERS = (types.ModuleType, type)


def _own_module_globals(name: str, module: Any, namespace: Mapping[str, Any],
                        library_folders: tuple[str, ...]) -> Mapping[str, Any]:
    """The module's globals when it is one of the user's own, else {}."""
    # type(), not isinstance(): isinstance reads `__class__`, which some lazy module proxies warn about.
    if not issubclass(type(module), types.ModuleType) or name == "__main__" \
            or name.split(".", 1)[0] in FOREIGN_PACKAGES:
        return {}
    state = module.__dict__
    path = state.get("__file__")
    if state is namespace or not isinstance(path, str):
        return {}
    if not os.path.isabs(path):
        path = os.path.abspath(path)  # rare (a module imported through a relative sys.path entry): not paid per call
    return {} if path.startswith(library_folders) else state


def _is_ipython_name(name: str, value: Any, hidden: Mapping[str, Any]) -> bool:
    if name in hidden and hidden[name] is value:
        return True  # IPython's `_`, `_3`, `Out`, `_oh`, ...: the output cache roots name them
    return bool(_INPUT_HISTORY.fullmatch(name)) or name in ("Out", "_oh")


def output_roots(namespace: MutableMapping[str, Any], shell: Any | None) -> list[Root]:
    """What IPython's output cache holds: Out[n], _n, _/__/___, the hidden ones `%reset out` leaves, the last result.

    Each root can `forget` its value: drop IPython's reference and leave the user's own names alone (a `_` the
    user assigned is theirs, not the cache's).
    """
    if shell is None:
        return []
    hidden: MutableMapping[str, Any] = getattr(shell, "user_ns_hidden", None) or {}
    found: list[Root] = []
    history = getattr(getattr(shell, "history_manager", None), "output_hist", None)
    if history is None:
        history = namespace.get("_oh") or {}
    for number in sorted(key for key in list(history) if isinstance(key, int)):
        found.append(Root(f"Out[{number}]", OUTPUT, history[number], forget=_popper(number, history)))
    for name, value in list(namespace.items()):
        if isinstance(name, str) and _OUTPUT_NUMBER.fullmatch(name) and hidden.get(name) is value:
            found.append(Root(name, OUTPUT, value, forget=_popper(name, namespace, hidden)))
    for name in UNDERSCORES:
        if name in namespace and hidden.get(name) is namespace[name]:
            found.append(Root(name, OUTPUT, namespace[name], forget=_blanker(name, namespace, hidden)))
        elif name in hidden:
            # displayhook pushes _ with interactive=False; `%reset out` deletes it from user_ns only, so the last
            # displayed value stays alive here (measured on IPython 8.12 and 9.18).
            found.append(Root(f"hidden {name}", OUTPUT, hidden[name], forget=_blanker(name, hidden)))
    displayhook = getattr(shell, "displayhook", None)
    for name in UNDERSCORES:
        found.append(Root(f"IPython's displayhook.{name}", OUTPUT, getattr(displayhook, name, None),
                          forget=lambda name=name: setattr(displayhook, name, "")))
    last = getattr(shell, "last_execution_result", None)
    found.append(Root("the last cell's result", OUTPUT, getattr(last, "result", None),
                      forget=lambda: setattr(last, "result", None)))
    return [root for root in found if not _scalar(root.value)]


def forget_outputs(namespace: MutableMapping[str, Any], shell: Any | None,
                   only: set[str] | None = None) -> list[str]:
    """Drop IPython's references to its cached outputs (those named in `only`, or all); returns the names dropped.

    The roots are local to this call, so no reference to a released value outlives it.
    """
    dropped: list[str] = []
    for root in output_roots(namespace, shell):
        if root.forget is not None and (only is None or root.path in only):
            root.forget()
            dropped.append(root.path)
    return dropped


def _popper(key: Any, *mappings: MutableMapping[Any, Any]) -> Callable[[], None]:
    """Forget by deleting the key from each mapping: `_popper(3, history)`, `_popper("_3", user_ns, hidden)`."""
    def forget() -> None:
        for mapping in mappings:
            mapping.pop(key, None)
    return forget


def _blanker(name: str, *mappings: MutableMapping[str, Any]) -> Callable[[], None]:
    """Forget `_` by setting it to "" in both namespaces, as IPython's own flush does: the next output then
    moves into `_` again (IPython stops updating `_` once it differs between the namespaces)."""
    def forget() -> None:
        for mapping in mappings:
            mapping[name] = ""
    return forget


def traceback_roots(shell: Any | None) -> list[Root]:
    """The locals of every frame the last error keeps alive (module frames are the namespace itself)."""
    found: list[Root] = []
    for frame in last_error_frames(shell):
        try:
            local_items = list(frame.f_locals.items())
        except Exception:  # a frame proxy of a C extension: nothing to read
            continue
        for local, value in local_items:
            if not _scalar(value):
                found.append(Root(f"last error: frame {frame.f_code.co_name}, local {local}", TRACEBACK, value))
    return found


def _user_order(root: Root) -> int:
    kind = type(root.value)
    names = {klass.__name__ for klass in kind.__mro__}
    if "Module" in names and any(k.__module__.startswith("torch.nn") for k in kind.__mro__):
        return 0
    if "Optimizer" in names and any(k.__module__.startswith("torch.optim") for k in kind.__mro__):
        return 1
    return 2


def merge_aliases(roots: list[Root]) -> list[Root]:
    """One root per object: `y`, `Out[3]`, `_3` and `__` showing the same tensor are walked once, named four times."""
    first: dict[int, Root] = {}
    merged: list[Root] = []
    for root in roots:
        known = first.get(id(root.value))
        if known is None:
            first[id(root.value)] = root
            merged.append(root)
        else:
            known.aliases.append((root.path, root.kind))
    return merged
