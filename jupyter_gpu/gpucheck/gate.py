"""`require_gpu()`: a one-line safety gate for the top of a training script."""

from __future__ import annotations

from typing import Any

from jupyter_gpu.gpucheck.report import GpuCheckReport
from jupyter_gpu.gpucheck.request import CheckRequest


class GpuUnavailableError(RuntimeError):
    """Raised by `require_gpu()`; its message is the full diagnosis, `.report` the structured one."""

    def __init__(self, report: GpuCheckReport) -> None:
        super().__init__(str(report))
        self.report = report


def require_gpu(*, strict: bool = False, root: str | None = None) -> Any:
    """Return the `torch.device` to train on, or raise `GpuUnavailableError` explaining why there is none.

    strict: also refuse to run when a warning-level finding is present (e.g. another process holds
    most of the GPU memory).
    """
    from jupyter_gpu.gpucheck.run import run_check

    report = run_check(CheckRequest(root=root))
    if not report.gpu_usable or report.status == "fail" or (strict and report.status == "warn"):
        raise GpuUnavailableError(report)
    import torch  # only reached when the probe proved torch imports and sees a GPU

    return torch.device(report.devices[0].label)
