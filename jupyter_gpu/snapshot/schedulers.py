"""Who may open the GPU: the job schedulers', Kubernetes', JupyterHub's and WSL's vocabulary. How a process knows it
runs inside a batch job, a pod or a Hub's single-user server, whether it was given GPUs, and how to ask each for one.
Gathering (which variables a snapshot keeps) and diagnosis (what they mean) both read it, so a platform is added in
one place. Pure: no imports from facts or gpucheck.

Every scheduler here leaves the node's driver loaded and denies a job that asked for no GPU its devices: a cgroup's
device rules (Slurm, PBS Professional's cgroups hook, LSF with GPU enforcement, Grid Engine) or a placeholder in
CUDA_VISIBLE_DEVICES (HTCondor). The fix is always the scheduler's request, never the driver, never the variable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Scheduler:
    name: str
    job_variables: tuple[str, ...]    # all set: this process is inside one of its jobs (the first names the job)
    gpu_variables: tuple[str, ...]    # any set: the job was given GPUs
    request: tuple[str, ...]          # how to ask it for a GPU
    refs: tuple[str, ...]
    # CUDA_VISIBLE_DEVICES values it sets for a job given no GPU (HTCondor's ENVIRONMENT_VALUE_FOR_UnAssignedGPUs)
    unassigned: tuple[str, ...] = ()
    code: str = "JOB_WITHOUT_GPU"     # the finding's code (Slurm's older one kept)
    look_inside: str | None = None    # a command that runs nvidia-smi inside the job {job}
    # What a JupyterHub admin sets so that batchspawner's job asks for a GPU (jupyterhub/batchspawner#2, #170)
    hub_setting: str = "c.BatchSpawnerBase.req_options = <this scheduler's GPU request>"

    def job(self, env: dict[str, str]) -> str | None:
        """The job's id where every job variable is set, else None."""
        if all(env.get(name) for name in self.job_variables):
            return env[self.job_variables[0]]
        return None

    def allocation(self, env: dict[str, str]) -> dict[str, str]:
        """The variables that say what GPUs the job was given; CUDA_VISIBLE_DEVICES only where it selects a device
        (an empty value, a placeholder or -1 gives none)."""
        given = {name: env[name] for name in self.gpu_variables if env.get(name)}
        visible = env.get("CUDA_VISIBLE_DEVICES")
        if visible and visible.strip() not in (*self.unassigned, "-1", "none", "NoDevFiles"):
            given["CUDA_VISIBLE_DEVICES"] = visible
        return given


SLURM = Scheduler(
    "Slurm", ("SLURM_JOB_ID",), ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_GPUS_ON_NODE", "SLURM_GPUS"),
    ("sbatch --gres=gpu:1 ...   (or --gpus=1): submit the job again, asking for a GPU",
     "srun --gres=gpu:1 --pty jupyter lab --no-browser --ip=0.0.0.0   # an interactive job with a GPU",
     'JupyterHub with batchspawner: c.SlurmSpawner.req_gres = "gpu:1" (or pick the GPU option of the spawn form)'),
    ("https://slurm.schedmd.com/gres.html",), code="SLURM_JOB_WITHOUT_GPU",
    look_inside="srun --jobid {job} --overlap --pty nvidia-smi", hub_setting='c.SlurmSpawner.req_gres = "gpu:1"')
PBS = Scheduler(
    "PBS", ("PBS_JOBID",), ("PBS_GPUFILE",),
    ("Submit again with a GPU: qsub -l select=1:ncpus=4:ngpus=1 ...  (PBS Professional)",
     "Torque: qsub -l nodes=1:ppn=4:gpus=1 ...",
     "Interactive: qsub -I -l select=1:ncpus=4:ngpus=1, then start Jupyter inside the job"),
    ("PBS Professional Administrator's Guide, cgroups hook (devices)",),
    hub_setting='c.PBSSpawner.req_options = "-l select=1:ncpus=4:ngpus=1" (TorqueSpawner: "-l nodes=1:ppn=4:gpus=1")')
LSF = Scheduler(
    "LSF", ("LSB_JOBID",), ("LSB_GPU_ALLOC_INFO",),
    ('Submit again with a GPU: bsub -gpu "num=1" ...',
     'Interactive: bsub -Is -gpu "num=1" jupyter lab --no-browser --ip=0.0.0.0'),
    ("IBM Spectrum LSF: Submitting jobs that require GPU resources",),
    hub_setting='c.LsfSpawner.req_options = \'-gpu "num=1"\'')
GRID_ENGINE = Scheduler(
    "Grid Engine", ("JOB_ID", "SGE_ROOT"), ("SGE_HGR_gpu",),
    ("Submit again with a GPU: qsub -l gpu=1 ...  (the name of the GPU resource is your cluster's: qconf -sc)",
     "Interactive: qrsh -l gpu=1, then start Jupyter inside the job"),
    ("kyamagu/sge-gpuprolog",), hub_setting='c.GridengineSpawner.req_options = "-l gpu=1"')
HTCONDOR = Scheduler(
    "HTCondor", ("_CONDOR_SCRATCH_DIR",), ("_CONDOR_AssignedGPUs",),
    ("Submit again with a GPU: request_GPUs = 1 in the submit file",
     "Interactive: condor_submit -interactive with request_GPUs = 1 in the submit file"),
    ("https://htcondor-wiki.cs.wisc.edu/index.cgi/wiki?p=HowToManageGpus", "CHTC/chtc-website-source#350"),
    unassigned=("10000",), hub_setting='c.CondorSpawner.req_options = "request_GPUs = 1"')

SCHEDULERS: tuple[Scheduler, ...] = (SLURM, PBS, LSF, GRID_ENGINE, HTCONDOR)

# What a snapshot keeps of the environment for them.
VARIABLES: tuple[str, ...] = tuple(dict.fromkeys(
    name for scheduler in SCHEDULERS for name in (*scheduler.job_variables, *scheduler.gpu_variables)))


def current_job(env: dict[str, str]) -> tuple[Scheduler, str] | None:
    """The scheduler whose job this process runs in, and the job's id; None outside any."""
    for scheduler in SCHEDULERS:
        job = scheduler.job(env)
        if job is not None:
            return scheduler, job
    return None


# -- Kubernetes: NVIDIA's device plugin gives a container GPUs only for a nvidia.com/gpu limit ------------------------
KUBERNETES_VARIABLES: tuple[str, ...] = ("KUBERNETES_SERVICE_HOST",)
# NVIDIA_VISIBLE_DEVICES values that ask the NVIDIA runtime for no GPU (its contract), and "all": a CUDA image's own
# default, which asks for nothing in particular (a hardened runtime ignores it in unprivileged pods,
# NVIDIA/k8s-device-plugin#440). Neither is an allocation.
NO_GPU_REQUESTED: tuple[str, ...] = ("void", "none", "")
# The device plugin's volume-mounts strategy names this folder instead of the GPUs.
PLUGIN_VOLUME_MOUNTS = "/var/run/nvidia-container-devices"
POD_REQUEST: tuple[str, ...] = (
    "Give the container a GPU in the pod spec: resources: {limits: {nvidia.com/gpu: 1}}, then recreate the pod "
    "(kubectl apply; a Deployment rolls it).",
    "Where the nvidia runtime is not containerd's default, also set runtimeClassName: nvidia in the pod spec.",
    "No node offers nvidia.com/gpu (kubectl describe node: Allocatable)? The cluster's admins install NVIDIA's GPU "
    "Operator or device plugin on its GPU nodes.",
)
RUNTIME_CLASS: tuple[str, ...] = (
    "Set runtimeClassName: nvidia in the pod spec (next to containers:), then recreate the pod: the device plugin "
    "allocated the GPU, but only the nvidia runtime puts it into the container.",
    "Or the cluster's admins make nvidia containerd's default runtime (GPU Operator: "
    "toolkit.env CONTAINERD_SET_AS_DEFAULT=true).",
)


def plugin_allocation(env: dict[str, str]) -> str | None:
    """The GPUs NVIDIA's device plugin allocated to this container, as it tells the runtime: NVIDIA_VISIBLE_DEVICES
    naming them (GPU-/MIG- UUIDs or indices: the envvar strategy) or the volume-mounts strategy's folder. None where
    the value asks for no GPU, for "all" (an image's default) or is unset."""
    value = (env.get("NVIDIA_VISIBLE_DEVICES") or "").strip()
    if value.lower() in (*NO_GPU_REQUESTED, "all"):
        return None
    return value


def requests_no_gpu(env: dict[str, str]) -> bool:
    """NVIDIA_VISIBLE_DEVICES is set to a value that asks the NVIDIA runtime for no GPU."""
    value = env.get("NVIDIA_VISIBLE_DEVICES")
    return value is not None and value.strip().lower() in NO_GPU_REQUESTED


# -- JupyterHub: the spawner, not the user, decides what the single-user server gets ---------------------------------
# Set in every single-user server a Hub spawns (JupyterHub's Spawner.get_env). The snapshot keeps only these two: the
# user's name and token stay out of a file attached to a bug report.
HUB_VARIABLES: tuple[str, ...] = ("JUPYTERHUB_API_URL", "JUPYTERHUB_SERVER_NAME")
HUB_RESTART = ("In JupyterHub: File → Hub Control Panel → Stop My Server, then Start My Server and pick a profile or "
               "option with a GPU.")
HUB_ASK = "No GPU option offered? Ask the Hub's administrators to add one: {setting}"
KUBESPAWNER_SETTING = ('a KubeSpawner profile (c.KubeSpawner.profile_list, or singleuser.profileList in '
                       'zero-to-jupyterhub) whose kubespawner_override has extra_resource_limits: '
                       '{"nvidia.com/gpu": "1"}')
DOCKERSPAWNER_SETTING = ('c.DockerSpawner.extra_host_config = {"device_requests": [docker.types.DeviceRequest('
                         'count=-1, capabilities=[["gpu"]])]} (the Hub\'s host needs the NVIDIA Container Toolkit)')


def in_hub_server(env: dict[str, str]) -> bool:
    """This process runs in a single-user server a JupyterHub spawned."""
    return bool(env.get("JUPYTERHUB_API_URL"))


def hub_request(setting: str) -> list[str]:
    """What a Hub user does (restart the server with a GPU), then what the Hub's admins set."""
    return [HUB_RESTART, HUB_ASK.format(setting=setting)]


# -- WSL: only WSL 2 carries a GPU, through its GPU bridge (/dev/dxg) -------------------------------------------------
# The first WSL 2 kernel with the GPU bridge (dxgkrnl): 4.19.121, Windows Insider build 20150 (June 2020). An older
# one has none, whatever Windows' driver.
WSL_GPU_KERNEL: tuple[int, ...] = (4, 19, 121)
_WSL1_RELEASE = re.compile(r"-Microsoft$")  # WSL 1 reports Windows' build: 4.4.0-19041-Microsoft (microsoft/WSL#5554)


def wsl_generation(release: str | None) -> int | None:
    """1 or 2 by the kernel release WSL reports (WSL 1: "-Microsoft", WSL 2: "-microsoft-standard..."); None unknown."""
    if not release:
        return None
    if _WSL1_RELEASE.search(release.strip()):
        return 1
    return 2 if "microsoft" in release.lower() else None


def kernel_version(release: str | None) -> tuple[int, ...] | None:
    """The numeric head of a kernel release: 4.19.104-microsoft-standard → (4, 19, 104)."""
    match = re.match(r"(\d+(?:\.\d+)*)", (release or "").strip())
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


# What a snapshot keeps of the environment for all of them.
ACCESS_VARIABLES: tuple[str, ...] = (*VARIABLES, *KUBERNETES_VARIABLES, *HUB_VARIABLES, "WSL_DISTRO_NAME",
                                     "WSL_INTEROP")
