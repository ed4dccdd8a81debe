"""The job schedulers' vocabulary: how a process knows it runs inside a batch job, whether the job was given GPUs,
and how to ask each scheduler for one. Gathering (which variables a snapshot keeps) and diagnosis (what they mean)
both read it, so a scheduler is added in one place.

Every scheduler here leaves the node's driver loaded and denies a job that asked for no GPU its devices: a cgroup's
device rules (Slurm, PBS Professional's cgroups hook, LSF with GPU enforcement, Grid Engine) or a placeholder in
CUDA_VISIBLE_DEVICES (HTCondor). The fix is always the scheduler's request, never the driver, never the variable.
"""

from __future__ import annotations

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
    look_inside="srun --jobid {job} --overlap --pty nvidia-smi")
PBS = Scheduler(
    "PBS", ("PBS_JOBID",), ("PBS_GPUFILE",),
    ("Submit again with a GPU: qsub -l select=1:ncpus=4:ngpus=1 ...  (PBS Professional)",
     "Torque: qsub -l nodes=1:ppn=4:gpus=1 ...",
     "Interactive: qsub -I -l select=1:ncpus=4:ngpus=1, then start Jupyter inside the job"),
    ("PBS Professional Administrator's Guide, cgroups hook (devices)",))
LSF = Scheduler(
    "LSF", ("LSB_JOBID",), ("LSB_GPU_ALLOC_INFO",),
    ('Submit again with a GPU: bsub -gpu "num=1" ...',
     'Interactive: bsub -Is -gpu "num=1" jupyter lab --no-browser --ip=0.0.0.0'),
    ("IBM Spectrum LSF: Submitting jobs that require GPU resources",))
GRID_ENGINE = Scheduler(
    "Grid Engine", ("JOB_ID", "SGE_ROOT"), ("SGE_HGR_gpu",),
    ("Submit again with a GPU: qsub -l gpu=1 ...  (the name of the GPU resource is your cluster's: qconf -sc)",
     "Interactive: qrsh -l gpu=1, then start Jupyter inside the job"),
    ("kyamagu/sge-gpuprolog",))
HTCONDOR = Scheduler(
    "HTCondor", ("_CONDOR_SCRATCH_DIR",), ("_CONDOR_AssignedGPUs",),
    ("Submit again with a GPU: request_GPUs = 1 in the submit file",
     "Interactive: condor_submit -interactive with request_GPUs = 1 in the submit file"),
    ("https://htcondor-wiki.cs.wisc.edu/index.cgi/wiki?p=HowToManageGpus", "CHTC/chtc-website-source#350"),
    unassigned=("10000",))

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
