"""Layer 2 of the catalogue: is a GPU on this machine, is the driver loaded and reachable (§3 B, D10, D11, E1)."""

from __future__ import annotations

import re

from jupyter_gpu.gpucheck.diagnose.fixes import RESTART, pip_fix_lines
from jupyter_gpu.gpucheck.diagnose.view import FactsView
from jupyter_gpu.models import LAYER_HOST, Finding

LOGIN_HOSTNAME = re.compile(r"(^|[-_.])login", re.I)
NVML_DRIVER_NOT_LOADED = 9
NVML_NO_PERMISSION = 4
NVML_OPERATING_SYSTEM = 17
NVML_GPU_IS_LOST = 15
NVML_VERSION_MISMATCH = 18


CONTAINER_TOOLKIT_GUIDE = (
    "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html"
)
# The NVIDIA container runtime injects no GPU when NVIDIA_VISIBLE_DEVICES is one of these (its contract).
NO_GPU_REQUESTED = ("void", "none", "")
_TOOLKIT_ON_HOST = [
    "On the host: add NVIDIA's libnvidia-container apt or yum repository (https://nvidia.github.io/libnvidia-container).",
    "sudo apt-get install -y nvidia-container-toolkit   # dnf/yum: sudo dnf install -y nvidia-container-toolkit",
]
_DOCKER = [
    "sudo nvidia-ctk runtime configure --runtime=docker",
    "sudo systemctl restart docker",
    "docker run --rm --gpus all ubuntu nvidia-smi   # smoke test on the host: it must list the GPU",
    "docker run --gpus all ...   # then start this container again with the GPU",
]
_PODMAN = [
    "sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml   # Podman finds GPUs through CDI",
    "podman run --rm --device nvidia.com/gpu=all ubuntu nvidia-smi   # smoke test on the host",
    "podman run --device nvidia.com/gpu=all ...   # then start this container again with the GPU",
]
_KUBERNETES = [
    "Kubernetes: the cluster needs the NVIDIA GPU Operator (or the NVIDIA device plugin) on its GPU nodes.",
    "Kubernetes: give this container resources.limits: {nvidia.com/gpu: 1} in the pod spec, then recreate the pod.",
]


def _container_gpu_fix(hosting: dict, nvidia_visible_devices: str | None) -> list[str]:
    """Host set-up and run flags for every engine, the one the facts show first."""
    docker, podman = [*_TOOLKIT_ON_HOST, *_DOCKER], [*_TOOLKIT_ON_HOST, *_PODMAN]
    if hosting.get("kubernetes"):
        lines = [*_KUBERNETES, *docker, *_PODMAN]
    elif hosting.get("podman"):
        lines = [*podman, *_DOCKER, *_KUBERNETES]
    else:
        lines = [*docker, *_PODMAN, *_KUBERNETES]
    if nvidia_visible_devices is not None and nvidia_visible_devices.strip().lower() in NO_GPU_REQUESTED:
        shown = nvidia_visible_devices or '""'
        why = (f"NVIDIA_VISIBLE_DEVICES={shown} here: this pod requests no GPU (the resources.limits line fixes it)."
               if hosting.get("kubernetes") else
               f"NVIDIA_VISIBLE_DEVICES={shown} asks the NVIDIA runtime for no GPU: unset it (or set it to all) "
               "where the container is started.")
        lines.insert(0, why)
    return lines


def _cpu_note(view: FactsView) -> str:
    return f" (and torch {view.torch_version} is a CPU-only build)" if view.cpu_only_build else ""


def no_gpu(view: FactsView) -> list[Finding]:
    """No GPU reaches this machine or container; pick the most specific reason."""
    if view.nvidia_present or view.amd_pci or view.platform.get("system") == "Darwin":
        return []
    hosting = view.hosting
    wsl_gpu = "/dev/dxg" in view.device_nodes
    if wsl_gpu:
        return []
    evidence = {
        "pci_gpus": [f"{g['vendor']} {g['device_id']} at {g['address']}" for g in view.system.get("pci_gpus") or []]
        or "none",
        "/dev/nvidia*": view.nvidia_gpu_nodes or "none",
        "/proc/driver/nvidia/version": "present" if view.driver.get("proc_version_text") else "absent",
        "nvml": view.nvml.get("error") or view.nvml.get("status"),
    }
    cpu_note = _cpu_note(view)
    if hosting.get("colab") or hosting.get("kaggle"):
        where = "Colab" if hosting.get("colab") else "Kaggle"
        fix = (["Runtime → Change runtime type → Hardware accelerator: GPU, then run the notebook again."]
               if hosting.get("colab") else ["Settings → Accelerator → GPU, then run the notebook again."])
        return [Finding("NOTEBOOK_PLATFORM_NO_ACCELERATOR", "fail",
                        f"This {where} session has no GPU attached{cpu_note}.", evidence=evidence, fix=fix,
                        refs=["googlecolab/colabtools#930"], layer=LAYER_HOST)]
    nvidia_devices = view.env.get("NVIDIA_VISIBLE_DEVICES")
    if view.in_container:
        evidence["container"] = ", ".join(k for k in ("docker", "podman", "kubernetes", "cgroup_container")
                                          if hosting.get(k))
        if nvidia_devices is not None:
            evidence["NVIDIA_VISIBLE_DEVICES"] = nvidia_devices
        return [Finding(
            "CONTAINER_NO_GPU", "fail",
            f"This container was started without access to a GPU{cpu_note}.", evidence=evidence,
            fix=_container_gpu_fix(hosting, nvidia_devices),
            refs=["NVIDIA/nvidia-docker#1243", "jupyter/docker-stacks#2166", CONTAINER_TOOLKIT_GUIDE],
            layer=LAYER_HOST)]
    hostname = hosting.get("hostname") or ""
    if hosting.get("slurm_cluster") and not hosting.get("slurm_job"):
        evidence.update(hostname=hostname or None, SLURM_JOB_ID="unset")
        return [Finding(
            "HPC_LOGIN_NODE", "fail",
            f"Jupyter is running on a cluster node without a GPU allocation{cpu_note} "
            "(no SLURM_JOB_ID: probably a login node).", evidence=evidence,
            fix=["srun --gres=gpu:1 --pty jupyter lab --no-browser --ip=0.0.0.0   "
                 "(or pick a GPU profile in JupyterHub)"], layer=LAYER_HOST)]
    fix = ["Run this notebook on a machine or cloud instance with an NVIDIA GPU."]
    if hosting.get("wsl"):
        fix = ["WSL: install or update the NVIDIA driver on Windows (not inside WSL), then `wsl --shutdown`."]
    elif LOGIN_HOSTNAME.search(hostname):
        fix.append("This looks like a login node: start Jupyter inside a GPU job.")
    if view.cpu_only_build:
        fix += ["There, install a CUDA build of torch:", *pip_fix_lines(view)]
    return [Finding("NO_NVIDIA_GPU", "fail", f"No NVIDIA GPU is visible on this machine{cpu_note}.",
                    evidence=evidence, fix=fix, layer=LAYER_HOST)]


def driver_not_loaded(view: FactsView) -> list[Finding]:
    code = view.nvml_error_code
    if view.hosting.get("wsl"):
        return []
    if not (code == NVML_DRIVER_NOT_LOADED or (view.nvidia_pci and not view.driver.get("proc_version_text"))):
        return []
    bound = sorted({g.get("bound_driver") or "none" for g in view.nvidia_pci})
    return [Finding(
        "DRIVER_NOT_LOADED", "fail",
        "An NVIDIA GPU is installed but the NVIDIA kernel driver is not loaded.",
        evidence={"pci_gpus": [g["address"] for g in view.nvidia_pci], "bound_driver": bound,
                  "/proc/driver/nvidia/version": "absent" if not view.driver.get("proc_version_text") else "present",
                  "nvml": view.nvml.get("error")},
        fix=["sudo modprobe nvidia   # 'Key was rejected by service' means Secure Boot: enrol the MOK key "
             "or disable Secure Boot",
             "sudo dkms autoinstall   # rebuild the module for the running kernel, then reboot",
             *(["Blacklist nouveau, which holds the GPU: echo 'blacklist nouveau' | sudo tee "
                "/etc/modprobe.d/blacklist-nouveau.conf && sudo update-initramfs -u"] if "nouveau" in bound else [])],
        refs=["canonical/nvidia-graphics-drivers#62"], layer=LAYER_HOST)]


def _library_versions(view: FactsView, name: str) -> dict[str, str]:
    found = {}
    for lib in (view.driver.get("libraries") or {}).get(name) or []:
        resolved = lib.get("resolved") or ""
        match = re.search(r"\.so\.(\d+\.\d+(?:\.\d+)?)$", resolved)
        if match and "/wsl/" not in resolved:
            found[lib["path"]] = match.group(1)
    return found


def driver_library_mismatch(view: FactsView) -> list[Finding]:
    module = view.driver.get("kernel_module_version")
    libs = _library_versions(view, "libnvidia-ml.so.1") | _library_versions(view, "libcuda.so.1")
    differing = {p: v for p, v in libs.items() if module and v != module}
    by_code = view.nvml_error_code == NVML_VERSION_MISMATCH or view.cuda_error_number() == 803
    if not (by_code or differing):
        return []
    return [Finding(
        "DRIVER_LIBRARY_MISMATCH", "fail",
        "The NVIDIA driver libraries were updated but the old kernel module is still loaded"
        + (f" (module {module}, libraries {', '.join(sorted(set(differing.values())))})." if differing else "."),
        evidence={"kernel_module_version": module, "libraries": libs or None, "nvml": view.nvml.get("error"),
                  "torch": view.message_containing("Error 803")},
        fix=["sudo reboot", "or without a reboot: sudo rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia && "
             "sudo modprobe nvidia", "Pin the driver packages so unattended upgrades cannot do this again."],
        refs=["lyulyul/shine-cluster#30", "mozilla/translations#1167"], layer=LAYER_HOST)]


def uvm_missing(view: FactsView) -> list[Finding]:
    nodes = view.device_nodes
    missing_node = bool(view.nvidia_gpu_nodes) and "/dev/nvidia-uvm" not in nodes and not view.hosting.get("wsl")
    message = view.message_containing("CUDA unknown error")
    if not (missing_node or message or view.cuda_error_number() == 999):
        return []
    return [Finding(
        "NVIDIA_UVM_MISSING", "fail",
        "CUDA cannot start: the nvidia_uvm module or its /dev/nvidia-uvm device is missing or broken "
        "(typical after suspend/resume).",
        evidence={"/dev/nvidia-uvm": "present" if "/dev/nvidia-uvm" in nodes else "absent",
                  "torch": message, "sys_module_nvidia_uvm": view.driver.get("sys_module_nvidia_uvm")},
        fix=["sudo nvidia-modprobe -c 0 -u", "or: sudo modprobe -r nvidia_uvm && sudo modprobe nvidia_uvm",
             "Then restart the kernel."],
        refs=["pytorch#88639", "pytorch#49081"], layer=LAYER_HOST)]


def permission_denied(view: FactsView) -> list[Finding]:
    denied = [p for p, ok in view.device_nodes.items() if not ok and p.startswith("/dev/nvidia")]
    code = view.nvml_error_code
    if not denied and code not in (NVML_NO_PERMISSION, NVML_OPERATING_SYSTEM):
        return []
    return [Finding(
        "DEVICE_PERMISSION_DENIED", "fail",
        "The NVIDIA device files exist but this user may not open them.",
        evidence={"denied": denied or None, "nvml": view.nvml.get("error")},
        fix=["sudo usermod -aG video $USER   # then log out and in again, and restart Jupyter",
             "In a container: pass the devices (--gpus all or --device=/dev/nvidia0 ...) instead of bind mounts."],
        layer=LAYER_HOST)]


def fabric_manager(view: FactsView) -> list[Finding]:
    if view.cuda_error_number() != 802:
        return []
    branch = (view.driver_version or "").split(".")[0] or "<driver-branch>"
    return [Finding(
        "FABRIC_MANAGER_NOT_RUNNING", "fail",
        "CUDA reports 'system not yet initialized': this NVSwitch system needs nvidia-fabricmanager running.",
        evidence={"torch": view.message_containing("Error 802"), "driver_version": view.driver_version,
                  "nvswitch": [p for p in view.device_nodes if "nvswitch" in p] or None},
        fix=[f"sudo apt install nvidia-fabricmanager-{branch} && sudo systemctl enable --now nvidia-fabricmanager",
             "Then restart the kernel."], refs=["pytorch#35710"], layer=LAYER_HOST)]


def forward_compat(view: FactsView) -> list[Finding]:
    compat_paths = [p for p in view.paths.library_search_path(view.env) if "compat" in p]
    compat_libs = [lib["resolved"] for lib in (view.driver.get("libraries") or {}).get("libcuda.so.1") or []
                   if "compat" in (lib.get("resolved") or "")]
    if view.cuda_error_number() != 804:
        return []
    return [Finding(
        "FORWARD_COMPAT_UNSUPPORTED", "fail",
        "A CUDA forward-compatibility libcuda is loaded on a GPU that does not support it (Error 804).",
        evidence={"torch": view.message_containing("Error 804"), "compat_on_LD_LIBRARY_PATH": compat_paths or None,
                  "compat_libcuda": compat_libs or None},
        fix=[f"Remove {', '.join(compat_paths) or 'the cuda-compat directory'} from LD_LIBRARY_PATH and restart "
             "the kernel", "or install a torch wheel the host driver supports:", *pip_fix_lines(view)],
        refs=["PKU-YuanGroup/Video-LLaVA#22"], layer=LAYER_HOST)]


def gpu_lost(view: FactsView) -> list[Finding]:
    lost_devices = [d["index"] for d in view.nvml.get("devices") or []
                    if any("lost" in str(e).lower() for e in (d.get("errors") or {}).values())]
    message = view.message_containing("unspecified launch failure", "GPU is lost", "fallen off the bus")
    if not (view.nvml_error_code == NVML_GPU_IS_LOST or lost_devices or message):
        return []
    return [Finding(
        "GPU_LOST_OR_XID", "fail", "A GPU stopped responding (GPU is lost / fell off the bus).",
        evidence={"nvml": view.nvml.get("error"), "lost_devices": lost_devices or None, "torch": message},
        fix=["sudo nvidia-smi -r -i <index>  or reboot the machine",
             "Look for the cause: sudo dmesg | grep -i xid", "Escalate with: sudo nvidia-bug-report.sh"],
        layer=LAYER_HOST)]


def wsl_linux_driver(view: FactsView) -> list[Finding]:
    if not view.hosting.get("wsl"):
        return []
    libs = (view.driver.get("libraries") or {}).get("libcuda.so.1") or []
    native = [lib["path"] + " → " + str(lib.get("resolved")) for lib in libs
              if not (lib.get("resolved") or "").startswith("/usr/lib/wsl/lib") and
              re.search(r"libcuda\.so\.\d+\.\d+", lib.get("resolved") or "")]
    if not native:
        return []
    return [Finding(
        "WSL_LINUX_DRIVER_INSTALLED", "fail",
        "A Linux NVIDIA driver is installed inside WSL and overrides the Windows driver's libcuda.",
        evidence={"libcuda": native, "wsl_libcuda": [lib["path"] for lib in libs if "/wsl/" in lib["path"]] or None},
        fix=["sudo apt remove --purge '^nvidia-driver-.*' 'libnvidia-compute-*'",
             "Keep /usr/lib/wsl/lib on the loader path; update the driver on Windows, then `wsl --shutdown`."],
        refs=["microsoft/WSL#9092", "microsoft/WSL#8587"], layer=LAYER_HOST)]


def rocm(view: FactsView) -> list[Finding]:
    if not view.torch_hip:
        return []
    findings = []
    nodes = view.device_nodes
    kfd = "/dev/kfd"
    if kfd not in nodes or not nodes[kfd] or view.message_containing("/dev/kfd", "Permission denied"):
        findings.append(Finding(
            "ROCM_PERMISSION", "fail",
            "This ROCm build of torch cannot open /dev/kfd" + (" (it is missing)." if kfd not in nodes else "."),
            evidence={"/dev/kfd": "absent" if kfd not in nodes else ("ok" if nodes[kfd] else "permission denied"),
                      "torch": view.message_containing("kfd")},
            fix=["sudo usermod -aG render,video $USER   # then log out and in again",
                 "Container: --device=/dev/kfd --device=/dev/dri --group-add <host render gid>"],
            refs=["debpalash/VoiceStudio#1274"], layer=LAYER_HOST))
    message = view.message_containing("invalid device function", "hipErrorInvalidDevice")
    if message:
        findings.append(Finding(
            "ROCM_UNSUPPORTED_GFX", "fail", "This AMD GPU's architecture is not in the ROCm build of torch.",
            evidence={"torch": message, "HSA_OVERRIDE_GFX_VERSION": view.env.get("HSA_OVERRIDE_GFX_VERSION")},
            fix=["%env HSA_OVERRIDE_GFX_VERSION=11.0.0   # RDNA3; 10.3.0 for RDNA2. Set before importing torch.",
                 RESTART], refs=["pytorch#164346"], layer=LAYER_HOST))
    return findings


def wrong_vendor_build(view: FactsView) -> list[Finding]:
    """A CUDA wheel on an AMD-only machine cannot use the GPU: the ROCm wheel can."""
    if not (view.amd_pci and not view.nvidia_present and view.torch_cuda and not view.torch_hip):
        return []
    return [Finding(
        "NO_NVIDIA_GPU", "fail",
        f"This machine has an AMD GPU, but torch {view.torch_version} is a CUDA (NVIDIA) build.",
        evidence={"pci_gpus": [g["address"] for g in view.amd_pci], "torch.version.cuda": view.torch_cuda},
        fix=pip_fix_lines(view), layer=LAYER_HOST)]


RULES = (no_gpu, driver_not_loaded, driver_library_mismatch, uvm_missing, permission_denied, fabric_manager,
         forward_compat, gpu_lost, wsl_linux_driver, rocm, wrong_vendor_build)
