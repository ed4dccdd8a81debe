"""Neighbours of the batch-scheduler case (issue 49): who may open the GPU. A Kubernetes pod without a `nvidia.com/gpu`
limit, a JupyterHub single-user server its spawner started without a GPU, and a WSL too old for GPUs: the node (or
Windows) has the GPU and its driver, this process was never given it. Each situation is taken from a public report
cited beside it.

What a user must see: the headline names who withheld the GPU (the pod, the Hub, WSL 1 or this WSL's age) with the
evidence; the fix is the request that gives one (a pod spec's limit, the Hub's GPU profile, `wsl --set-version` or
`wsl --update`), never the host's set-up a pod or Hub user cannot run (Container Toolkit, `docker run --gpus`,
modprobe), and never the Windows driver where WSL itself cannot carry a GPU. Written before the rules changed: the
commit says how many failed first and how.
"""

from __future__ import annotations

from fake_machine import H100, Machine

NVML_LIBRARY_NOT_FOUND = 12
NO_DRIVER = ("CUDA initialization: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU "
             "and installed a driver from http://www.nvidia.com/Download/index.aspx (Triggered internally at "
             "/pytorch/c10/cuda/CUDAFunctions.cpp:109.)")
NO_DEVICE = ("CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before "
             "calling NumCudaDevices() that might have already set an error? Error 100: no CUDA-capable device is "
             "detected (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:109.)")
KUBEPODS = ("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod5f1c.slice/"
            "cri-containerd-8e2d.scope\n")
KUBERNETES = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
HUB = {"JUPYTERHUB_API_URL": "http://hub:8081/hub/api", "JUPYTERHUB_USER": "alice",
       "JUPYTERHUB_SERVICE_PREFIX": "/user/alice/", "JUPYTERHUB_SERVER_NAME": ""}
HOST_SETUP = ("nvidia-ctk", "apt-get install", "systemctl restart docker", "docker run", "podman run", "modprobe",
              "dkms", "DeviceAllow")
WINDOWS_DRIVER = "driver on Windows"


def fixes(report) -> str:
    return "\n".join(line for finding in report.findings for line in finding.fix)


def gpu_node_container(env: dict[str, str], nodes: tuple[str, ...] = (), libraries: bool = False,
                       torch_warning: str = NO_DRIVER, dockerenv: bool = False) -> Machine:
    """A container on a GPU node that was given no GPU. The node's driver shows through what no container runtime
    hides (/proc/driver/nvidia, /sys/module/nvidia, the PCI device in /sys); the runtime injected none of the GPU's
    device files (only `nodes`) and, unless `libraries`, none of the driver's libraries, so NVML's library is
    missing and torch finds no driver."""
    files = {"/proc/1/cgroup": KUBEPODS} if not dockerenv else {"/.dockerenv": ""}
    machine = Machine(files=files, env=env).nvidia_host()
    machine.nodes = list(nodes)
    if libraries:
        machine.nvml["devices"] = []  # the driver's libraries, no GPU: NVML starts and counts none
    else:
        for path in [p for p in machine.files if p.startswith("/usr/lib/x86_64-linux-gnu/")]:
            del machine.files[path]
        machine.symlinks.clear()
        machine.nvml = {"init_error": NVML_LIBRARY_NOT_FOUND}
    return machine.cuda_torch(devices=[], device_count=0, warnings=[torch_warning])


# -- a Kubernetes pod without a nvidia.com/gpu limit ----------------------------------------------------------------
def assert_pod_told_to_request_a_gpu(report, seen: str) -> None:
    primary = report.primary
    assert primary.code == "KUBERNETES_POD_WITHOUT_GPU" and primary.severity == "fail", (primary.code,
                                                                                         primary.headline)
    assert "nvidia.com/gpu" in primary.headline and seen in primary.headline, primary.headline
    assert "nvidia.com/gpu: 1" in primary.fix[0], primary.fix
    text = fixes(report)
    assert not any(bad in text for bad in HOST_SETUP), text


def test_a_pod_without_a_gpu_limit_under_a_hardened_gpu_operator_is_told_to_add_the_limit(check_machine):
    # NVIDIA/k8s-device-plugin#440: the volume-mounts device list strategy with
    # accept-nvidia-visible-devices-envvar-when-unprivileged = false; "When I request nvidia.com/gpu: 0, no GPUs are
    # visible but no drivers are made available". The CUDA image's own NVIDIA_VISIBLE_DEVICES=all asks for nothing.
    machine = gpu_node_container({**KUBERNETES, "NVIDIA_VISIBLE_DEVICES": "all"})
    report = check_machine(machine)
    assert_pod_told_to_request_a_gpu(report, "driver is loaded")
    assert report.primary.evidence["NVIDIA_VISIBLE_DEVICES"] == "all"


def test_a_pod_given_nvidia_visible_devices_none_is_told_to_add_the_limit(check_machine):
    # skypilot-org/skypilot#5823 (after NVIDIA/k8s-device-plugin#61): a pod that requests no GPU gets
    # NVIDIA_VISIBLE_DEVICES=none, so the runtime mounts the driver's libraries and control device but no GPU
    # ("No devices were found"); cuInit finds no device (Error 100).
    machine = gpu_node_container({**KUBERNETES, "NVIDIA_VISIBLE_DEVICES": "none"},
                                 nodes=("nvidiactl", "nvidia-uvm"), libraries=True, torch_warning=NO_DEVICE)
    report = check_machine(machine)
    assert_pod_told_to_request_a_gpu(report, "NVIDIA_VISIBLE_DEVICES=none")


def test_a_pod_whose_limit_the_default_runtime_ignored_is_told_to_use_the_nvidia_runtime_class(check_machine):
    # canonical/microk8s-core-addons#400: once the nvidia runtime is no longer containerd's default, "pods that
    # request GPU resources must explicitly opt-in via runtimeClassName: nvidia"; without it the pod failed ("CUDA
    # driver version is insufficient"). The device plugin allocated a GPU (NVIDIA_VISIBLE_DEVICES names it), runc
    # ignored the variable: no device files, no driver libraries.
    machine = gpu_node_container({**KUBERNETES, "NVIDIA_VISIBLE_DEVICES": H100["uuid"]})
    report = check_machine(machine)
    primary = report.primary
    assert primary.code == "KUBERNETES_GPU_NOT_INJECTED", (primary.code, primary.headline)
    assert H100["uuid"] in primary.headline and "runtime" in primary.headline, primary.headline
    assert "runtimeClassName: nvidia" in primary.fix[0], primary.fix
    assert not any(bad in fixes(report) for bad in HOST_SETUP), fixes(report)


def test_a_pod_with_a_working_gpu_limit_keeps_its_verdict(check_machine):
    # The guard: the device plugin's allocation arrived (NVIDIA_VISIBLE_DEVICES=GPU-..., /dev/nvidia0, the driver's
    # libraries); nothing is wrong (jupyterhub/zero-to-jupyterhub-k8s#3000 shows the variable a plugin sets).
    machine = Machine(files={"/proc/1/cgroup": KUBEPODS},
                      env={**KUBERNETES, "NVIDIA_VISIBLE_DEVICES": H100["uuid"]}).nvidia_host().cuda_torch()
    report = check_machine(machine)
    assert report.status == "ok" or report.primary is None or report.primary.severity != "fail", report.primary
    assert not any(f.code.startswith("KUBERNETES_") for f in report.findings)


# -- a JupyterHub single-user server started without a GPU ----------------------------------------------------------
def assert_told_to_pick_a_gpu_server(report, admin_setting: str) -> None:
    primary = report.primary
    assert primary.severity == "fail" and "JupyterHub" in primary.headline, (primary.code, primary.headline)
    assert "Hub Control Panel" in primary.fix[0] and "GPU" in primary.fix[0], primary.fix
    assert admin_setting in "\n".join(primary.fix), primary.fix
    text = fixes(report)
    assert not any(bad in text for bad in HOST_SETUP), text


def test_a_kubespawner_server_without_a_gpu_profile_is_told_to_pick_one(check_machine):
    # jupyterhub/kubespawner#93 ("Request GPU": extra_resource_limits) and jupyterhub/zero-to-jupyterhub-k8s#795:
    # the Hub's pod for the user carries no nvidia.com/gpu limit unless a profile asks for one.
    machine = gpu_node_container({**KUBERNETES, **HUB, "NVIDIA_VISIBLE_DEVICES": "all"})
    report = check_machine(machine)
    assert report.primary.code == "KUBERNETES_POD_WITHOUT_GPU", report.primary.code
    assert_told_to_pick_a_gpu_server(report, 'extra_resource_limits: {"nvidia.com/gpu": "1"}')


def test_a_batchspawner_slurm_job_without_gres_is_told_to_pick_the_hubs_gpu_option(check_machine):
    # jupyterhub/batchspawner#170 (req_gres: "it allows to specify e.g. GPU requests"): the Hub submits the server as
    # a Slurm job; one submitted without --gres has its GPUs denied by the job's cgroup (NVML: Driver Not Loaded).
    machine = Machine(env={**HUB, "SLURM_JOB_ID": "7781", "SLURM_JOB_NAME": "spawner-jupyterhub"}).nvidia_host()
    machine.nvml["init_error"] = 9
    report = check_machine(machine.cuda_torch(device_count=0))
    assert report.primary.code == "SLURM_JOB_WITHOUT_GPU", report.primary.code
    assert_told_to_pick_a_gpu_server(report, 'c.SlurmSpawner.req_gres = "gpu:1"')
    assert "7781" in report.primary.headline


def test_a_dockerspawner_container_without_device_requests_is_told_to_ask_the_hub(check_machine):
    # jupyterhub/dockerspawner#244 ("Use runtime nvidia"; the maintainer: extra_host_config with device_requests
    # DeviceRequest(count=-1, capabilities=[["gpu"]])): the Hub's container for the user was started without GPUs.
    machine = gpu_node_container({**HUB, "NVIDIA_VISIBLE_DEVICES": "all"}, dockerenv=True)
    report = check_machine(machine)
    assert report.primary.code == "JUPYTERHUB_SERVER_WITHOUT_GPU", report.primary.code
    assert_told_to_pick_a_gpu_server(report, "device_requests")


def test_a_slurm_job_with_a_gpu_keeps_its_verdict(check_machine):
    # The guard: a job given a GPU (SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES) that works is not told to ask for one.
    machine = Machine(env={**HUB, "SLURM_JOB_ID": "7782", "SLURM_JOB_GPUS": "0",
                           "CUDA_VISIBLE_DEVICES": "0"}).nvidia_host().cuda_torch()
    report = check_machine(machine)
    assert report.primary is None or report.primary.severity != "fail", report.primary
    assert "req_gres" not in fixes(report) and "Hub Control Panel" not in fixes(report)


# -- a WSL too old for GPUs ------------------------------------------------------------------------------------------
def wsl(kernel: str, dxg: bool, wsl_lib: bool = True) -> Machine:
    files = {"/proc/sys/kernel/osrelease": kernel + "\n"}
    if wsl_lib:
        files["/usr/lib/wsl/lib/libdxcore.so"] = ""  # Windows' own library: WSL mounts the folder
    machine = Machine(files=files, nodes=["dxg"] if dxg else [], env={"WSL_DISTRO_NAME": "Ubuntu-20.04"})
    machine.nvml = {"init_error": NVML_LIBRARY_NOT_FOUND}
    return machine.cuda_torch(devices=[], device_count=0, warnings=[NO_DRIVER])


def test_wsl_1_is_told_to_convert_the_distribution_to_wsl_2(check_machine):
    # microsoft/WSL#5554: "Your kernel headers for kernel 4.4.0-19041-Microsoft cannot be found"; the maintainer:
    # "That kernel version indicates that you are using WSL1" (wsl -l -v shows the version). WSL 1 has no GPU.
    report = check_machine(wsl("4.4.0-19041-Microsoft", dxg=False, wsl_lib=False))
    primary = report.primary
    assert primary.code == "WSL1_NO_GPU", (primary.code, primary.headline)
    assert "WSL 1" in primary.headline and "4.4.0-19041-Microsoft" in primary.headline, primary.headline
    text = "\n".join(primary.fix)
    assert "wsl --set-version Ubuntu-20.04 2" in text and "wsl -l -v" in text, text
    assert WINDOWS_DRIVER not in fixes(report) and "modprobe" not in fixes(report)


def test_wsl_2_with_a_kernel_older_than_gpu_support_is_told_to_update_wsl(check_machine):
    # microsoft/WSL2-Linux-Kernel#126: on Windows 10 2004 (build 19041) "GPU Compute ... and the wsl --update
    # command that goes with it ... are not part of the Windows 10 2004 release"; microsoft/DirectML#22: GPU support
    # needs the updated kernel ("Linux version 4.19.121-microsoft-WSL2-standard"), not an older one.
    report = check_machine(wsl("4.19.104-microsoft-standard", dxg=False, wsl_lib=False))
    primary = report.primary
    assert primary.code == "WSL_WITHOUT_GPU_SUPPORT", (primary.code, primary.headline)
    assert "4.19.104" in primary.headline and "/dev/dxg" in primary.headline, primary.headline
    assert primary.fix[0].startswith("wsl --update"), primary.fix
    assert WINDOWS_DRIVER not in fixes(report)


def test_wsl_2_with_a_new_kernel_but_no_gpu_bridge_says_what_tells_which(check_machine):
    # microsoft/WSL#6617: on Windows Insider build 21327 "GPU Compute support is unavailable ... /dev/dxg is not
    # visible", fixed by a later Windows build; the kernel was new enough. Whether Windows is too old, broken or
    # the kernel a custom one cannot be told from inside: the report says what it saw and what tells.
    report = check_machine(wsl("5.10.16.3-microsoft-standard-WSL2", dxg=False))
    primary = report.primary
    assert primary.code == "WSL_WITHOUT_GPU_SUPPORT", (primary.code, primary.headline)
    assert "5.10.16.3" in primary.headline and "/dev/dxg" in primary.headline, primary.headline
    text = "\n".join(primary.fix)
    assert "wsl --version" in text and "winver" in text and "wsl --update" in text, text
    assert WINDOWS_DRIVER not in fixes(report)


def test_modern_wsl_without_the_windows_driver_still_gets_the_windows_driver(check_machine):
    # The guard (microsoft/WSL#5604: /usr/lib/wsl/lib held only Windows' libd3d12/libdxcore, no libcuda, until the
    # NVIDIA driver was reinstalled): a WSL with its GPU bridge is told to install or update the Windows driver.
    report = check_machine(wsl("5.15.167.4-microsoft-standard-WSL2", dxg=True))
    primary = report.primary
    assert primary.code == "WSL_NO_WINDOWS_DRIVER_CUDA", (primary.code, primary.headline)
    assert "Install or update the NVIDIA driver on Windows" in primary.fix[0]
