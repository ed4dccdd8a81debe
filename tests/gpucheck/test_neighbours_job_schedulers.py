"""Neighbours of the Slurm case (issue 49): other batch schedulers that leave the node's driver loaded and deny a
job that asked for no GPU. Each is built from its scheduler's own documentation or a public report, cited beside it.

The rule these check is about the family, not one variable: inside any scheduler's job with no GPU allocation, the
headline says the job was given no GPU and the fix is that scheduler's way to ask for one; never a modprobe, never
a systemd device rule, never "unset CUDA_VISIBLE_DEVICES" (the scheduler set it; a job cannot take GPUs it was not
given). Written before the rules changed: 4 of 4 failed first (see the issue's closing note).
"""

from __future__ import annotations

from fake_machine import Machine

NVML_DRIVER_NOT_LOADED = 9
NEVER = ("modprobe", "dkms", "DeviceAllow", "unset it", "%env CUDA_VISIBLE_DEVICES=", "nvidia-container-toolkit")


def denied_node(**env: str) -> Machine:
    """A GPU node whose driver is loaded, seen from a job whose cgroup denies the device files: NVML answers
    "Driver Not Loaded" and torch counts no device (as on the Slurm node of test_misdiagnoses.py)."""
    machine = Machine(env=env).nvidia_host()
    machine.nvml["init_error"] = NVML_DRIVER_NOT_LOADED
    return machine.cuda_torch(device_count=0)


def fixes(report) -> str:
    return "\n".join(line for finding in report.findings for line in finding.fix)


def assert_told_to_ask_the_scheduler(report, scheduler: str, request: str, job: str) -> None:
    primary = report.primary
    assert primary.code == "JOB_WITHOUT_GPU" and primary.severity == "fail", (primary.code, primary.headline)
    assert scheduler in primary.headline and job in primary.headline, primary.headline
    assert request in "\n".join(primary.fix), primary.fix
    text = fixes(report)
    assert not any(bad in text for bad in NEVER), text


def test_a_pbs_pro_job_without_ngpus_is_told_to_ask_pbs_for_one(check_machine):
    # PBS Professional's cgroups hook (devices subsystem) gives a job only the GPUs it requested with ngpus; NCAR's
    # Casper docs: "qsub -l select=1:ncpus=1:ngpus=1" (arc.ucar.edu, "Starting Casper jobs with PBS").
    report = check_machine(denied_node(PBS_JOBID="1234567.casper-pbs", PBS_ENVIRONMENT="PBS_INTERACTIVE"))
    assert_told_to_ask_the_scheduler(report, "PBS", "ngpus=1", "1234567.casper-pbs")


def test_an_lsf_job_without_gpu_is_told_to_ask_lsf_for_one(check_machine):
    # IBM Spectrum LSF: GPUs are requested with `bsub -gpu "num=1"`; with LSB_RESOURCE_ENFORCE="gpu" the job's
    # cgroup holds only the allocated GPUs (IBM docs, "Submitting jobs that require GPU resources"; Summit's
    # user guide: a job without -gpu sees none).
    report = check_machine(denied_node(LSB_JOBID="88231", LSB_QUEUE="normal"))
    assert_told_to_ask_the_scheduler(report, "LSF", '-gpu "num=1"', "88231")


def test_an_htcondor_job_without_request_gpus_is_not_told_to_unset_cuda_visible_devices(check_machine):
    # HTCondor's GPU feature sets CUDA_VISIBLE_DEVICES to the GPUs it assigned (ENVIRONMENT_FOR_AssignedGPUs;
    # htcondor-wiki HowToManageGpus) and tells users never to change it (CHTC/chtc-website-source#350); a job that
    # requested none gets the placeholder 10000 (ENVIRONMENT_VALUE_FOR_UnAssignedGPUs), which hides every GPU.
    machine = Machine(env={"_CONDOR_JOB_AD": "/var/lib/condor/execute/dir_4242/.job.ad",
                           "_CONDOR_SCRATCH_DIR": "/var/lib/condor/execute/dir_4242",
                           "CUDA_VISIBLE_DEVICES": "10000"}).nvidia_host().cuda_torch(device_count=0)
    report = check_machine(machine)
    assert_told_to_ask_the_scheduler(report, "HTCondor", "request_GPUs = 1", "dir_4242")


def test_a_grid_engine_job_without_a_gpu_resource_is_told_to_ask_for_one(check_machine):
    # Grid Engine with a consumable `gpu` complex: `qsub -l gpu=1`, and the prolog sets CUDA_VISIBLE_DEVICES to the
    # granted devices only (kyamagu/sge-gpuprolog; Sheffield's ShARC: "the session can only see the devices it
    # requested"). A job that requested none has its devices denied.
    report = check_machine(denied_node(JOB_ID="771", SGE_ROOT="/opt/sge", SGE_CELL="default", QUEUE="all.q"))
    assert_told_to_ask_the_scheduler(report, "Grid Engine", "-l gpu=1", "771")


def test_a_job_that_was_given_gpus_is_not_told_to_ask_for_them(check_machine):
    # The guard: the allocation is there (PBS set CUDA_VISIBLE_DEVICES to its GPU), yet NVML cannot reach the
    # driver. Something else is wrong; resubmitting with ngpus would change nothing.
    report = check_machine(denied_node(PBS_JOBID="99.pbs", CUDA_VISIBLE_DEVICES="0"))
    assert report.primary.code != "JOB_WITHOUT_GPU"
    assert "ngpus" not in fixes(report) and "modprobe" not in fixes(report)
