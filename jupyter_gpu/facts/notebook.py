"""Notebook facts: what the user's namespace and torch's global settings say (catalogue §2 P8).

Probe ring: this module reads live objects, and only reads them. It never imports torch (when the user
has not imported it there is nothing to audit) and never initialises CUDA: it reads
`torch.cuda.is_initialized()` and, only when that is already True, the sync debug mode.

`gather_notebook_facts()` returns a JSON-serialisable dict. Every key:

- `torch_imported` (bool): "torch" is in `sys.modules`.
- `flags` (dict | None): torch's global settings; None when torch is not imported. Each value is None when
  this torch lacks the setting (or reading it raised).
  - `float32_matmul_precision` (str): `torch.get_float32_matmul_precision()`: "highest", "high", "medium".
  - `matmul_allow_tf32` (bool): `torch.backends.cuda.matmul.allow_tf32`.
  - `matmul_fp32_precision` (str): `torch.backends.cuda.matmul.fp32_precision` (torch >= 2.9: "ieee",
    "tf32" or "none").
  - `cudnn_allow_tf32`, `cudnn_enabled`, `cudnn_benchmark`, `cudnn_deterministic` (bool):
    `torch.backends.cudnn.*`.
  - `anomaly_enabled` (bool): `torch.is_anomaly_enabled()`.
  - `deterministic_algorithms` (bool): `torch.are_deterministic_algorithms_enabled()`.
  - `cuda_initialized` (bool): `torch.cuda.is_initialized()`.
  - `sync_debug_mode` (int): `torch.cuda.get_sync_debug_mode()` (0 off, 1 warn, 2 error); read only when
    CUDA is already initialised, else None.
- `objects` (list of dict): one entry per audited variable, each with `kind` and `name`, in namespace order.
  - kind "module" (`torch.nn.Module`): `class`, `param_count` (elements, lazy parameters not counted),
    `devices` (sorted device strings of parameters and buffers, e.g. ["cpu", "cuda:0", "meta"]), `dtypes`
    (sorted parameter dtypes, e.g. ["float32"]), `has_conv`, `has_rnn`, `has_batchnorm` (bool), `part_of`
    (name of another audited module that contains this one or is the same object, else None).
  - kind "tensor" (`torch.Tensor`, at least 1 MiB unless named in `names`): `device`, `dtype`, `shape`
    (list of int), `nbytes`. When the last exception is a device-mismatch error (`jupyter_gpu.torch_errors.mismatch`),
    tensors under 1 MiB on either device it names are listed too (at most 64), each with `small` (True): they
    are there to explain that error, and other rules leave them out. The key is absent on every other tensor.
  - kind "optimizer" (`torch.optim.Optimizer`): `class`, `param_devices` (sorted), `state_devices` (sorted;
    0-dim state such as Adam's `step`, which PyTorch keeps on the CPU by design, is left out).
  - kind "dataloader" (`torch.utils.data.DataLoader`): the keys `jupyter_gpu.facts.loader.loader_facts`
    lists (batch size, workers, start method, dataset class and length, prefetch, one sample's bytes, CUDA state,
    CUDA tensors and large Python containers in the dataset), read without iterating the loader.
  - kind "grad_scaler" (`torch.amp.GradScaler` / `torch.cuda.amp.GradScaler`: AMP in use): `class`, `enabled`.
- `missing_names` (list of str): names requested in `names` that are not in the namespace.
- `unsupported_names` (list of str): names requested in `names` whose value is not a kind audited here.
- `unreadable` (list of {"name", "error"}): variables whose reading raised ("Type: message").
- `last_exception` (dict | None): `type` (qualified name, e.g. "torch.OutOfMemoryError"), `message`
  (`str(e)`, at most 4000 characters), `chain` (["Type: message", ...] following `__cause__`, else
  `__context__` unless suppressed, at most 10 links).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from jupyter_gpu.facts.errors import describe_error, error_message, qualified_name
from jupyter_gpu.facts.loader import loader_facts
from jupyter_gpu.kernel_torch import loaded_torch
from jupyter_gpu.torch_errors.mismatch import DeviceMismatch, find_device_mismatch

MIB = 1024 * 1024
MAX_CHAIN = 10
MAX_SMALL_TENSORS = 64  # enough to name the culprits of a device mismatch, few enough to keep a snapshot small
IPYTHON_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython"})


def gather_notebook_facts(
    user_ns: dict[str, object],
    *,
    names: list[str] | None = None,
    last_exception: BaseException | None = None,
) -> dict:
    """Read the namespace and torch's settings into the JSON-able dict described in the module docstring."""
    torch = loaded_torch()
    names = list(dict.fromkeys(names)) if names is not None else None
    facts: dict[str, Any] = {
        "torch_imported": torch is not None,
        "flags": None,
        "objects": [],
        "missing_names": [n for n in names if n not in user_ns] if names is not None else [],
        "unsupported_names": [],
        "unreadable": [],
        "last_exception": _exception_facts(last_exception) if last_exception is not None else None,
    }
    if torch is None:
        return facts
    facts["flags"] = _flags(torch)
    if names is None:
        items = [(n, v) for n, v in list(user_ns.items()) if not n.startswith("_") and n not in IPYTHON_NAMES]
    else:
        items = [(n, user_ns[n]) for n in names if n in user_ns]
    explicit = set(names or ())
    types = _torch_types(torch)
    small_tensors = _SmallTensors(_mismatch_of(facts["last_exception"]))
    for name, value in items:
        try:
            entry = _read_object(types, name, value, explicit=name in explicit, small=small_tensors)
        except Exception as exc:  # a user object's property may raise anything; report it, keep auditing
            facts["unreadable"].append({"name": name, "error": describe_error(exc)})
            continue
        if entry is not None:
            facts["objects"].append(entry)
        elif name in explicit:  # a named tensor is always reported, so None here means an unknown kind
            facts["unsupported_names"].append(name)
    _mark_submodules(facts["objects"], dict(items))
    return facts


def _mismatch_of(exception: dict | None) -> DeviceMismatch | None:
    if exception is None:
        return None
    return find_device_mismatch("\n".join([exception["message"], *exception["chain"]]))


class _SmallTensors:
    """Which tensors under 1 MiB to keep: those on a device the last device-mismatch error names, up to a cap."""

    def __init__(self, mismatch: DeviceMismatch | None) -> None:
        self.mismatch = mismatch
        self.kept = 0

    def keep(self, device: str) -> bool:
        if self.mismatch is None or self.kept >= MAX_SMALL_TENSORS or not self.mismatch.involves(device):
            return False
        self.kept += 1
        return True


def _read(getter: Callable[[], Any]) -> Any:
    """One narrow read: a setting this torch lacks is None."""
    try:
        return getter()
    except (AttributeError, RuntimeError):
        return None


def _flags(torch: Any) -> dict[str, Any]:
    flags = {
        "float32_matmul_precision": _read(lambda: torch.get_float32_matmul_precision()),
        "matmul_allow_tf32": _read(lambda: bool(torch.backends.cuda.matmul.allow_tf32)),
        "matmul_fp32_precision": _read(lambda: str(torch.backends.cuda.matmul.fp32_precision)),
        "cudnn_allow_tf32": _read(lambda: bool(torch.backends.cudnn.allow_tf32)),
        "cudnn_enabled": _read(lambda: bool(torch.backends.cudnn.enabled)),
        "cudnn_benchmark": _read(lambda: bool(torch.backends.cudnn.benchmark)),
        "cudnn_deterministic": _read(lambda: bool(torch.backends.cudnn.deterministic)),
        "anomaly_enabled": _read(lambda: bool(torch.is_anomaly_enabled())),
        "deterministic_algorithms": _read(lambda: bool(torch.are_deterministic_algorithms_enabled())),
        "cuda_initialized": _read(lambda: bool(torch.cuda.is_initialized())),
        "sync_debug_mode": None,
    }
    if flags["cuda_initialized"]:  # only now is this read free of side effects (_lazy_init returns at once)
        flags["sync_debug_mode"] = _read(lambda: int(torch.cuda.get_sync_debug_mode()))
    return flags


def _torch_types(torch: Any) -> dict[str, Any]:
    """The classes audited here, looked up on the already-imported torch; ones it lacks are left out."""

    def classes(*paths: str) -> tuple[type, ...]:
        found = []
        for path in paths:
            obj: Any = torch
            for part in path.split("."):
                obj = getattr(obj, part, None)
            if isinstance(obj, type):
                found.append(obj)
        return tuple(found)

    nn_names = dir(getattr(torch, "nn", None))
    return {
        "module": classes("nn.Module"),
        "tensor": classes("Tensor"),
        "optimizer": classes("optim.Optimizer"),
        "dataloader": classes("utils.data.DataLoader"),
        "tensor_dataset": classes("utils.data.TensorDataset"),
        "subset": classes("utils.data.Subset"),
        "grad_scaler": classes("amp.GradScaler", "cuda.amp.GradScaler"),
        "conv": classes(*(f"nn.{n}" for n in nn_names if n.startswith(("Conv", "LazyConv")))),
        "rnn": classes("nn.RNNBase", "nn.RNNCellBase"),
        "batchnorm": classes(*(f"nn.{n}" for n in nn_names if "BatchNorm" in n)),
        "is_lazy": getattr(getattr(getattr(torch, "nn", None), "parameter", None), "is_lazy", None),
    }


def _read_object(
    types: dict[str, Any], name: str, value: object, *, explicit: bool, small: _SmallTensors
) -> dict | None:
    def isa(kind: str) -> bool:
        return bool(types[kind]) and isinstance(value, types[kind])

    if isa("module"):
        return _module(name, value, types)
    if isa("tensor"):
        return _tensor(name, value, explicit=explicit, small=small)
    if isa("optimizer"):
        return _optimizer(name, value, types["tensor"])
    if isa("dataloader"):
        return loader_facts(name, value, types)
    if isa("grad_scaler"):
        enabled = bool(value.is_enabled())  # type: ignore[attr-defined]
        return {"kind": "grad_scaler", "name": name, "class": qualified_name(type(value)), "enabled": enabled}
    return None


def _dtype(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _module(name: str, module: Any, types: dict[str, Any]) -> dict:
    is_lazy = types["is_lazy"] or (lambda p: False)
    params = list(module.parameters())
    tensors = params + list(module.buffers())
    submodules = list(module.modules())
    entry: dict[str, Any] = {
        "kind": "module",
        "name": name,
        "class": type(module).__qualname__,
        "param_count": sum(p.numel() for p in params if not is_lazy(p)),
        "devices": sorted({str(t.device) for t in tensors}),
        "dtypes": sorted({_dtype(p.dtype) for p in params}),
        "part_of": None,
    }
    for kind in ("conv", "rnn", "batchnorm"):
        entry[f"has_{kind}"] = bool(types[kind]) and any(isinstance(m, types[kind]) for m in submodules)
    return entry


def _tensor(name: str, tensor: Any, *, explicit: bool, small: _SmallTensors) -> dict | None:
    nbytes = tensor.numel() * tensor.element_size()
    device = str(tensor.device)
    kept_small = nbytes < MIB and not explicit
    if kept_small and not small.keep(device):
        return None
    entry = {
        "kind": "tensor",
        "name": name,
        "device": device,
        "dtype": _dtype(tensor.dtype),
        "shape": [int(s) for s in tensor.shape],
        "nbytes": int(nbytes),
    }
    if kept_small:
        entry["small"] = True
    return entry


def _optimizer(name: str, optimizer: Any, tensor_types: tuple[type, ...]) -> dict:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = [v for per_param in optimizer.state.values() for v in per_param.values()]
    return {
        "kind": "optimizer",
        "name": name,
        "class": type(optimizer).__qualname__,
        "param_devices": sorted({str(p.device) for p in params}),
        "state_devices": sorted(
            {str(v.device) for v in state if isinstance(v, tensor_types) and v.dim() > 0}
        ),
    }


def _mark_submodules(objects: list[dict], values: dict[str, object]) -> None:
    """Set `part_of` so that rules report a model once, not again for each layer bound to its own name."""
    modules = [o for o in objects if o["kind"] == "module"]
    live = [values[m["name"]] for m in modules]
    inside = [{id(sub) for sub in obj.modules()} for obj in live]  # type: ignore[attr-defined]
    for i, entry in enumerate(modules):
        for j, other in enumerate(modules):
            same = live[i] is live[j]
            if i != j and other["part_of"] is None and id(live[i]) in inside[j] and (not same or j < i):
                entry["part_of"] = other["name"]
                break


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen = {id(exc)}
    link = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    while link is not None and id(link) not in seen and len(seen) <= MAX_CHAIN:
        seen.add(id(link))
        yield link
        link = link.__cause__ or (None if link.__suppress_context__ else link.__context__)


def _exception_facts(exc: BaseException) -> dict:
    return {
        "type": qualified_name(type(exc)),
        "message": error_message(exc),
        "chain": [describe_error(link) for link in _chain(exc)],
    }
