"""Fix texts shared by several rules: the computed pip command and the restart reminder."""

from __future__ import annotations

from jupyter_gpu.gpucheck.diagnose.view import FactsView
from jupyter_gpu.gpucheck.diagnose.wheels import (
    JETPACK_OF_L4T_MAJOR,
    InstallAdvice,
    JetsonFit,
    jetson_build_fit,
    l4t_major_of_kernel,
    recommend_install,
)

RESTART = "Then restart the kernel (Kernel → Restart Kernel) so the new torch is the one imported."


def jetson_l4t(view: FactsView) -> str | None:
    """The L4T release whose JetPack torch must match: /etc/nv_tegra_release's, unless the kernel (the host's, even
    in a container) is another JetPack's: then the host's L4T major ("36"), since the image's file cannot say which
    release the host runs."""
    l4t = (view.jetson or {}).get("l4t")
    host_major = l4t_major_of_kernel(view.hosting.get("kernel_release"))
    image_jetpack = JETPACK_OF_L4T_MAJOR.get((l4t or "").split(".")[0])
    if host_major and image_jetpack and image_jetpack != JETPACK_OF_L4T_MAJOR[host_major]:
        return host_major
    return l4t


def jetson_fit(view: FactsView) -> JetsonFit | None:
    """Whether torch is built for the JetPack this Jetson runs (wheels.jetson_build_fit); None off a Jetson or
    without torch."""
    if not view.jetson or not view.torch_installed:
        return None
    return jetson_build_fit(l4t=jetson_l4t(view), torch_version=view.torch_version, torch_cuda=view.torch_cuda,
                            arch_flags=view.arch_flags, import_error=view.torch_import_error,
                            cpu_only=view.cpu_only_build)


def torch_not_for_this_jetson(view: FactsView) -> bool:
    """A Jetson whose torch is a build for another platform or JetPack: what follows from it (a driver "too old" for
    its CUDA, a library it cannot load) is host_rules.jetson_torch's to say, since L4T's driver moves only with
    JetPack."""
    fit = jetson_fit(view)
    return fit is not None and fit.fits is False


def install_advice(view: FactsView, *, keep_version: bool = True) -> InstallAdvice:
    """The right wheel for this driver and these GPUs (catalogue §5.3); on a Jetson, NVIDIA's for its JetPack."""
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
        jetson=bool(view.jetson),
        l4t=jetson_l4t(view) if view.jetson else None,
    )


def pip_fix_lines(view: FactsView, *, keep_version: bool = True) -> list[str]:
    advice = install_advice(view, keep_version=keep_version)
    lines: list[str] = []
    if advice.pip_command:
        lines.append(advice.pip_command)
        lines.append(RESTART)
    if advice.driver_alternative:
        lines.append(advice.driver_alternative)
    lines.extend(advice.notes)
    # conda-forge's aarch64 CUDA build has no Jetson GPU code (conda-forge/pytorch-cpu-feedstock#303).
    if view.install.get("conda_builds") and not view.jetson:
        lines.append('conda users: conda install -c conda-forge "pytorch=*=cuda*"')
    return lines


def advice_evidence(view: FactsView) -> dict[str, object]:
    advice = install_advice(view)
    return {"recommended_wheel": advice.suffix, "why": advice.reason}
