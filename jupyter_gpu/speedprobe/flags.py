"""The process-wide switches `%speedprobe` turns (TF32, cudnn.benchmark), read and put back exactly.

torch 2.9 added per-backend `fp32_precision` settings beside the old `allow_tf32` booleans, and reading an old
one after the new API was used raises ("you have used mix of the legacy and new APIs"). So where the new
settings exist only they are read, set and restored (they carry the old flags' state too: setting
`matmul.fp32_precision` back to "none" gives back `allow_tf32` and the float32 matmul precision as they were);
on an older torch the old flags are. Nothing here initialises CUDA: these are host-side settings.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

# (path under torch.backends, attribute) of the new-style settings; the generic ones come first on restore,
# because setting a parent after its children would overwrite them.
# torch.set_float32_matmul_precision (which a step may call) sets mkldnn.matmul's as well as cuda.matmul's.
_PRECISION_SETTINGS = tuple((path, "fp32_precision") for path in (
    "", "cuda.matmul", "cudnn", "cudnn.conv", "cudnn.rnn", "mkldnn", "mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn"))
_CUDNN_SWITCHES = ("benchmark", "deterministic", "enabled")
_UNREADABLE = object()


def _backend(torch: Any, path: str) -> Any:
    owner = torch.backends
    for part in filter(None, path.split(".")):
        owner = getattr(owner, part)
    return owner


def new_precision_api(torch: Any) -> bool:
    return hasattr(torch.backends.cuda.matmul, "fp32_precision")


def tf32_enabled(torch: Any) -> bool:
    """Whether matmuls and cuDNN convolutions may already use TF32."""
    if new_precision_api(torch):
        return (torch.backends.cuda.matmul.fp32_precision == "tf32"
                and torch.backends.cudnn.conv.fp32_precision == "tf32")
    return bool(torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32)


def enable_tf32(torch: Any) -> None:
    if new_precision_api(torch):
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "tf32"
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def conv_tf32_line(torch: Any) -> str | None:
    """The line that turns TF32 on for cuDNN convolutions, or None when it already is (the default)."""
    if new_precision_api(torch):
        on = torch.backends.cudnn.conv.fp32_precision == "tf32"
        return None if on else 'torch.backends.cudnn.conv.fp32_precision = "tf32"'
    return None if torch.backends.cudnn.allow_tf32 else "torch.backends.cudnn.allow_tf32 = True"


@dataclass(frozen=True)
class GlobalFlags:
    """The values of the switches; `restore()` sets each one back."""

    precision: tuple[tuple[str, str, Any], ...]   # (backend path, attribute, value)
    cudnn: tuple[tuple[str, Any], ...]
    # autograd's anomaly detection (on, and checking NaN): a profiled cell that turns it on for debugging leaves it on
    # for every later cell, each step slowed by its tracebacks.
    anomaly: tuple[bool, bool] = (False, True)

    @classmethod
    def take(cls, torch: Any) -> GlobalFlags:
        # float32_matmul_precision is state of its own beside the new settings; set first on restore, since
        # setting it rewrites the matmul settings, which are then set back one by one.
        precision: list[tuple[str, str, Any]] = []
        # Unreadable once the new API set TF32 on; the settings below carry it then.
        with contextlib.suppress(RuntimeError):
            precision.append(("", "float32_matmul_precision", torch.get_float32_matmul_precision()))
        if new_precision_api(torch):
            settings = [(path, name) for path, name in _PRECISION_SETTINGS if hasattr(_backend(torch, path), name)]
            precision += [(path, name, getattr(_backend(torch, path), name)) for path, name in settings]
        else:
            precision += [("cuda.matmul", "allow_tf32", torch.backends.cuda.matmul.allow_tf32),
                          ("cudnn", "allow_tf32", torch.backends.cudnn.allow_tf32)]
        cudnn = tuple((name, getattr(torch.backends.cudnn, name)) for name in _CUDNN_SWITCHES)
        return cls(tuple(precision), cudnn, (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()))

    def restore(self, torch: Any) -> None:
        for path, name, value in self.precision:
            if name == "float32_matmul_precision":
                torch.set_float32_matmul_precision(value)
            else:
                setattr(_backend(torch, path), name, value)
        for name, value in self.cudnn:
            setattr(torch.backends.cudnn, name, value)
        if (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()) != self.anomaly:
            torch.autograd.set_detect_anomaly(*self.anomaly)  # only when changed: turning it on warns each time

    def differences(self, torch: Any) -> list[str]:
        """The switches whose value now differs from the one taken (empty when all are back)."""
        now = GlobalFlags.take(torch)
        current = {(path, name): value for path, name, value in now.precision}
        changed = [f"{path + '.' if path else ''}{name}" for path, name, value in self.precision
                   if current.get((path, name), _UNREADABLE) != value]
        changed += [f"cudnn.{name}" for (name, value), (_, current_value) in zip(self.cudnn, now.cudnn, strict=True)
                    if value != current_value]
        changed += ["autograd anomaly detection"] if self.anomaly != now.anomaly else []
        return changed
