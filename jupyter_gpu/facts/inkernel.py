"""What the kernel itself has already loaded: read, never initialised on the user's behalf."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jupyter_gpu.facts.errors import describe_error


def gather_in_kernel(modules: Mapping[str, object]) -> dict[str, Any]:
    """The torch module this process imported, and its CUDA state only if CUDA is already up.

    Calling `torch.cuda.device_count()` before the user touched CUDA would run cuInit here and
    poison every forked DataLoader worker later, so the CUDA questions wait for `is_initialized()`.
    """
    torch: Any = modules.get("torch")
    if torch is None:
        return {"torch_imported": False}
    out: dict[str, Any] = {
        "torch_imported": True,
        "version": getattr(torch, "__version__", None),
        "file": getattr(torch, "__file__", None),
    }
    cuda = getattr(torch, "cuda", None)
    try:
        out["cuda_initialized"] = bool(cuda.is_initialized()) if cuda is not None else False
    except (AttributeError, RuntimeError):
        out["cuda_initialized"] = None
    if out["cuda_initialized"]:
        try:
            count = int(cuda.device_count())
            out["device_count"] = count
            out["devices"] = [{"index": i, "name": cuda.get_device_name(i),
                               "uuid": str(getattr(cuda.get_device_properties(i), "uuid", "") or "") or None}
                              for i in range(count)]
        except (AttributeError, RuntimeError) as exc:
            out["cuda_error"] = describe_error(exc)
    return out
