"""What decides how training can be launched from this process: CUDA already started, start methods, the
notebook's own functions, and models wrapped in `nn.DataParallel`.

Probe layer, read in the kernel itself without touching CUDA: `torch.cuda.is_initialized()` only asks whether a
context exists (it creates none), and torch is read only if the notebook imported it.
"""

from __future__ import annotations

import inspect
import multiprocessing
import sys
from collections.abc import Mapping
from typing import Any

from jupyter_gpu.facts.notebook import IPYTHON_NAMES
from jupyter_gpu.kernel_torch import cuda_initialized, loaded_torch

MAX_LISTED = 20  # names listed per kind: enough to recognise one's own code, few enough to read


def _main_file() -> str | None:
    return getattr(sys.modules.get("__main__"), "__file__", None)


def _defined_in(value: Any) -> str | None:
    """The file a function's code (or a class's first method) was compiled from; None when it has none."""
    code = getattr(value, "__code__", None)
    if code is None and inspect.isclass(value):
        code = next((f.__code__ for f in vars(value).values() if inspect.isfunction(f)), None)
    return code.co_filename if code is not None else None


def notebook_functions(user_ns: Mapping[str, Any]) -> list[str]:
    """Functions and classes of `__main__` that a spawned child cannot import.

    A spawned child re-imports `__main__` from its file, and in a kernel that file (ipykernel_launcher) does not
    define what the cells did: unpickling fails there with "Can't get attribute 'train' on <module '__main__'>".
    """
    main_file = _main_file()
    names = []
    for name, value in list(user_ns.items()):
        if name.startswith("_") or name in IPYTHON_NAMES:
            continue
        if not (inspect.isfunction(value) or inspect.isclass(value)) or value.__module__ != "__main__":
            continue
        source = _defined_in(value)
        if main_file is None or source != main_file:
            names.append(name)
    # Functions first: `train` is what a fix line should name, not the model class it uses.
    names.sort(key=lambda name: inspect.isclass(user_ns[name]))
    return names[:MAX_LISTED]


def data_parallel_models(user_ns: Mapping[str, Any], torch: Any) -> list[dict[str, Any]]:
    """Notebook variables holding an `nn.DataParallel`, with the GPUs it drives."""
    if torch is None:
        return []
    wrapper = getattr(getattr(torch, "nn", None), "DataParallel", None)
    if wrapper is None:
        return []
    found = []
    for name, value in list(user_ns.items()):
        if name.startswith("_") or name in IPYTHON_NAMES or not isinstance(value, wrapper):
            continue
        found.append({"name": name, "module": type(value.module).__qualname__,
                      "device_ids": [int(i) for i in (value.device_ids or [])]})
    return found[:MAX_LISTED]


def gather_launch_facts(user_ns: Mapping[str, Any] | None) -> dict[str, Any]:
    """`user_ns` is the notebook's namespace, or None outside a kernel (the command line)."""
    torch = loaded_torch()
    return {
        "in_kernel": user_ns is not None,
        "platform": sys.platform,
        "start_methods": multiprocessing.get_all_start_methods(),
        "torch_loaded": torch is not None,
        "cuda_initialized": cuda_initialized(torch),
        "notebook_functions": notebook_functions(user_ns) if user_ns is not None else [],
        "data_parallel": data_parallel_models(user_ns, torch) if user_ns is not None else [],
    }
