"""Find the user's training objects and undo what each `%batchprobe` trial did to them.

A trial runs the user's real training step, so it updates parameters, BatchNorm statistics, gradients, optimizer
moments, schedulers, the AMP scaler, train/eval flags and the random number generators, and an out-of-memory
error can stop it anywhere: half-way through backward, between two parameters of optimizer.step. The DESIGN
rule is that afterwards all of that is bitwise what it was, so the snapshot keeps a host copy of every tensor and
restores by copying the bytes back into the original tensor objects: the optimizer holds parameters by identity,
and the user may hold references to gradients or buffers. Gradients alone are held weakly (`_GradState`): a
step's `zero_grad()` must be able to free the ones an earlier cell left, as it would in training.

Copies go to host memory, never to the device: the probe measures how much device memory the step can use, and
a device-side copy would take part of it. torch is imported inside functions only; importing this module must
not import it (the extension loads in kernels that never use torch).
"""

from __future__ import annotations

import copy
import random
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from jupyter_gpu.kernel_torch import loaded_torch
from jupyter_gpu.probekit.reach import generator_access, reach_from_step, training_kind, training_kinds
from jupyter_gpu.probekit.step_variables import StepVariables
from jupyter_gpu.probekit.user_objects import holds_attributes

if TYPE_CHECKING:
    import torch

# IPython's input and output history: the cached outputs would list every model a cell ever displayed.
_HISTORY_NAMES = frozenset({"In", "Out"})
# Looking one level inside a container is for `models = {"gen": g, "disc": d}`; a list of a million samples
# would cost seconds of isinstance checks and never holds the training objects.
_MAX_CONTAINER_ITEMS = 10_000
# The module dicts that hold parameters, buffers and submodules; a trial may replace or delete entries.
_MODULE_SLOTS = ("_parameters", "_buffers", "_modules")
# Plain attributes that optimizer.step() itself sets in torch 2.13 (torch/optim/optimizer.py, lr_scheduler.py):
# `_opt_called` is set by the LR scheduler's wrapper around step() before the step runs, so even a trial that
# fails at once sets it, and the user's next `scheduler.step()` would then skip the "called before
# optimizer.step()" warning. `_warned_capturable_if_run_uncaptured` is a warn-once flag. Nothing else in
# `Optimizer.__dict__` (hooks, defaults) changes during a step; `state` and `param_groups` are handled apart.
_OPTIMIZER_FLAGS = ("_opt_called", "_warned_capturable_if_run_uncaptured")
# GradScaler creates these tensors on the first scale(); its state_dict cannot say "not created yet".
_SCALER_LAZY_TENSORS = ("_scale", "_growth_tracker")


@dataclass
class TrainingObjects:
    """What a trial can change: the user's outermost modules, optimizers, LR schedulers and AMP grad scalers."""

    modules: list[Any]  # torch.nn.Module
    optimizers: list[Any]  # torch.optim.Optimizer
    schedulers: list[Any]  # torch.optim.lr_scheduler.LRScheduler and ReduceLROnPlateau
    scalers: list[Any]  # torch.amp.GradScaler and torch.cuda.amp.GradScaler
    labels: dict[int, str] = field(default_factory=dict)  # id(object) -> where it was found, e.g. "model"

    def objects(self) -> list[Any]:
        return [*self.modules, *self.optimizers, *self.schedulers, *self.scalers]

    def names(self) -> list[str]:
        """How the report names the objects, e.g. ["model", "opt"]."""
        return [self.labels.get(id(obj), type(obj).__name__) for obj in self.objects()]

    def models(self) -> list[Any]:
        """The modules with parameters: the models (not a loss module, which has nothing to convert or compile)."""
        return [module for module in self.modules if any(True for _ in module.parameters())]

    def parameters(self) -> list[Any]:
        """Every parameter of the modules and of the optimizers' groups, each once."""
        return _unique_params(self)

    def device(self) -> Any | None:
        """Where the model lives (its first parameter's device); None when no module with parameters was found."""
        for module in self.modules:
            for parameter in module.parameters():
                return parameter.device
        return None


def compiled_how(module: Any) -> str | None:
    """How a module is already compiled ("model.compile()", "torch.compile(model)"), or None: torch.compile's
    OptimizedModule wrapper, or a forward compiled on the instance (what %speedprobe's compile option does)."""
    if getattr(module, "_compiled_call_impl", None) is not None:
        return "model.compile()"
    if type(module).__name__ == "OptimizedModule" or hasattr(module.__dict__.get("forward"),
                                                             "_torchdynamo_orig_callable"):
        return "torch.compile(model)"
    return None


def find_training_objects(namespace: Mapping[str, Any], step: Callable[..., Any] | None = None) -> TrainingObjects:
    """Find the training objects in the user's namespace and among what `step` reaches.

    Looks at the namespace's values (not names starting with "_", not IPython's In/Out), each also one level inside
    dict, list and tuple values and in the attributes of an object of the user's own class (a Trainer's
    `self.model`: `holds_attributes`), and at everything `probekit.reach.reach_from_step` finds from the step: its
    closure cells, defaults, referenced globals, bound `self`, functools.partial arguments, and the same of the
    user's functions it calls, to a fixed depth. When torch has not been imported there is nothing to protect and
    nothing is imported.
    """
    found = TrainingObjects([], [], [], [])
    if loaded_torch() is None:
        return found
    kinds = training_kinds()  # torch is imported: loaded_torch() above
    seen: set[int] = set()
    candidates = named_values(namespace)
    if step is not None:
        # What the step reaches, by the one discovery rule every probe uses (`probekit.reach`): through the helpers,
        # closures and bound methods it calls (the DQN tutorial's optimize_model() and its `optimizer`), not only
        # what it names itself.
        # A label is written into code to adopt (`net = torch.compile(net)`): a closure's object reached through a
        # helper ("profile_step → net") is named as that code names it, by its variable.
        reached = ((item.path.rpartition(" → ")[2], item.value) for item in reach_from_step(step, namespace)
                   if item.kind != "variable")
        candidates = _chain_candidates(candidates, reached)
    for label, value in candidates:
        kind = training_kind(value, kinds)
        if kind is not None and id(value) not in seen:
            seen.add(id(value))
            getattr(found, kind + "s").append(value)  # TrainingObjects' lists: modules, optimizers, ...
            found.labels[id(value)] = label
    found.modules = _outermost(found.modules)
    return found


def _chain_candidates(*sources: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    for source in sources:
        yield from source


def _with_items(label: str, value: object) -> Iterator[tuple[str, Any]]:
    """The value itself, then what a dict, list or tuple value holds (one level), or the attributes of an object of
    the user's own (a `Trainer` holding `self.model`, `self.optimizer`, `self.scheduler`: `trainer.model`, ...)."""
    yield label, value
    if holds_attributes(value):
        for count, (name, attribute) in enumerate(list(vars(value).items())):
            if count >= _MAX_CONTAINER_ITEMS:
                return
            if isinstance(name, str):
                yield from _with_container_items(f"{label}.{name}", attribute)
        return
    yield from _with_container_items(label, value, itself=False)


def _with_container_items(label: str, value: object, itself: bool = True) -> Iterator[tuple[str, Any]]:
    if itself:
        yield label, value
    if isinstance(value, dict):
        items: Iterable[tuple[Any, Any]] = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return
    for count, (key, item) in enumerate(items):
        if count >= _MAX_CONTAINER_ITEMS:
            return
        yield f"{label}[{key!r}]", item


def value_at(namespace: Mapping[str, Any], path: str) -> Any:
    """What a name from `named_values` refers to: a notebook variable, or an attribute path from one
    (`trainer.train_loader`). KeyError for an unknown variable, AttributeError for a missing attribute."""
    head, *attributes = path.split(".")
    value = namespace[head]
    for attribute in attributes:
        value = getattr(value, attribute)
    return value


def set_value_at(namespace: dict[str, Any], path: str, value: Any) -> None:
    """Put `value` where `path` (as `value_at` reads it) points: the variable, or the attribute of its owner."""
    owner, _, attribute = path.rpartition(".")
    if owner:
        setattr(value_at(namespace, owner), attribute, value)
    else:
        namespace[path] = value


def named_values(namespace: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """What the probes look for training objects and loaders among, each with the notebook's name for it: the
    namespace's values (not "_" names, not In/Out), one level inside dicts, lists and tuples (`models['G']`), and the
    attributes of objects of the user's own classes (`trainer.model`, `trainer.train_loader`)."""
    for name, value in list(namespace.items()):
        if isinstance(name, str) and not name.startswith("_") and name not in _HISTORY_NAMES:
            yield from _with_items(name, value)


def _outermost(modules: list[Any]) -> list[Any]:
    """Drop every module that is a submodule of another found module: the outer one covers it."""
    inner = {id(sub) for module in modules for sub in module.modules() if sub is not module}
    return [module for module in modules if id(module) not in inner]


# -- snapshot -----------------------------------------------------------------------------------------------


def _layout(tensor: torch.Tensor) -> tuple[Any, ...]:
    """What a `p.data = ...`, `model.half()` or `model.to(...)` in a trial changes while keeping the object."""
    import torch

    strides = tensor.stride() if tensor.layout == torch.strided else None
    return (tensor.layout, tensor.shape, strides, tensor.dtype, tensor.device)


def _plain_parts(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The strided tensors that hold a copy's bytes (a sparse copy keeps them in its indices and values)."""
    import torch

    if tensor.layout == torch.sparse_coo:
        return [tensor._indices(), tensor._values()]
    return [tensor] if tensor.layout == torch.strided else []


def _host_nbytes(tensor: torch.Tensor) -> int:
    import torch

    if tensor.layout == torch.sparse_coo:
        return _host_nbytes(tensor._indices()) + _host_nbytes(tensor._values())
    return tensor.numel() * tensor.element_size()


class _TensorCopy:
    """One tensor object and a host copy of its bytes."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.original = tensor
        self.host = tensor.detach().to("cpu", copy=True)
        self.layout = _layout(tensor)
        self.device = tensor.device
        self.requires_grad = tensor.requires_grad

    def restore(self) -> None:
        """Copy the bytes back into the original object; the caller holds torch.no_grad()."""
        tensor = self.original
        if _layout(tensor) != self.layout:
            # The trial swapped the storage (p.data = ...): give the object its old storage back, then the bytes.
            tensor.data = self.host.to(self.device, copy=True)
        else:
            tensor.copy_(self.host)
        if tensor.is_leaf and tensor.requires_grad != self.requires_grad:
            tensor.requires_grad_(self.requires_grad)


class _TensorStore:
    """The host copies, one per tensor object: tied parameters and state shared by two owners are copied once."""

    def __init__(self) -> None:
        self._copies: dict[int, _TensorCopy] = {}  # the copy keeps the original alive, so ids are not reused

    def add(self, tensor: torch.Tensor | None) -> None:
        if tensor is not None and id(tensor) not in self._copies:
            self._copies[id(tensor)] = _TensorCopy(tensor)

    def restore(self) -> None:
        for tensor_copy in self._copies.values():
            tensor_copy.restore()

    @property
    def host_bytes(self) -> int:
        return sum(_host_nbytes(tensor_copy.host) for tensor_copy in self._copies.values())

    def host_tensors(self) -> Iterator[torch.Tensor]:
        for tensor_copy in self._copies.values():
            yield from _plain_parts(tensor_copy.host)


def _tensors_in(value: object) -> list[torch.Tensor]:
    """The tensors in a value, looking through nested dicts (keys too), lists, tuples and sets."""
    import torch

    found: dict[int, torch.Tensor] = {}
    visited: set[int] = set()
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, torch.Tensor):
            found[id(item)] = item
        elif id(item) in visited:
            continue
        elif isinstance(item, dict):
            visited.add(id(item))
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            visited.add(id(item))
            pending.extend(item)
    return list(found.values())


class _Frozen:
    """A deep copy of a value in which tensors (and the `keep` objects) stay the original objects.

    The tensors' bytes go to the store. Each `thaw()` gives a fresh copy, so a value restored once and then
    mutated by the next trial does not change what the following restore puts back.
    """

    def __init__(self, value: object, store: _TensorStore, keep: Iterable[object] = ()) -> None:
        tensors = _tensors_in(value)
        for tensor in tensors:
            store.add(tensor)
        # deepcopy returns memo[id(x)] for anything already in its memo: that is how originals stay themselves.
        self._memo = {id(obj): obj for obj in [*tensors, *keep]}
        self._value = copy.deepcopy(value, dict(self._memo))

    def thaw(self) -> Any:
        return copy.deepcopy(self._value, dict(self._memo))


class _Part(Protocol):
    def restore(self) -> None: ...


class _ModuleState:
    """Which objects sit in every submodule's parameter, buffer and submodule slots, and its train/eval flag."""

    def __init__(self, modules: list[Any], store: _TensorStore) -> None:
        self._entries: list[tuple[Any, dict[str, dict[str, Any]], bool]] = []
        seen: set[int] = set()
        for module in modules:
            for sub in module.modules():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    self._entries.append(self._capture(sub, store))

    @staticmethod
    def _capture(module: Any, store: _TensorStore) -> tuple[Any, dict[str, dict[str, Any]], bool]:
        slots = {slot: dict(getattr(module, slot)) for slot in _MODULE_SLOTS}
        for slot in ("_parameters", "_buffers"):
            for tensor in slots[slot].values():
                store.add(tensor)
        return module, slots, module.training

    def restore(self) -> None:
        for module, slots, training in self._entries:
            for slot, saved in slots.items():
                live = getattr(module, slot)
                live.clear()  # rebuilding keeps the dict object and the original order of the entries
                live.update(saved)
                for name in saved:
                    # A trial that deleted a parameter and assigned a plain tensor left it in __dict__.
                    module.__dict__.pop(name, None)
            # Set the flag itself: module.train() recurses and may be overridden by the user's class.
            module.training = training


class _GradState:
    """Which gradient each parameter had (None included), held *weakly*, with a host copy of its bytes.

    A step that starts with `zero_grad()` frees the gradients an earlier step left, and that memory is free for
    its own; a strong reference here would keep them alive through every trial and lower the answer by their
    size. So a restore gives back the same gradient object when something else still holds it (the user's
    `g = p.grad`), and otherwise a new one with the same bytes, strides and device: the values are what they
    were, and nobody is left holding the old object to tell the difference.
    """

    def __init__(self, params: list[Any]) -> None:
        self._grads = [(param, None if param.grad is None else _WeakGradCopy(param.grad)) for param in params]

    def restore(self) -> None:
        # Assigning None drops the gradients a trial created; this needs the parameters' own storage back
        # first (a gradient must match its parameter), which the store restores before the parts.
        for param, saved in self._grads:
            param.grad = None if saved is None else saved.revive()

    @property
    def host_bytes(self) -> int:
        return sum(_host_nbytes(saved.host) for _, saved in self._grads if saved is not None)

    def host_tensors(self) -> Iterator[torch.Tensor]:
        for _, saved in self._grads:
            if saved is not None:
                yield from _plain_parts(saved.host)


class _WeakGradCopy:
    """A gradient's bytes on the host and a weak reference to the gradient object itself."""

    def __init__(self, grad: torch.Tensor) -> None:
        self._ref = weakref.ref(grad)
        self.host = grad.detach().to("cpu", copy=True)
        self._layout = _layout(grad)
        self._device = grad.device

    def revive(self) -> torch.Tensor:
        import torch

        grad = self._ref()
        if grad is not None:
            if _layout(grad) != self._layout:
                grad.data = self.host.to(self._device, copy=True)
            else:
                grad.copy_(self.host)
            return grad
        layout, shape, strides, dtype, _ = self._layout
        if layout == torch.strided:
            grad = torch.empty_strided(shape, strides, dtype=dtype, device=self._device).copy_(self.host)
        else:  # a sparse gradient: its own layout comes with the copy
            grad = self.host.to(self._device, copy=True)
        self._ref = weakref.ref(grad)  # the next restore finds this one while the parameter holds it
        return grad


class _OptimizerState:
    """An optimizer's per-parameter state dicts, param_groups hyper-parameters and step flags."""

    def __init__(self, optimizer: Any, store: _TensorStore) -> None:
        self._optimizer = optimizer
        self._state = optimizer.state
        self._param_groups = optimizer.param_groups
        # The "params" list is kept as the same object; everything else in a group is copied.
        self._groups = [(group, _Frozen(dict(group), store, keep=[group["params"]])) for group in self._param_groups]
        self._per_param = [(param, entry, _Frozen(dict(entry), store)) for param, entry in self._state.items()]
        self._flags = {name: optimizer.__dict__[name] for name in _OPTIMIZER_FLAGS if name in optimizer.__dict__}

    def restore(self) -> None:
        optimizer = self._optimizer
        # Only when replaced: wrapper optimizers (accelerate's) expose these as properties of an inner optimizer.
        if optimizer.state is not self._state:
            optimizer.state = self._state
        if optimizer.param_groups is not self._param_groups:
            optimizer.param_groups = self._param_groups
        self._param_groups[:] = [group for group, _ in self._groups]
        for group, frozen in self._groups:
            group.clear()
            group.update(frozen.thaw())
        # Clearing drops the state a trial created (Adam's moments for a fresh optimizer) so it can be freed.
        self._state.clear()
        for param, entry, frozen in self._per_param:
            entry.clear()
            entry.update(frozen.thaw())
            self._state[param] = entry
        for name in _OPTIMIZER_FLAGS:
            if name in self._flags:
                setattr(optimizer, name, self._flags[name])
            else:
                optimizer.__dict__.pop(name, None)


class _SchedulerState:
    """An LR scheduler's state_dict (last_epoch, _step_count, _last_lr, ...)."""

    def __init__(self, scheduler: Any, store: _TensorStore, keep: list[Any]) -> None:
        self._scheduler = scheduler
        # state_dict() returns the live attribute values; freezing copies them (tensor learning rates by bytes).
        # A user's scheduler class may hold a model or optimizer in its __dict__: those stay the same objects.
        self._frozen = _Frozen(scheduler.state_dict(), store, keep=keep)

    def restore(self) -> None:
        self._scheduler.load_state_dict(self._frozen.thaw())


class _ScalerState:
    """An AMP GradScaler: its state_dict plus what the state_dict leaves out.

    The state_dict round-trips the scale, growth tracker and factors bitwise (the float32 scale goes through a
    Python float exactly), but it leaves out two things a failed trial changes: the per-optimizer stage (a
    trial stopped after `unscale_` would make the user's next `scaler.step` skip unscaling, stepping with
    gradients multiplied by the scale) and the lazily created scale tensors. A disabled scaler has no state.
    """

    def __init__(self, scaler: Any, store: _TensorStore) -> None:
        self._scaler = scaler
        self._enabled = scaler.is_enabled()
        if self._enabled:
            self._state = copy.deepcopy(scaler.state_dict())  # Python floats and ints only
            self._lazy = {name: scaler.__dict__.get(name) for name in _SCALER_LAZY_TENSORS}
            self._per_optimizer = _Frozen(scaler.__dict__.get("_per_optimizer_states"), store)

    def restore(self) -> None:
        if not self._enabled:
            return
        scaler = self._scaler
        for name, tensor in self._lazy.items():
            setattr(scaler, name, tensor)  # None again if a trial created it, so load_state_dict skips it
        scaler.load_state_dict(copy.deepcopy(self._state))
        scaler._per_optimizer_states = self._per_optimizer.thaw()


class _RngState:
    """The CPU, CUDA (and XPU) generators of torch, Python's `random`, and numpy's global generator.

    Generators the user created (torch.Generator, numpy.random.default_rng) are not included.
    """

    def __init__(self) -> None:
        import torch

        self.cpu = torch.get_rng_state()
        # Reading the CUDA state would initialise CUDA, which breaks forked DataLoader workers later.
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        xpu = getattr(torch, "xpu", None)
        self.xpu = xpu.get_rng_state_all() if xpu is not None and xpu.is_initialized() else None
        self.python = random.getstate()
        numpy_random = sys.modules.get("numpy.random")
        self.numpy = numpy_random.get_state() if numpy_random is not None else None

    def restore(self) -> None:
        import torch

        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        elif torch.cuda.is_initialized():
            _reset_fresh_cuda_generators()
        if self.xpu is not None:
            torch.xpu.set_rng_state_all(self.xpu)
        random.setstate(self.python)
        if self.numpy is not None:
            sys.modules["numpy.random"].set_state(self.numpy)

    @property
    def host_bytes(self) -> int:
        return sum(_host_nbytes(state) for state in [self.cpu, *(self.cuda or []), *(self.xpu or [])])


class _ReachedGenerators:
    """The generators the user made that the step reaches (`probekit.reach`): a notebook's `g = torch.Generator()`
    its batches are drawn with, a `self.rng` on the user's Trainer, a NumPy `rng` a helper it calls draws from.
    `_RngState` keeps only the global ones, and each call of the step moves these too."""

    def __init__(self, step: Any) -> None:
        self._states = []
        for reached in reach_from_step(step, {}):
            access = generator_access(reached.value) if reached.kind == "generator" else None
            if access is not None:
                get_state, set_state = access
                self._states.append((get_state(), set_state))

    def restore(self) -> None:
        for state, set_state in self._states:
            set_state(state)


def _reset_fresh_cuda_generators() -> None:
    """A trial initialised CUDA: put its generators back to how lazy initialisation left them.

    A freshly initialised generator is its initial seed at offset 0 (torch.manual_seed before CUDA init is
    queued and becomes that seed), so reseeding with the same seed gives exactly the state the user's first
    CUDA random call would have seen.
    """
    import torch

    for generator in torch.cuda.default_generators:
        generator.manual_seed(generator.initial_seed())


def _unique_params(objects: TrainingObjects) -> list[Any]:
    """Every parameter of the modules and of the optimizers' groups (an optimizer may own parameters of a
    module that was not found), each once."""
    params: dict[int, Any] = {}
    for module in objects.modules:
        for param in module.parameters():
            params.setdefault(id(param), param)
    for optimizer in objects.optimizers:
        for group in optimizer.param_groups:
            for param in group["params"]:
                params.setdefault(id(param), param)
    return list(params.values())


class StateSnapshot:
    """Everything a trial can change, copied to host memory; `restore()` puts it back bitwise, any number of
    times, also after a trial that failed half-way."""

    def __init__(self, store: _TensorStore, parts: list[_Part], rng: _RngState) -> None:
        self._store = store
        self._parts = parts
        self._rng = rng

    @classmethod
    def take(cls, objects: TrainingObjects, step: Any = None, whole_run: bool = False) -> StateSnapshot:
        """`step`: also the notebook variables the step changes as it runs (`probekit.step_variables`); `whole_run`:
        the step is a profiled cell, whose new names and loop variables stay."""
        store = _TensorStore()
        parts: list[_Part] = [
            _ModuleState(objects.modules, store),
            _GradState(_unique_params(objects)),
            *(_OptimizerState(optimizer, store) for optimizer in objects.optimizers),
            *(_SchedulerState(scheduler, store, objects.objects()) for scheduler in objects.schedulers),
            *(_ScalerState(scaler, store) for scaler in objects.scalers),
        ]
        if step is not None:
            parts.append(StepVariables.take(step, {id(value) for value in objects.objects()}, whole_run))
            parts.append(_ReachedGenerators(step))
        return cls(store, parts, _RngState())

    @property
    def advanced_iterators(self) -> list[tuple[str, str]]:
        """(name, how far) of the notebook's iterators the step read from: those cannot be put back."""
        return [item for part in self._parts if isinstance(part, StepVariables) for item in part.advanced_iterators]

    @property
    def changed_variables(self) -> list[str]:
        """The step's notebook variables a restore found changed and put back (`global_step`, `losses`)."""
        # An iterator the step read from is named apart (advanced_iterators): "put back as it was" would be untrue.
        moved = {name for name, _ in self.advanced_iterators}
        return [name for part in self._parts if isinstance(part, StepVariables) for name in part.changed
                if name not in moved]

    def restore(self, variables: bool = True) -> None:
        """`variables=False` leaves the step's notebook variables as the calls so far made them: %batchprobe's
        trials, whose leftover check names what the step keeps (`losses.append(loss)`), put them back once, at
        the end."""
        import torch

        with torch.no_grad():
            # Bytes first: putting a gradient back on a parameter needs the parameter's own shape and dtype.
            self._store.restore()
            for part in self._parts:
                if variables or not isinstance(part, StepVariables):
                    part.restore()
        self._rng.restore()

    def host_tensors(self) -> Iterator[torch.Tensor]:
        """The host copies themselves: a CPU budget must not count them as the step's memory."""
        yield from self._store.host_tensors()
        for part in self._parts:
            if isinstance(part, _GradState):
                yield from part.host_tensors()
        yield from [self._rng.cpu, *(self._rng.cuda or []), *(self._rng.xpu or [])]

    @property
    def host_bytes(self) -> int:
        """Bytes of host memory the copies take (tensor data and the torch generator states)."""
        grads = sum(part.host_bytes for part in self._parts if isinstance(part, _GradState))
        return self._store.host_bytes + grads + self._rng.host_bytes
