"""Layer 2 of the catalogue: is a GPU on this machine, is the driver loaded and reachable (§3 B, D10, D11, E1)."""

from __future__ import annotations

import re

from jupyter_gpu.gpucheck.diagnose import health_rules, nvml_classes
from jupyter_gpu.gpucheck.diagnose.driver_api_rules import compat_answered
from jupyter_gpu.gpucheck.diagnose.fixes import RESTART, jetson_fit, jetson_l4t, pip_fix_lines
from jupyter_gpu.gpucheck.diagnose.view import FactsView
from jupyter_gpu.gpucheck.diagnose.wheels import JETSON_PYTORCH_GUIDE, jetpack_name, missing_library_need
from jupyter_gpu.models import LAYER_HARDWARE, LAYER_HOST, Finding
from jupyter_gpu.snapshot import schedulers as access

LOGIN_HOSTNAME = re.compile(r"(^|[-_.])login", re.I)
NVML_DRIVER_NOT_LOADED = 9
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


# A Jupyter started by systemd with these settings sees no device file: NVML then says "Driver Not Loaded".
SYSTEMD_DEVICES = ("If Jupyter runs as a systemd service: PrivateDevices=yes or DevicePolicy=closed hides the GPUs; "
                   "add DeviceAllow=/dev/nvidiactl rw, DeviceAllow=/dev/nvidia-uvm rw and DeviceAllow=/dev/nvidia0 "
                   "rw (one per GPU) to the unit, then restart it.")
HARDWARE_FAULT_FIX = [
    "sudo nvidia-smi -r -i {index}   # reset the GPU: only where no process uses it and the system allows it",
    "If the reset is refused or does not help: reboot the machine.",
    "A GPU that fails again after that is faulty: report it to the machine's operator or cloud provider, with "
    "the output of sudo nvidia-bug-report.sh",
]


def _cpu_note(view: FactsView) -> str:
    return f" (and torch {view.torch_version} is a CPU-only build)" if view.cpu_only_build else ""


def no_gpu(view: FactsView) -> list[Finding]:
    """No GPU reaches this machine or container; pick the most specific reason."""
    if view.nvidia_present or view.amd_pci or view.platform.get("system") == "Darwin" or view.jetson:
        return []  # a Jetson's GPU is integrated: jetson_torch() says what it needs
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
    if hosting.get("dockerenv_on_booted_disk"):
        evidence["/.dockerenv"] = (f"present, but / is {hosting.get('root_filesystem')}, a disk this machine booted "
                                   "from: a machine made from a Docker image, not a container")
    cpu_note = _cpu_note(view)
    if hosting.get("wsl"):
        return [wsl_without_gpu_bridge(view, cpu_note)]  # /dev/dxg is absent here (returned above where present)
    if hosting.get("colab") or hosting.get("kaggle"):
        where = "Colab" if hosting.get("colab") else "Kaggle"
        fix = (["Runtime → Change runtime type → Hardware accelerator: GPU, then run the notebook again."]
               if hosting.get("colab") else ["Settings → Accelerator → GPU, then run the notebook again."])
        return [Finding("NOTEBOOK_PLATFORM_NO_ACCELERATOR", "fail",
                        f"This {where} session has no GPU attached{cpu_note}.", evidence=evidence, fix=fix,
                        refs=["googlecolab/colabtools#930"], layer=LAYER_HOST)]
    if view.docker_desktop_vm:
        return [docker_desktop_vm(view, evidence, cpu_note)]
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
    if LOGIN_HOSTNAME.search(hostname):
        fix.append("This looks like a login node: start Jupyter inside a GPU job.")
    if view.cpu_only_build:
        fix += ["There, install a CUDA build of torch:", *pip_fix_lines(view)]
    return [Finding("NO_NVIDIA_GPU", "fail", f"No NVIDIA GPU is visible on this machine{cpu_note}.",
                    evidence=evidence, fix=fix, layer=LAYER_HOST)]


def docker_desktop_vm(view: FactsView, evidence: dict, cpu_note: str) -> Finding:
    """Docker Desktop runs containers in its own Linux VM (a linuxkit kernel). On a Mac there is no NVIDIA GPU and
    no GPU reaches a container; on Windows only the WSL 2 engine passes an NVIDIA GPU through."""
    release = view.hosting.get("kernel_release")
    arm = view.platform.get("machine") in ("aarch64", "arm64")
    fix = ["There is no NVIDIA GPU on a Mac, and Docker Desktop passes no GPU into its containers on macOS: the "
           "Container Toolkit and --gpus cannot help here.",
           "For the Mac's own GPU, run Jupyter natively (not in Docker) with an arm64 Python: %pip install torch, "
           "then use device = torch.device(\"mps\")."]
    if not arm:  # an x86_64 linuxkit VM may also be Docker Desktop on Windows with the Hyper-V engine
        fix.append("On Windows, Docker Desktop passes an NVIDIA GPU only with its WSL 2 engine: Settings → General → "
                   "Use the WSL 2 based engine, then docker run --gpus all ...")
    return Finding(
        "DOCKER_DESKTOP_NO_GPU", "fail",
        f"This runs in Docker Desktop's Linux VM (kernel {release}), which has no NVIDIA GPU{cpu_note}.",
        evidence={**evidence, "kernel_release": release, "machine": view.platform.get("machine")}, fix=fix,
        layer=LAYER_HOST)


def _driver_denied(view: FactsView) -> bool:
    """NVML says "Driver Not Loaded" while the host's own files show the module loaded (not WSL, whose driver is
    Windows')."""
    return (not view.hosting.get("wsl") and view.nvml_error_code == NVML_DRIVER_NOT_LOADED
            and view.driver_loaded_on_host)


def _driver_evidence(view: FactsView) -> dict:
    return {"/proc/driver/nvidia/version": "present (the module is loaded)",
            "kernel_module_version": view.driver.get("kernel_module_version"),
            "bound_driver": sorted({g.get("bound_driver") or "none" for g in view.nvidia_pci}) or None,
            "/dev/nvidia*": view.nvidia_gpu_nodes or "none", "nvml": view.nvml.get("error")}


def driver_unreachable(view: FactsView) -> list[Finding]:
    """NVML says "Driver Not Loaded" while the host's own files show the module loaded: something between this
    process and the driver (a job's cgroup, a container, a sandbox) denies the device files. Never a modprobe."""
    if not _driver_denied(view):
        return []
    evidence = _driver_evidence(view)
    job = view.batch_job
    if job is not None and not view.job_gpu_allocation:
        return []  # job_given_no_gpu: the job asked for none
    if _platform_withheld(view):
        return []  # container_given_no_gpu: the pod or the Hub's spawner gave this container none
    if view.in_container:
        fix = ["This container cannot open the host's GPUs: start it with them.",
               *_container_gpu_fix(view.hosting, view.env.get("NVIDIA_VISIBLE_DEVICES"))]
    elif job is not None:
        scheduler, job_id = job
        given = view.job_gpu_allocation
        evidence.update({scheduler.job_variables[0]: job_id, **given})
        fix = [f"{scheduler.name} gave this job GPUs ({', '.join(f'{k}={v}' for k, v in given.items())}), yet it "
               "cannot open them: run nvidia-smi inside the job and show the output to the cluster's "
               "administrators (the job's cgroup device rules)."
               + (f" ({scheduler.look_inside.format(job=job_id)})" if scheduler.look_inside else "")]
    else:
        fix = ["Run nvidia-smi in a terminal outside Jupyter: if it lists the GPUs there, what started Jupyter "
               "denies it the device files.", SYSTEMD_DEVICES]
    return [Finding(
        "DRIVER_UNREACHABLE", "fail",
        "The NVIDIA driver is loaded on this machine, but this process cannot reach it (NVML says it is not "
        "loaded): a cgroup, a container or a sandbox denies the GPU device files.",
        evidence=evidence, fix=fix, layer=LAYER_HOST)]


def job_given_no_gpu(view: FactsView) -> list[Finding]:
    """Inside any scheduler's job that was given no GPU (snapshot/schedulers.py), where something denies the GPUs: the
    job's cgroup (NVML cannot reach a loaded driver) or a placeholder in CUDA_VISIBLE_DEVICES (HTCondor's 10000).
    The fix is that scheduler's request: never the driver, never the variable, which a job cannot take GPUs by."""
    job = view.batch_job
    if job is None or view.job_gpu_allocation:
        return []
    scheduler, job_id = job
    reasons, evidence = [], {}
    if _driver_denied(view):
        reasons.append("the node's NVIDIA driver is loaded, but the job may not open the GPUs")
        evidence.update(_driver_evidence(view))
    value = view.env.get("CUDA_VISIBLE_DEVICES")
    if value is not None:
        reasons.append(f"CUDA_VISIBLE_DEVICES={value!r} hides every GPU on this node from it")
    if not reasons:
        return []
    absent = (*scheduler.gpu_variables, "CUDA_VISIBLE_DEVICES")
    evidence.update({scheduler.job_variables[0]: job_id, **{name: view.env.get(name) or "unset" for name in absent}})
    fix, spawned = list(scheduler.request), ""
    if view.hub_server:
        # batchspawner submitted this job for a JupyterHub: the user restarts the server with a GPU, the Hub's
        # admins set the request (jupyterhub/batchspawner#170); a job the user submits would not be this server.
        evidence["JUPYTERHUB_API_URL"] = view.env.get("JUPYTERHUB_API_URL")
        spawned = ", which JupyterHub started for this server,"
        fix = [*access.hub_request(scheduler.hub_setting), *(line for line in fix if "JupyterHub" not in line)]
    return [Finding(
        scheduler.code, "fail",
        f"This {scheduler.name} job ({job_id}){spawned} was given no GPU: {'; '.join(reasons)}{_cpu_note(view)}.",
        evidence=evidence, fix=fix, refs=list(scheduler.refs), layer=LAYER_HOST)]


def _platform_withheld(view: FactsView) -> bool:
    """A pod or a JupyterHub server's container on a GPU node that reached it no GPU (not a batch job's: the
    scheduler's rule says that)."""
    return view.gpu_node_withheld and view.batch_job is None and bool(view.hosting.get("kubernetes")
                                                                       or view.hub_server)


def _withheld_evidence(view: FactsView) -> dict:
    env = view.env
    seen = {"kubernetes": "KUBERNETES_SERVICE_HOST=" + env["KUBERNETES_SERVICE_HOST"]
            if env.get("KUBERNETES_SERVICE_HOST") else view.hosting.get("kubernetes") or None,
            "JupyterHub server": env.get("JUPYTERHUB_API_URL") and f"JUPYTERHUB_API_URL={env['JUPYTERHUB_API_URL']}",
            "NVIDIA_VISIBLE_DEVICES": env.get("NVIDIA_VISIBLE_DEVICES", "unset"),
            "pci_gpus": [g["address"] for g in view.nvidia_pci] or None,
            "/proc/driver/nvidia/version": "present (the node's driver is loaded)"
            if view.driver.get("proc_version_text") else "absent",
            "/dev/nvidia*": [p for p in view.device_nodes if p.startswith("/dev/nvidia")] or "none",
            "libcuda.so.1": [lib["path"] for lib in (view.driver.get("libraries") or {}).get("libcuda.so.1") or []]
            or "none", "nvml": view.nvml.get("error") or f"{len(view.nvml_devices)} GPUs"}
    return {name: value for name, value in seen.items() if value is not None}


def _node_gpu(view: FactsView, where: str = "node") -> str:
    version = view.driver.get("kernel_module_version")
    if view.driver_loaded_on_host:
        return f"the {where}'s NVIDIA driver is loaded{f' ({version})' if version else ''}"
    return f"the {where} has an NVIDIA GPU"


def container_given_no_gpu(view: FactsView) -> list[Finding]:
    """A Kubernetes pod or a JupyterHub server's container on a GPU node, given no GPU: the device plugin allocated
    none (no nvidia.com/gpu limit), or allocated one that the runtime never put in (no nvidia runtime class), or the
    Hub's spawner asked for none. The fix is that platform's request, never the host's set-up its user cannot run."""
    if not _platform_withheld(view):
        return []
    evidence, node, cpu_note = _withheld_evidence(view), _node_gpu(view), _cpu_note(view)
    refs = ["NVIDIA/k8s-device-plugin#440", "jupyterhub/kubespawner#93", "jupyterhub/dockerspawner#244"]
    hub = " (the pod of this JupyterHub server)" if view.hub_server else ""
    if view.hosting.get("kubernetes"):
        allocated = view.pod_gpu_allocation
        if allocated:
            fix = list(access.RUNTIME_CLASS)
            if view.hub_server:
                fix = ["This is the Hub's set-up: ask its administrators to set c.KubeSpawner.extra_pod_config = "
                       '{"runtimeClassName": "nvidia"} (or the lines below for the cluster).', *fix]
            return [Finding(
                "KUBERNETES_GPU_NOT_INJECTED", "fail",
                f"NVIDIA's device plugin allocated {allocated} to this Kubernetes pod{hub}, but the container runtime "
                f"did not put it in (no /dev/nvidia* device, no driver libraries): the pod runs without the nvidia "
                f"runtime{cpu_note}.", evidence=evidence, fix=fix,
                refs=["canonical/microk8s-core-addons#400", *refs[:1]], layer=LAYER_HOST)]
        why = (f"; NVIDIA_VISIBLE_DEVICES={view.env['NVIDIA_VISIBLE_DEVICES'] or chr(34) * 2} asks the NVIDIA "
               "runtime for none" if access.requests_no_gpu(view.env) else "")
        fix = (access.hub_request(access.KUBESPAWNER_SETTING) if view.hub_server else list(access.POD_REQUEST))
        return [Finding(
            "KUBERNETES_POD_WITHOUT_GPU", "fail",
            f"This Kubernetes pod{hub} was given no GPU: {node}, but no nvidia.com/gpu was allocated to its container"
            f"{why}, so no GPU device reached it{cpu_note}.", evidence=evidence, fix=fix,
            refs=["skypilot-org/skypilot#5823", *refs], layer=LAYER_HOST)]
    engine = view.hosting.get("docker") or view.hosting.get("podman")
    setting = access.DOCKERSPAWNER_SETTING if engine else "the GPU request of the Hub's spawner"
    return [Finding(
        "JUPYTERHUB_SERVER_WITHOUT_GPU", "fail",
        f"JupyterHub started this server's container without a GPU: {_node_gpu(view, 'machine')}, but no GPU device "
        f"reached it{cpu_note}.",
        evidence=evidence, fix=access.hub_request(setting), refs=refs[2:], layer=LAYER_HOST)]


# Drivers an NVIDIA GPU's PCI function can be bound to for the NVIDIA driver's own use; any other holds it for
# something else (vfio-pci and pci-stub: a virtual machine), and no modprobe or DKMS reaches it until released.
OWN_DRIVERS = (None, "nvidia", "nouveau")


def _held_elsewhere(view: FactsView) -> list[dict]:
    return [g for g in view.nvidia_pci if g.get("bound_driver") not in OWN_DRIVERS]


def gpu_bound_elsewhere(view: FactsView) -> list[Finding]:
    """The PCI layer first: an NVIDIA GPU bound to a driver other than nvidia or nouveau (vfio-pci, pci-stub,
    xen-pciback, ...) is reserved for something else, whatever the NVIDIA module does."""
    held = _held_elsewhere(view)
    if not held:
        return []
    drivers = sorted({g["bound_driver"] for g in held})
    where = ", ".join(f"{g['address']} ({g['bound_driver']})" for g in held)
    fix = []
    if any(d.startswith("vfio") for d in drivers):
        fix.append("It is reserved for a virtual machine (vfio-pci): to use it here, remove its ids from vfio-pci "
                   "(vfio-pci.ids= on the kernel command line, `options vfio-pci ids=` in /etc/modprobe.d/), update "
                   "the initramfs and reboot; where driverctl bound it: sudo driverctl unset-override ADDRESS")
    fix += [f"Now, without a reboot: echo {g['address']} | sudo tee /sys/bus/pci/drivers/{g['bound_driver']}/unbind"
            f" && echo {g['address']} | sudo tee /sys/bus/pci/drivers/nvidia/bind   # with the nvidia module "
            "loaded, and no VM using it" for g in held]
    return [Finding(
        "GPU_BOUND_TO_OTHER_DRIVER", "fail",
        f"The NVIDIA GPU at {where} is bound to {', '.join(drivers)}, not to the NVIDIA driver: it is reserved for "
        "something else (a virtual machine, usually), and CUDA cannot use it here.",
        evidence={"bound_driver": {g["address"]: g["bound_driver"] for g in held},
                  "nvidia_module": "loaded" if view.driver_loaded_on_host or view.driver.get("proc_version_text")
                  else "not loaded", "nvml": view.nvml.get("error")},
        fix=fix, refs=["HikariKnight/quickpassthrough#22", "NVIDIA/kubevirt-gpu-device-plugin#27"],
        layer=LAYER_HOST)]


def driver_not_loaded(view: FactsView) -> list[Finding]:
    code = view.nvml_error_code
    if view.hosting.get("wsl") or view.driver_loaded_on_host:
        return []  # loaded, whatever NVML says from in here: driver_unreachable explains the contradiction
    if view.nvidia_pci and len(_held_elsewhere(view)) == len(view.nvidia_pci):
        return []  # every GPU is held by another driver: gpu_bound_elsewhere, and no modprobe reaches them
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
    # An 803 from a cuda-compat libcuda is that library's mismatch, not a stale module: driver_api_rules names it.
    by_code = view.nvml_error_code == NVML_VERSION_MISMATCH or (
        view.cuda_error_number() == 803 and not compat_answered(view, 803))
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


def _gpu_lost(view: FactsView) -> bool:
    return view.nvml_init_class == nvml_classes.LOST or bool(view.lost_gpus)


def _nvml_fault(view: FactsView) -> bool:
    """NVML answered a fault for a GPU, or could not start for an unknown reason: what CUDA's own "unknown error"
    then comes from, ahead of any guess about nvidia_uvm."""
    return bool(view.gpu_faults) or view.nvml_init_class in nvml_classes.FAULTS


def uvm_missing(view: FactsView) -> list[Finding]:
    nodes = view.device_nodes
    if _nvml_fault(view) and "/dev/nvidia-uvm" in nodes and view.driver.get("sys_module_nvidia_uvm"):
        return []  # CUDA's "unknown error" comes from the GPU NVML cannot use, not from nvidia_uvm (which is there)
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
    if not denied and view.nvml_init_class != nvml_classes.NO_PERMISSION:
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
    if view.cuda_error_number() != 804 or compat_answered(view, 804):
        return []  # where the probe's own cuInit answered 804, driver_api_rules names the file and its way in
    return [Finding(
        "FORWARD_COMPAT_UNSUPPORTED", "fail",
        "A CUDA forward-compatibility libcuda is loaded on a GPU that does not support it (Error 804).",
        evidence={"torch": view.message_containing("Error 804"), "compat_on_LD_LIBRARY_PATH": compat_paths or None,
                  "compat_libcuda": compat_libs or None},
        fix=[f"Remove {', '.join(compat_paths) or 'the cuda-compat directory'} from LD_LIBRARY_PATH and restart "
             "the kernel", "or install a torch wheel the host driver supports:", *pip_fix_lines(view)],
        refs=["PKU-YuanGroup/Video-LLaVA#22"], layer=LAYER_HOST)]


def _hardware_fix(indices: list[int]) -> list[str]:
    index = ",".join(str(i) for i in indices) or "<index>"
    return [line.format(index=index) for line in HARDWARE_FAULT_FIX]


def gpu_lost(view: FactsView) -> list[Finding]:
    """A GPU NVML reads as off the bus (its lost class: GPU_IS_LOST, Timeout, an interrupt issue), or CUDA saying
    so."""
    lost_devices = view.lost_gpus
    message = view.message_containing("unspecified launch failure", "GPU is lost", "fallen off the bus")
    if not (_gpu_lost(view) or message):
        return []
    which = f"GPU {', '.join(str(i) for i in lost_devices)}" if lost_devices else "A GPU"
    said = sorted({view.gpu_faults[i][1] for i in lost_devices}) or [str(view.nvml.get("error") or "")]
    what = "it is lost" if said == ["GPU is lost"] else ", ".join(repr(s) for s in said if s)
    return [Finding(
        "GPU_LOST_OR_XID", "fail",
        f"{which} stopped responding: NVML answers {what} (it fell off the bus or stopped answering its driver, "
        "Xid 79). This is the hardware or its power, not the software: no reinstall helps."
        + health_rules.health_headline(view, lost_devices),
        evidence={"nvml": view.nvml.get("error"), "lost_devices": lost_devices or None, "torch": message,
                  "nvml_answers": {i: view.gpu_faults[i][1] for i in lost_devices} or None,
                  "/dev/nvidia-uvm": "present" if "/dev/nvidia-uvm" in view.device_nodes else "absent",
                  "sys_module_nvidia_uvm": view.driver.get("sys_module_nvidia_uvm"),
                  **health_rules.gpu_health_evidence(view, lost_devices)},
        fix=[*_hardware_fix(lost_devices), "The cause is in the kernel log: sudo dmesg | grep -i xid"],
        layer=LAYER_HARDWARE)]


def gpu_fault(view: FactsView) -> list[Finding]:
    """A GPU whose NVML queries answer "needs a reset" or "Unknown Error" (the other fault classes of
    nvml_classes): the reset first for the one, what tells more for the other. Never a driver or nvidia_uvm fix."""
    faults = {i: f for i, f in view.gpu_faults.items() if f[0] != nvml_classes.LOST}
    if not faults:
        return []
    reset = sorted(i for i, (fault, _) in faults.items() if fault == nvml_classes.RESET)
    unknown = sorted(i for i, (fault, _) in faults.items() if fault == nvml_classes.UNKNOWN)
    said = "; ".join(f"GPU {i}: {answer!r}" for i, (_, answer) in sorted(faults.items()))
    if reset:
        headline = (f"GPU {', '.join(map(str, reset))} needs a reset: NVML answers {said}. Until it is reset (or the "
                    "machine rebooted) no process can use it." + health_rules.health_headline(view, reset))
        fix = [*_hardware_fix(reset), "What put it there is in the kernel log: sudo dmesg | grep -i xid "
                                      "(Xid 48, 63, 64: memory errors and row remapping)"]
    else:
        told = health_rules.health_headline(view, unknown)  # the kernel log or the PCIe link, where they say
        headline = f"GPU {', '.join(map(str, unknown))} does not answer NVML ({said})" + (
            "." + told if told else ": the kernel log says why.")
        index = ",".join(map(str, unknown))
        fix = ["sudo dmesg | grep -i xid   # Xid 79 or 119: the GPU fell off the bus or its firmware stopped "
               "answering; Xid 48, 63, 64: memory errors",
               f"nvidia-smi -q -i {index}   # what the driver itself says of it",
               "Then, for an Xid of the hardware: " + HARDWARE_FAULT_FIX[0].format(index=index) + "; or reboot"]
        fix = health_rules.health_fix(view, unknown) or fix  # the log was read: its Xid's own action
    return [Finding("GPU_FAULT", "fail", headline,
                    evidence={"nvml_answers": {i: answer for i, (_, answer) in faults.items()},
                              "classes": {i: fault for i, (fault, _) in faults.items()},
                              "torch": view.message_containing("CUDA unknown error"),
                              "/dev/nvidia-uvm": "present" if "/dev/nvidia-uvm" in view.device_nodes else "absent",
                              **health_rules.gpu_health_evidence(view, sorted(faults))},
                    fix=fix, refs=["https://docs.nvidia.com/deploy/xid-errors/"], layer=LAYER_HARDWARE)]


def nvml_unknown_error(view: FactsView) -> list[Finding]:
    """NVML could not start and says only "Unknown Error": the report says what it saw and how to find out; in a
    container, the known cause there (the host's systemd took the container's GPU devices back)."""
    if view.nvml_init_class != nvml_classes.UNKNOWN or not (view.nvidia_present or view.driver_loaded_on_host):
        return []
    if view.in_container:
        fix = ["Restart the container: a running container loses its GPU devices when the host runs "
               "`systemctl daemon-reload` with systemd managing its cgroups, and only a new container gets them "
               "back (NVIDIA/nvidia-docker#1730)",
               "For good, on the host: the workaround in that notice (the /dev/char symlinks: sudo nvidia-ctk "
               "system create-dev-char-symlinks --create-all), or Docker's cgroupfs driver"]
    else:
        fix = ["nvidia-smi   # in a terminal: does the driver itself answer?",
               "sudo dmesg | grep -i -e xid -e nvrm   # a fault of the GPU (Xid 79: off the bus) or the driver's"]
    return [Finding(
        "NVML_UNKNOWN_ERROR", "fail",
        "NVML could not start here and says only 'Unknown Error'"
        + (" (inside a container)" if view.in_container else "") + ": CUDA cannot use the GPU either.",
        evidence={"nvml": view.nvml.get("error"), "nvml_error_code": view.nvml_error_code,
                  "container": view.in_container, "torch": view.message_containing("CUDA unknown error")},
        fix=fix, refs=["NVIDIA/nvidia-docker#1730", "NVIDIA/nvidia-container-toolkit#251"], layer=LAYER_HOST)]


def gpu_ecc_error(view: FactsView) -> list[Finding]:
    """An uncorrectable ECC error: the GPU's memory returned wrong data, so CUDA refuses to go on with it."""
    message = view.message_containing("uncorrectable ECC error")
    counted = {d["index"]: d["ecc_uncorrected"] for d in view.nvml.get("devices") or []
               if (d.get("ecc_uncorrected") or {}).get("volatile")}
    if not (message or counted):
        return []
    return [Finding(
        "GPU_ECC_ERROR", "fail",
        f"{'GPU ' + ', '.join(map(str, counted)) if counted else 'A GPU'} hit an uncorrectable ECC memory error: "
        "CUDA stops using it until it is reset. This is the hardware, not the software: no reinstall helps.",
        evidence={"torch": message, "uncorrectable ECC errors (volatile, aggregate)":
                  {f"GPU {i}": (c.get("volatile"), c.get("aggregate")) for i, c in counted.items()} or
                  "not readable through NVML here"},
        fix=[*_hardware_fix(sorted(counted)),
             "nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER   # the counts, and whether memory was retired"],
        layer=LAYER_HOST)]


def jetson_torch(view: FactsView) -> list[Finding]:
    """A Jetson whose torch is not a build for the JetPack it runs (wheels.jetson_build_fit): PyPI's aarch64 CPU
    wheel, download.pytorch.org's server (SBSA) CUDA wheels, or NVIDIA's own build for another JetPack. A torch
    that uses the GPU is never blamed; one that fails although it matches is left to the rules that say why."""
    jetson = view.jetson
    if not jetson or not view.torch_installed:
        return []
    usable = view.probe_ran and (view.torch or {}).get("device_count") and not view.cuda_messages
    fit = jetson_fit(view)
    if usable or fit is None or fit.fits is True:
        return []
    l4t, host_l4t = jetson.get("l4t"), jetson_l4t(view)
    named = f"JetPack {jetpack_name(host_l4t)}" if jetpack_name(host_l4t) else "its JetPack"
    where = (f"L4T R{l4t or '?'}, {named}" if host_l4t == l4t else
             f"this container's image is L4T R{l4t}, the host's kernel {view.hosting.get('kernel_release')} is "
             f"{named}'s")
    need = missing_library_need(view.torch_import_error)
    missing = f"; {need[0]} is missing" if need else ""
    version = " " + view.torch_version if view.torch_version else ""
    evidence = {"/etc/nv_tegra_release": jetson.get("release_text"), "l4t": l4t, "jetpack": jetpack_name(host_l4t),
                "kernel": view.hosting.get("kernel_release"),
                "nvhost nodes": [p for p in view.device_nodes if p.startswith("/dev/nvhost-")][:4] or None,
                "tegra libcuda": [lib["path"] for lib in (view.driver.get("libraries") or {}).get("libcuda.so.1")
                                  or [] if "/tegra/" in lib["path"]] or None,
                "torch.version.cuda": view.torch_cuda, "compiled arch list": " ".join(view.arch_flags) or None,
                "import_error": view.torch_import_error, "torch build": f"{fit.build}: {fit.why}"}
    fix = [f"%pip uninstall -y torch   # {fit.build}: it cannot use this Jetson's GPU", *pip_fix_lines(view)]
    if host_l4t != l4t:
        fix.insert(0, f"This container was built for L4T R{l4t}, the host runs {named}: start one built for the "
                      "host's release instead (cat /etc/nv_tegra_release on the host names it).")
    if fit.fits is None:
        return [Finding(
            "JETSON_TORCH_BUILD_UNKNOWN", "warn",
            f"This is a Jetson ({where}); whether torch{version} is a build for it cannot be told: {fit.build}, "
            f"{fit.why}{missing}.",
            evidence=evidence, fix=fix, refs=[JETSON_PYTORCH_GUIDE], layer=LAYER_HOST)]
    return [Finding(
        "JETSON_NEEDS_JETPACK_TORCH", "fail",
        f"This is a Jetson ({where}), and torch{version} is not a build for it: {fit.build}; "
        f"{fit.why}{missing}. Its integrated GPU is unused.",
        evidence=evidence, fix=fix, refs=[JETSON_PYTORCH_GUIDE], layer=LAYER_HOST)]


WSL_GUIDE = "https://learn.microsoft.com/windows/wsl/tutorials/gpu-compute"


def wsl_without_gpu_bridge(view: FactsView, cpu_note: str) -> Finding:
    """WSL without its GPU bridge (/dev/dxg): no Windows driver reaches it. WSL 1 has no GPU at all; a WSL 2 kernel
    older than GPU support (4.19.121) needs WSL updated; a newer one without the bridge is Windows' side (a build
    without GPU support for WSL) or a custom kernel, which only Windows' own commands tell apart."""
    release = view.hosting.get("kernel_release") or "unknown"
    distro = view.env.get("WSL_DISTRO_NAME") or "<distribution>"
    evidence = {"kernel_release": release, "/dev/dxg": "absent", "WSL_DISTRO_NAME": view.env.get("WSL_DISTRO_NAME"),
                "nvml": view.nvml.get("error") or view.nvml.get("status")}
    if view.wsl_generation == 1:
        return Finding(
            "WSL1_NO_GPU", "fail",
            f"This is WSL 1 (kernel {release}): only WSL 2 passes the GPU to Linux{cpu_note}.", evidence=evidence,
            fix=["wsl -l -v   # in PowerShell: the VERSION column says 1 for this distribution",
                 f"wsl --set-version {distro} 2   # in PowerShell: convert it to WSL 2, then run %gpucheck again"],
            refs=["microsoft/WSL#5554", WSL_GUIDE], layer=LAYER_HOST)
    version = view.kernel_version
    update = ["wsl --update   # in PowerShell: the current WSL and its kernel",
              "wsl --shutdown   # in PowerShell, then open WSL again: /dev/dxg must be there"]
    if version is not None and version < access.WSL_GPU_KERNEL:
        return Finding(
            "WSL_WITHOUT_GPU_SUPPORT", "fail",
            f"This WSL 2 has no GPU bridge (/dev/dxg): its kernel {release} is older than WSL's GPU support "
            f"(4.19.121){cpu_note}.", evidence=evidence,
            fix=[*update, "GPUs in WSL need Windows 11 or Windows 10 21H2 or later: winver shows yours, Windows "
                          "Update brings it."],
            refs=["microsoft/WSL2-Linux-Kernel#126", "microsoft/DirectML#22", WSL_GUIDE], layer=LAYER_HOST)
    return Finding(
        "WSL_WITHOUT_GPU_SUPPORT", "fail",
        f"This WSL 2 has no GPU bridge (/dev/dxg), although its kernel {release} is new enough for one: Windows "
        f"offers it no GPU (a Windows build without GPU support for WSL) or the kernel is a custom one without "
        f"it; which, only Windows tells{cpu_note}.", evidence=evidence,
        fix=["wsl --version   # in PowerShell: WSL's and Windows' versions (the old inbox WSL answers with its usage)",
             "winver   # GPUs in WSL need Windows 11 or Windows 10 21H2 (build 19044) or later",
             *update, "A kernel= line in %UserProfile%\\.wslconfig names a custom kernel: remove it to use WSL's own."],
        refs=["microsoft/WSL#6617", WSL_GUIDE], layer=LAYER_HOST)


def wsl_no_windows_cuda(view: FactsView) -> list[Finding]:
    """WSL 2 with its GPU bridge (/dev/dxg) but without the Windows driver's CUDA (/usr/lib/wsl/lib/libcuda.so.1):
    the Windows NVIDIA driver is missing or too old for CUDA on WSL."""
    if not (view.hosting.get("wsl") and "/dev/dxg" in view.device_nodes) or view.nvml_ok:
        return []  # NVML answering means the Windows driver's libraries are there
    libs = (view.driver.get("libraries") or {}).get("libcuda.so.1") or []
    if any(lib["path"].startswith("/usr/lib/wsl/lib") for lib in libs):
        return []
    return [Finding(
        "WSL_NO_WINDOWS_DRIVER_CUDA", "fail",
        "WSL has its GPU bridge (/dev/dxg) but no CUDA driver from Windows (/usr/lib/wsl/lib has no libcuda): the "
        "NVIDIA driver on Windows is missing or too old for CUDA on WSL.",
        evidence={"/dev/dxg": "present", "/usr/lib/wsl/lib/libcuda.so.1": "absent",
                  "kernel_release": view.hosting.get("kernel_release"), "nvml": view.nvml.get("error")},
        fix=["Install or update the NVIDIA driver on Windows (not inside WSL): https://www.nvidia.com/Download/"
             "index.aspx",
             "Then in PowerShell: wsl --shutdown, and open WSL again (the driver's libcuda appears in "
             "/usr/lib/wsl/lib).",
             "Do not install a Linux NVIDIA driver inside WSL: it would hide the Windows one."],
        refs=["https://docs.nvidia.com/cuda/wsl-user-guide/index.html"], layer=LAYER_HOST)]


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


# Hardware faults first: a lost GPU or an ECC error explains CUDA's other complaints, never the reverse.
RULES = (no_gpu, jetson_torch, gpu_bound_elsewhere, gpu_lost, gpu_fault, nvml_unknown_error, gpu_ecc_error,
         job_given_no_gpu, container_given_no_gpu, driver_unreachable, driver_not_loaded, driver_library_mismatch,
         uvm_missing,
         permission_denied, fabric_manager, forward_compat, wsl_no_windows_cuda, wsl_linux_driver, rocm,
         wrong_vendor_build)
