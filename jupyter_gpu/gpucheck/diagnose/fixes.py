"""Fix texts shared by several rules: the computed pip command and the restart reminder."""

from __future__ import annotations

from jupyter_gpu.gpucheck.diagnose.view import FactsView
from jupyter_gpu.gpucheck.diagnose.wheels import InstallAdvice, recommend_install

RESTART = "Then restart the kernel (Kernel → Restart Kernel) so the new torch is the one imported."


def install_advice(view: FactsView, *, keep_version: bool = True) -> InstallAdvice:
    """The right wheel for this driver and these GPUs (catalogue §5.3)."""
    ccs = [d.capability for d in view.visible_nvml_devices() if d.capability]
    if not ccs:
        ccs = [tuple(d["capability"]) for d in view.torch_devices if d.get("capability")]  # type: ignore[misc]
    rocm = bool(view.amd_pci) and not view.nvidia_present
    return recommend_install(
        driver_cuda=view.cuda_driver_version,
        gpu_ccs=ccs,
        installed_torch=view.torch_version if keep_version and view.torch_installed else None,
        with_torchvision=bool(view.install.get("torchvision")),
        with_torchaudio=bool(view.install.get("torchaudio")),
        rocm=rocm,
    )


def pip_fix_lines(view: FactsView, *, keep_version: bool = True) -> list[str]:
    advice = install_advice(view, keep_version=keep_version)
    lines: list[str] = []
    if advice.pip_command:
        lines.append(advice.pip_command)
        lines.append(RESTART)
    if advice.driver_alternative:
        lines.append(advice.driver_alternative)
    if view.install.get("conda_builds"):
        lines.append('conda users: conda install -c conda-forge "pytorch=*=cuda*"')
    return lines


def advice_evidence(view: FactsView) -> dict[str, object]:
    advice = install_advice(view)
    return {"recommended_wheel": advice.suffix, "why": advice.reason}
