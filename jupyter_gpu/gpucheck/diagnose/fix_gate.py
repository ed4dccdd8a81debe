"""One gate for every printed fix (issue 49): each kind of fix command states what must be true of the machine for it
to help, and the gate drops a fix whose precondition the evidence contradicts, whichever rule wrote it.

Rules describe situations; their fixes run on machines. A rule written for one report printed `sudo modprobe nvidia`
on a machine whose GPU was bound to vfio-pci, and a pip command from a CUDA index on a Jetson. The gate reads each fix
line, recognises the kind of command in it (FIX_KINDS), and asks each of that kind's preconditions whether the
snapshot contradicts it. Unknown never contradicts: only evidence does. A finding left without a command keeps its
headline and evidence, names the fixes withheld and why, and gains its layer's command that tells more (layers.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from jupyter_gpu.gpucheck.diagnose.layers import layer_of
from jupyter_gpu.gpucheck.diagnose.view import FactsView
from jupyter_gpu.models import Finding

WITHHELD = "not suggested here"


@dataclass(frozen=True)
class Precondition:
    needs: str  # in words, as docs/findings.md states it
    contradicted_by: Callable[[FactsView], str | None]  # the evidence against it; None: holds, or unknown


@dataclass(frozen=True)
class FixKind:
    name: str
    pattern: re.Pattern[str]  # the fix lines that are this kind of command
    preconditions: tuple[Precondition, ...]


# -- what the snapshot can say against a fix -------------------------------------------------------------------
def _system(view: FactsView) -> str:
    return str(view.platform.get("system") or "")


def _not_a_linux_host(view: FactsView) -> str | None:
    """Kernel modules, sysfs and the NVIDIA Linux driver belong to a Linux host with its own kernel."""
    system = _system(view)
    if system and system != "Linux":
        return f"this is {system}"
    if view.hosting.get("wsl"):
        return "this is WSL: the GPU's driver is Windows'"
    if view.jetson:
        return "this is a Jetson: its GPU driver (nvgpu) comes with JetPack"
    if view.docker_desktop_vm:
        return f"this is Docker Desktop's Linux VM (kernel {view.hosting.get('kernel_release')})"
    return None


def _in_container(view: FactsView) -> str | None:
    if not view.in_container:
        return None
    kinds = [k for k in ("kubernetes", "docker", "podman") if view.hosting.get(k)] or ["a container"]
    return f"this process runs in a container ({', '.join(kinds)}): the host's kernel and driver are the host's"


def _module_loaded(view: FactsView) -> str | None:
    if view.driver_loaded_on_host:
        return f"the nvidia module is loaded ({view.driver.get('kernel_module_version') or view.driver_version})"
    return None


def _module_not_loaded(view: FactsView) -> str | None:
    if view.system.get("driver") is not None and not view.driver.get("proc_version_text") and \
            view.driver.get("sys_module_nvidia") is False:
        return "the nvidia module is not loaded (no /proc/driver/nvidia/version, no /sys/module/nvidia)"
    return None


def _bound_to_another_driver(view: FactsView) -> str | None:
    """vfio-pci, pci-stub and the like hold a GPU for something else: no module load or rebuild reaches it."""
    held = [g for g in view.nvidia_pci if g.get("bound_driver") not in (None, "nvidia", "nouveau")]
    if view.nvidia_pci and len(held) == len(view.nvidia_pci):
        return "every NVIDIA GPU is bound to another driver (" + ", ".join(
            f"{g['address']}: {g['bound_driver']}" for g in held) + ")"
    return None


def _nothing_bound_to_nouveau(view: FactsView) -> str | None:
    drivers = {g.get("bound_driver") for g in view.nvidia_pci}
    if view.nvidia_pci and None not in drivers and "nouveau" not in drivers:
        return f"no GPU is bound to nouveau (bound: {', '.join(sorted(drivers))})"
    return None


def _job_without_gpu(view: FactsView) -> str | None:
    job = view.batch_job
    if job is not None and not view.job_gpu_allocation:
        return f"this is a {job[0].name} job ({job[1]}) given no GPU: only its request can add one"
    return None


def _scheduler_set_visible_devices(view: FactsView) -> str | None:
    job = view.batch_job
    if job is not None and "CUDA_VISIBLE_DEVICES" in view.env:
        return f"{job[0].name} set CUDA_VISIBLE_DEVICES for this job ({job[1]})"
    return None


def _uvm_node_present(view: FactsView) -> str | None:
    if "/dev/nvidia-uvm" in view.device_nodes:
        return "/dev/nvidia-uvm exists"
    return None


def _gpu_faulted(view: FactsView) -> str | None:
    if view.gpu_faults:
        return "NVML reports a GPU fault (" + "; ".join(
            f"GPU {i}: {message}" for i, (_, message) in sorted(view.gpu_faults.items())) + ")"
    return None


def torch_from_conda(view: FactsView) -> bool:
    """torch came from a conda package (conda-meta records it, or its .dist-info says conda installed it)."""
    if view.install.get("conda_builds") or view.install.get("conda_torch"):
        return True
    dists = view.install.get("distributions") or []
    return bool(dists) and str(dists[0].get("installer") or "").lower() in ("conda", "mamba")


def _conda_torch(view: FactsView) -> str | None:
    if torch_from_conda(view):
        return "torch here came from conda: a pip wheel would sit beside conda's and break both"
    return None


def _jetson(view: FactsView) -> str | None:
    if view.jetson:
        l4t = view.jetson.get("l4t")
        return f"this is a Jetson (L4T R{l4t or '?'}): PyPI's and download.pytorch.org's wheels do not use its GPU"
    return None


def _no_cuda_wheels_for_platform(view: FactsView) -> str | None:
    system, machine = _system(view), str(view.platform.get("machine") or "").lower()
    if system == "Darwin":
        return "this is macOS: there is no CUDA build of torch for it"
    if machine and machine not in ("x86_64", "amd64", "aarch64", "arm64"):
        return f"this machine is {machine}: download.pytorch.org has no CUDA wheel for it"
    return None


def _not_jetson(view: FactsView) -> str | None:
    if view.jetson:
        return None
    return "this is not a Jetson (no /etc/nv_tegra_release)"


def _docker_desktop(view: FactsView) -> str | None:
    if view.docker_desktop_vm:
        return "this is Docker Desktop's Linux VM: no NVIDIA Container Toolkit reaches a GPU from it"
    if _system(view) == "Darwin":
        return "this is macOS: no NVIDIA GPU can reach a container here"
    return None


def _not_wsl(view: FactsView) -> str | None:
    return None if view.hosting.get("wsl") or _system(view) == "Windows" else "this is not WSL"


def _wsl_without_gpu_bridge(view: FactsView) -> str | None:
    if view.hosting.get("wsl") and "/dev/dxg" not in view.device_nodes:
        return "WSL has no GPU bridge (/dev/dxg): no Windows driver reaches it before WSL itself supports GPUs"
    return None


def _no_shm_remount_in_container(view: FactsView) -> str | None:
    if view.in_container:
        return "this runs in a container: its /dev/shm is sized when it starts (--shm-size), not by a remount"
    return None


LINUX_HOST = Precondition("a Linux host with its own kernel (not WSL, a Jetson, macOS or Docker Desktop)",
                          _not_a_linux_host)
OUTSIDE_CONTAINER = Precondition("run outside a container, on the host itself", _in_container)
OUTSIDE_GPULESS_JOB = Precondition("not inside a scheduler's job that was given no GPU", _job_without_gpu)
PIP_CUDA_PLATFORM = (
    Precondition("not a Jetson", _jetson),
    Precondition("torch installed by pip (or not installed), not by conda", _conda_torch),
    Precondition("x86_64 or server aarch64 (SBSA) Linux, or Windows", _no_cuda_wheels_for_platform),
)

FIX_KINDS: tuple[FixKind, ...] = (
    FixKind("load the nvidia module", re.compile(r"^(?!.*rmmod).*\bmodprobe nvidia\b(?![_-])"), (
        LINUX_HOST, OUTSIDE_CONTAINER, OUTSIDE_GPULESS_JOB,
        Precondition("the nvidia module not loaded", _module_loaded),
        Precondition("a GPU bound to no driver, to nvidia or to nouveau", _bound_to_another_driver))),
    FixKind("rebuild the module (DKMS)", re.compile(r"\bdkms\b"), (
        LINUX_HOST, OUTSIDE_CONTAINER, OUTSIDE_GPULESS_JOB,
        Precondition("the nvidia module not loaded", _module_loaded),
        Precondition("a GPU bound to no driver, to nvidia or to nouveau", _bound_to_another_driver))),
    FixKind("reload the nvidia modules", re.compile(r"\brmmod\b.*\bmodprobe nvidia\b(?![_-])"), (
        LINUX_HOST, OUTSIDE_CONTAINER, Precondition("the nvidia module loaded", _module_not_loaded))),
    FixKind("blacklist nouveau", re.compile(r"blacklist nouveau"), (
        LINUX_HOST, OUTSIDE_CONTAINER, Precondition("a GPU bound to nouveau", _nothing_bound_to_nouveau))),
    FixKind("create the nvidia-uvm node", re.compile(r"\bnvidia-modprobe\b.*-u\b"), (
        LINUX_HOST, OUTSIDE_CONTAINER, Precondition("/dev/nvidia-uvm missing", _uvm_node_present))),
    FixKind("reload nvidia_uvm", re.compile(r"\bmodprobe (-r )?nvidia_uvm\b"), (
        LINUX_HOST, OUTSIDE_CONTAINER, Precondition("the nvidia module loaded", _module_not_loaded),
        Precondition("no GPU fault in NVML (a lost or faulted GPU needs a reset, not a module reload)",
                     _gpu_faulted))),
    FixKind("pip from a CUDA index", re.compile(r"\bpip3? install\b.*download\.pytorch\.org/whl/(cu|rocm)"),
            PIP_CUDA_PLATFORM),
    FixKind("a CUDA nvidia-* wheel from PyPI", re.compile(r"\bpip3? install\b.*\bnvidia-[a-z-]+-cu\d+"),
            PIP_CUDA_PLATFORM),
    FixKind("a Jetson AI Lab wheel", re.compile(r"jetson-ai-lab\.(io|dev)"), (
        Precondition("a Jetson", _not_jetson),)),
    FixKind("conda's CUDA build of torch", re.compile(r"\bconda install\b.*pytorch=\*=cuda"), (
        Precondition("not a Jetson", _jetson),)),
    FixKind("the NVIDIA Container Toolkit", re.compile(
        r"\bnvidia-ctk\b|nvidia-container-toolkit|--gpus\b|--device nvidia\.com/gpu"), (
        Precondition("a Linux or WSL 2 host with an NVIDIA GPU (not macOS, not Docker Desktop's VM on it)",
                     _docker_desktop), Precondition("not a Jetson (JetPack ships its own runtime)", _jetson))),
    FixKind("the Windows driver for WSL", re.compile(r"NVIDIA driver on Windows|driver on Windows"), (
        Precondition("WSL 2 or Windows", _not_wsl),
        Precondition("a WSL with GPU support (/dev/dxg present)", _wsl_without_gpu_bridge))),
    FixKind("WSL's own commands", re.compile(r"\bwsl (--update|--set-version|--shutdown|--version|-l)\b"), (
        Precondition("WSL 2 or Windows", _not_wsl),)),
    FixKind("unset CUDA_VISIBLE_DEVICES", re.compile(
        r"\bunset CUDA_VISIBLE_DEVICES\b|del os\.environ\[.CUDA_VISIBLE"), (
        Precondition("CUDA_VISIBLE_DEVICES not set by a job scheduler", _scheduler_set_visible_devices),)),
    # A container's or a job's user passes a reset on to the host's operator: the command is still the right one.
    FixKind("reset the GPU", re.compile(r"\bnvidia-smi (-r|--gpu-reset)\b"), (LINUX_HOST,)),
    FixKind("remount /dev/shm", re.compile(r"remount,size=.*/dev/shm"), (
        Precondition("not inside a container", _no_shm_remount_in_container),)),
    FixKind("the host's device permissions", re.compile(r"\busermod -aG\b|DeviceAllow|systemd.*device"), (
        LINUX_HOST, OUTSIDE_CONTAINER, OUTSIDE_GPULESS_JOB)),
)


@dataclass(frozen=True)
class Withheld:
    fix: str
    kind: str
    needs: str
    seen: str

    def sentence(self) -> str:
        command = self.fix.split("   #")[0].strip()
        return f"`{command}` ({self.kind}) needs {self.needs}; {self.seen}"


def kind_of(line: str) -> FixKind | None:
    for kind in FIX_KINDS:
        if kind.pattern.search(line):
            return kind
    return None


def contradiction(line: str, view: FactsView) -> Withheld | None:
    """The first precondition of this fix line's kind that the snapshot contradicts, with what it saw."""
    kind = kind_of(line)
    if kind is None:
        return None
    for precondition in kind.preconditions:
        seen = precondition.contradicted_by(view)
        if seen:
            return Withheld(line, kind.name, precondition.needs, seen)
    return None


def gate_finding(finding: Finding, view: FactsView) -> Finding:
    kept: list[str] = []
    withheld: list[Withheld] = []
    for line in finding.fix:
        against = contradiction(line, view)
        if against is None:
            kept.append(line)
        else:
            withheld.append(against)
    if not withheld:
        return finding
    evidence = {**finding.evidence, WITHHELD: [w.sentence() for w in withheld]}
    layer = layer_of(finding.code)
    if not kept and layer is not None:
        kept.append(f"No fix applies to this machine as it stands: {layer.name} is where it fails. "
                    f"To tell more: {layer.tell_more}")
    return replace(finding, evidence=evidence, fix=kept)


def gate(findings: list[Finding], view: FactsView) -> list[Finding]:
    """Every finding's fixes through the one gate: a fix the evidence contradicts is never printed."""
    return [gate_finding(finding, view) for finding in findings]
