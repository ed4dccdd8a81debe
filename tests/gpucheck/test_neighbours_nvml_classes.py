"""Neighbours of the lost-GPU case (issue 49): NVML answering other codes than GPU_IS_LOST (15) for a GPU that is in
trouble. Each situation comes from public reports, cited beside it.

The rule these check is about the family: every NVML error is read by its class (lost, reset needed, unknown, not
loaded, no permission, library mismatch), per GPU and at init. A GPU whose NVML handle answers a fault is the
headline, ahead of CUDA's "unknown error"; nvidia_uvm is not blamed while its node and module are there; where NVML
answers "Unknown Error" the report says what it saw and how to find out, and inside a container names the known
cause of that answer there. Written before the rules changed: 4 of 4 failed first (see the issue's closing note).
"""

from __future__ import annotations

from fake_machine import H100, Machine

# torch's own warning when cudaGetDeviceCount answers 999 (c10/cuda/CUDAFunctions.cpp).
CUDA_UNKNOWN_ERROR = ("CUDA initialization: CUDA unknown error - this may be due to an incorrectly set up environment, "
                      "e.g. changing env variable CUDA_VISIBLE_DEVICES after program start. Setting the available "
                      "devices to be zero. (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:109.)")
NVML_TIMEOUT, NVML_RESET_REQUIRED, NVML_UNKNOWN = 10, 16, 999


def faulty_gpu(code: int) -> Machine:
    """A host whose GPU 0 answers every NVML query with `code`; nvidia_uvm loaded and its node present; torch's CUDA
    initialisation fails with "unknown error", as it does then."""
    return (Machine().nvidia_host(devices=[dict(H100, handle_error=code)])
            .cuda_torch(devices=[], device_count=0, warnings=[CUDA_UNKNOWN_ERROR]))


def fixes(report) -> str:
    return "\n".join(line for finding in report.findings for line in finding.fix)


def test_a_gpu_whose_handle_answers_unknown_error_is_the_headline_not_nvidia_uvm(check_machine):
    # "Unable to determine the device handle for GPU0000:4F:00.0: Unknown Error" after hours of fine-tuning on eight
    # A100s; a power cycle brought it back (haotian-liu/LLaVA#1466, deepspeedai/DeepSpeed#5482): the GPU had
    # dropped, NVML answered 999, not 15.
    report = check_machine(faulty_gpu(NVML_UNKNOWN))
    primary = report.primary
    assert primary.code == "GPU_FAULT", (primary.code, primary.headline)
    assert "GPU 0" in primary.headline and "Unknown Error" in primary.headline
    assert "NVIDIA_UVM_MISSING" not in {f.code for f in report.findings}
    assert "dmesg" in fixes(report) and "modprobe" not in fixes(report) and "pip install" not in fixes(report)


def test_a_gpu_that_needs_a_reset_gets_the_reset_first(check_machine):
    # NVML_ERROR_RESET_REQUIRED ("GPU requires restart" in nvidia-ml-py's table): the state after Xid 48/63/64
    # (uncorrectable memory, row remapping pending); pytorch/pytorch#88459 resets devices stuck so on its CI.
    report = check_machine(faulty_gpu(NVML_RESET_REQUIRED))
    primary = report.primary
    assert primary.code == "GPU_FAULT" and "requires restart" in primary.headline, primary.headline
    assert primary.fix[0].startswith("sudo nvidia-smi -r -i 0")
    assert "modprobe" not in fixes(report)


def test_a_gpu_that_times_out_is_read_as_lost(check_machine):
    # NVML_ERROR_TIMEOUT on a GPU's queries: the GPU stopped answering its driver (Xid 79/119 territory, the GSP
    # timing out; NVIDIA's Xid catalogue): the lost class, as GPU_IS_LOST.
    report = check_machine(faulty_gpu(NVML_TIMEOUT))
    assert report.primary.code == "GPU_LOST_OR_XID" and "'Timeout'" in report.primary.headline
    assert report.primary.fix[0].startswith("sudo nvidia-smi -r -i 0")
    assert "NVIDIA_UVM_MISSING" not in {f.code for f in report.findings}


def test_nvml_unknown_error_inside_a_container_names_the_containers_lost_devices(check_machine):
    # "Failed to initialize NVML: Unknown Error" inside a running container after the host's `systemctl
    # daemon-reload`: systemd rewrote the container's device cgroup, and the container must be restarted
    # (NVIDIA/nvidia-docker#1730, NVIDIA/nvidia-container-toolkit#251). Not the driver, not nvidia_uvm.
    machine = Machine(files={"/.dockerenv": ""}).nvidia_host()
    machine.nvml["init_error"] = NVML_UNKNOWN
    report = check_machine(machine.cuda_torch(devices=[], device_count=0, warnings=[CUDA_UNKNOWN_ERROR]))
    primary = report.primary
    assert primary.code == "NVML_UNKNOWN_ERROR", (primary.code, primary.headline)
    text = "\n".join(primary.fix)
    assert "restart the container" in text.lower() and "daemon-reload" in text
    assert "modprobe" not in fixes(report) and "dkms" not in fixes(report)
