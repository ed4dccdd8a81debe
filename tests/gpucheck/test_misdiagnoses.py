"""Situations %gpucheck once answered with a fix that cannot work there (issue 32), each on a fake machine built
from its real evidence: the files, variables, NVML errors and torch messages of the public reports.

Each gets its own finding, and no fix in docs/findings.md that cannot apply to it: the last test reads every
finding's fix commands from that page and checks none of the inapplicable ones reaches the report.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from fake_machine import H100, Machine

from jupyter_gpu.facts.gather import gather_facts
from jupyter_gpu.gpucheck.diagnose.engine import diagnose
from jupyter_gpu.gpucheck.render import render_html, render_text

FINDINGS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "findings.md"
NVML_DRIVER_NOT_LOADED, NVML_LIBRARY_NOT_FOUND = 9, 12
SLURM = {"/etc/slurm/slurm.conf": "ClusterName=hpc\n"}
LINUXKIT = "6.10.14-linuxkit\n"
WSL_KERNEL = "5.15.167.4-microsoft-standard-WSL2\n"
# torch's own warning when cudaGetDeviceCount answers 999 (c10/cuda/CUDAFunctions.cpp), as a lost GPU makes it.
CUDA_UNKNOWN_ERROR = ("CUDA initialization: CUDA unknown error - this may be due to an incorrectly set up environment, "
                      "e.g. changing env variable CUDA_VISIBLE_DEVICES after program start. Setting the available "
                      "devices to be zero. (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:109.)")
ECC_ERROR = ("CUDA error: uncorrectable ECC error encountered\nCUDA kernel errors might be asynchronously reported at "
             "some other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing "
             "CUDA_LAUNCH_BLOCKING=1")


def slurm_node(**env: str) -> Machine:
    """A GPU node whose driver is loaded, seen from a job: NVML says "Driver Not Loaded" (the job's cgroup denies
    the device files, which os.access does not see) and torch counts no device."""
    machine = Machine(files=dict(SLURM), env={"SLURM_JOB_ID": "4242", **env}).nvidia_host()
    machine.nvml["init_error"] = NVML_DRIVER_NOT_LOADED
    return machine.cuda_torch(device_count=0)


def docker_desktop() -> Machine:
    return Machine(files={"/.dockerenv": "", "/proc/sys/kernel/osrelease": LINUXKIT}).cpu_torch()


def wsl_without_windows_cuda() -> Machine:
    machine = Machine(files={"/proc/sys/kernel/osrelease": WSL_KERNEL}, nodes=["dxg"],
                      env={"WSL_DISTRO_NAME": "Ubuntu"}).cuda_torch(devices=[], device_count=0)
    machine.nvml = {"init_error": NVML_LIBRARY_NOT_FOUND}  # libnvidia-ml.so.1 lives in /usr/lib/wsl/lib too
    return machine


def jetson_with_pypi_torch() -> Machine:
    """A Jetson Orin on JetPack 5.1.2 (L4T R35.4.1): no PCI GPU, no NVML library, the Tegra libcuda, nvhost nodes;
    PyPI's aarch64 torch, which has no CUDA."""
    tegra = "/usr/lib/aarch64-linux-gnu/tegra"
    machine = Machine(files={"/etc/nv_tegra_release": "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: "
                                                      "t186ref, EABI: aarch64, DATE: Tue Aug  1 19:57:35 UTC 2023\n",
                             f"{tegra}/libcuda.so.1.1": ""},
                      symlinks={f"{tegra}/libcuda.so.1": "libcuda.so.1.1"},
                      nodes=["nvhost-ctrl", "nvhost-ctrl-gpu", "nvhost-gpu", "nvmap"]).cpu_torch("2.5.1")
    machine.nvml = {"init_error": NVML_LIBRARY_NOT_FOUND}
    return machine


def lost_gpu() -> Machine:
    return (Machine().nvidia_host(devices=[dict(H100, lost=True)])
            .cuda_torch(devices=[], device_count=0, warnings=[CUDA_UNKNOWN_ERROR]))


def ecc_error(counted: bool = True) -> Machine:
    gpu = dict(H100, ecc_uncorrected={"volatile": 2, "aggregate": 5}) if counted else dict(H100)
    return Machine().nvidia_host(devices=[gpu]).cuda_torch(init_error=ECC_ERROR)


# torch 2.5.1+cu124's pins, as its wheel's METADATA writes them.
TORCH_PINS = ['nvidia-cudnn-cu12==9.1.0.70; platform_system == "Linux" and platform_machine == "x86_64"',
              'nvidia-nccl-cu12==2.21.5; platform_system == "Linux" and platform_machine == "x86_64"']
NO_CUDNN = "libcudnn.so.9: cannot open shared object file: No such file or directory"
OLD_NCCL = ("/usr/local/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so: undefined symbol: "
            "ncclCommRegister")


def broken_wheel(error: str = NO_CUDNN, **wheels: tuple[str, list[str]]) -> Machine:
    """torch whose import fails on a CUDA library from one of its nvidia-* wheels; `wheels`: what is installed."""
    machine = Machine().nvidia_host().cuda_torch("2.5.1+cu124", "12.4", import_error=error, requires=TORCH_PINS)
    for name, (version, requires) in {"nvidia-nccl-cu12": ("2.21.5", []), **wheels}.items():
        machine.wheel(name, version, requires)
    return machine


def fix_text(report) -> str:
    return "\n".join(line for finding in report.findings for line in finding.fix)


def test_a_slurm_job_without_a_gpu_is_told_to_ask_for_one_never_to_load_the_driver(check_machine):
    report = check_machine(slurm_node())
    primary = report.primary
    assert primary.code == "SLURM_JOB_WITHOUT_GPU" and primary.severity == "fail"
    assert "4242" in primary.headline and "driver is loaded" in primary.headline
    assert primary.evidence["SLURM_JOB_ID"] == "4242" and primary.evidence["SLURM_JOB_GPUS"] == "unset"
    assert primary.evidence["/proc/driver/nvidia/version"].startswith("present")
    fix = "\n".join(primary.fix)
    assert "--gres=gpu:1" in fix and "--gpus=1" in fix and "srun --gres=gpu:1 --pty" in fix
    assert 'c.SlurmSpawner.req_gres = "gpu:1"' in fix
    assert "DRIVER_NOT_LOADED" not in {f.code for f in report.findings}
    assert "modprobe" not in fix_text(report) and "dkms" not in fix_text(report)


def test_a_slurm_job_that_has_gpus_and_still_cannot_reach_the_driver_is_not_told_to_resubmit(check_machine):
    report = check_machine(slurm_node(SLURM_JOB_GPUS="0", CUDA_VISIBLE_DEVICES="0"))
    assert report.primary.code == "DRIVER_UNREACHABLE"
    assert "SLURM_JOB_GPUS=0" in "\n".join(report.primary.fix) and "--gres" not in fix_text(report)
    assert "modprobe" not in fix_text(report)


def test_a_loaded_driver_that_nvml_cannot_reach_outside_any_job_names_the_contradiction(check_machine):
    machine = Machine().nvidia_host()
    machine.nvml["init_error"] = NVML_DRIVER_NOT_LOADED
    report = check_machine(machine.cuda_torch(device_count=0))
    assert report.primary.code == "DRIVER_UNREACHABLE"
    assert "loaded on this machine, but this process cannot reach it" in report.primary.headline
    assert "DeviceAllow=/dev/nvidiactl rw" in fix_text(report) and "modprobe" not in fix_text(report)


def test_a_driver_that_is_really_not_loaded_still_gets_modprobe(check_machine):
    machine = Machine().nvidia_host()
    del machine.files["/proc/driver/nvidia/version"], machine.files["/sys/module/nvidia/version"]
    machine.nvml["init_error"] = NVML_DRIVER_NOT_LOADED
    report = check_machine(machine.cuda_torch(device_count=0))
    assert report.primary.code == "DRIVER_NOT_LOADED" and "sudo modprobe nvidia" in fix_text(report)


def test_docker_desktop_is_told_there_is_no_gpu_to_pass_not_to_install_the_container_toolkit(check_machine):
    report = check_machine(docker_desktop())
    assert report.primary.code == "DOCKER_DESKTOP_NO_GPU"
    assert "Docker Desktop's Linux VM (kernel 6.10.14-linuxkit)" in report.primary.headline
    text = fix_text(report)
    assert 'device = torch.device("mps")' in text and "arm64 Python" in text
    for wrong in ("nvidia-container-toolkit", "nvidia-ctk", "nvidia.com/gpu", "download.pytorch.org"):
        assert wrong not in text, wrong
    assert {f.code for f in report.findings}.isdisjoint({"CONTAINER_NO_GPU", "NO_NVIDIA_GPU", "CPU_ONLY_BUILD"})


def test_docker_desktop_on_an_arm_cpu_is_a_mac_so_the_windows_engine_is_not_offered(lay_out):
    facts = gather_facts(lay_out(docker_desktop()))
    facts["system"]["platform"]["machine"] = "aarch64"  # this CI machine's CPU is x86_64: the one fact it lacks
    report = diagnose(facts)
    assert report.primary.code == "DOCKER_DESKTOP_NO_GPU"
    assert "docker run" not in fix_text(report) and "WSL 2" not in fix_text(report)


def test_wsl_without_the_windows_drivers_cuda_is_told_to_update_the_windows_driver(check_machine):
    report = check_machine(wsl_without_windows_cuda())
    assert report.primary.code == "WSL_NO_WINDOWS_DRIVER_CUDA"
    text = fix_text(report)
    assert "NVIDIA driver on Windows (not inside WSL)" in text and "wsl --shutdown" in text
    assert "pip install" not in text and "CUDA_NOT_AVAILABLE" not in {f.code for f in report.findings}


def test_wsl_with_the_windows_drivers_cuda_is_not_that_finding(check_machine):
    machine = wsl_without_windows_cuda()
    machine.files["/usr/lib/wsl/lib/libcuda.so.1"] = ""
    report = check_machine(machine)
    assert "WSL_NO_WINDOWS_DRIVER_CUDA" not in {f.code for f in report.findings}


def test_a_jetson_with_pypis_torch_gets_nvidias_jetpack_build_not_a_cuda_index(check_machine):
    report = check_machine(jetson_with_pypi_torch())
    primary = report.primary
    assert primary.code == "JETSON_NEEDS_JETPACK_TORCH"
    assert primary.headline.startswith("This is a Jetson (L4T R35.4.1, JetPack 5.1.2), and torch 2.5.1 is not")
    assert primary.evidence["tegra libcuda"] == ["/usr/lib/aarch64-linux-gnu/tegra/libcuda.so.1"]
    assert "/dev/nvhost-ctrl" in primary.evidence["nvhost nodes"]
    text = fix_text(report)
    assert "https://developer.download.nvidia.com/compute/redist/jp/" in text and "l4t-pytorch" in text
    assert "r35.4.1-pth" in text and "jetson-ai-lab" not in text  # that index is JetPack 6's
    assert "download.pytorch.org" not in text
    assert {f.code for f in report.findings}.isdisjoint({"NO_NVIDIA_GPU", "CPU_ONLY_BUILD"})


def test_a_jetson_running_nvidias_own_torch_is_not_told_to_replace_it(check_machine):
    machine = jetson_with_pypi_torch().cuda_torch("2.1.0a0+41361538.nv23.06", "11.4", arch=["sm_72", "sm_87"],
                                                  devices=[], device_count=0)
    assert "JETSON_NEEDS_JETPACK_TORCH" not in {f.code for f in check_machine(machine).findings}


def test_a_gpu_that_fell_off_the_bus_is_the_headline_not_nvidia_uvm(check_machine):
    report = check_machine(lost_gpu())
    primary = report.primary
    assert primary.code == "GPU_LOST_OR_XID" and primary.headline.startswith("GPU 0 stopped responding")
    assert primary.evidence["/dev/nvidia-uvm"] == "present" and primary.evidence["sys_module_nvidia_uvm"] is True
    assert primary.evidence["lost_devices"] == [0]
    assert "NVIDIA_UVM_MISSING" not in {f.code for f in report.findings}
    assert "sudo nvidia-smi -r -i 0" in primary.fix[0] and "reboot" in primary.fix[1]
    assert "nvidia-bug-report.sh" in fix_text(report) and "pip install" not in fix_text(report)


def test_an_uncorrectable_ecc_error_is_a_hardware_finding_with_the_counts(check_machine):
    report = check_machine(ecc_error())
    primary = report.primary
    assert primary.code == "GPU_ECC_ERROR" and primary.headline.startswith("GPU 0 hit an uncorrectable ECC")
    assert "CUDA error: uncorrectable ECC error encountered" in primary.evidence["torch"]
    assert primary.evidence["uncorrectable ECC errors (volatile, aggregate)"] == {"GPU 0": (2, 5)}
    assert "sudo nvidia-smi -r -i 0" in fix_text(report) and "nvidia-smi -q -d ECC" in fix_text(report)
    assert "pip install" not in fix_text(report)
    assert "CUDA_NOT_AVAILABLE" not in {f.code for f in report.findings}


def test_an_ecc_error_on_a_gpu_whose_counters_nvml_cannot_read_says_so(check_machine):
    report = check_machine(ecc_error(counted=False))
    assert report.primary.code == "GPU_ECC_ERROR"
    assert report.primary.evidence["uncorrectable ECC errors (volatile, aggregate)"] == \
        "not readable through NVML here"


def test_a_missing_cudnn_wheel_is_named_with_torchs_pin_and_the_one_line_install(check_machine):
    report = check_machine(broken_wheel())
    primary = report.primary
    assert primary.code == "NVIDIA_WHEEL_MISMATCH"
    assert primary.headline == ("torch 2.5.1+cu124 cannot load its CUDA libraries: it needs "
                                "nvidia-cudnn-cu12==9.1.0.70, and it is not installed.")
    assert primary.fix[0] == "%pip install nvidia-cudnn-cu12==9.1.0.70"
    assert primary.fix[-1].endswith("%pip install --force-reinstall torch==2.5.1+cu124")  # the alternative, last
    assert primary.evidence["installed"] == "not installed" and NO_CUDNN in primary.evidence["import_error"]


def test_a_cudnn_wheel_another_framework_replaced_names_that_framework(check_machine):
    tensorflow = ["nvidia-cudnn-cu12==8.9.7.29; sys_platform == \"linux\""]
    report = check_machine(broken_wheel(**{"nvidia-cudnn-cu12": ("8.9.7.29", []),
                                           "tensorflow": ("2.16.1", tensorflow)}))
    primary = report.primary
    assert primary.code == "NVIDIA_WHEEL_MISMATCH" and primary.headline.endswith("and 8.9.7.29 is installed.")
    assert primary.evidence["other packages asking for it"] == [
        "tensorflow 2.16.1 (asks for nvidia-cudnn-cu12==8.9.7.29)"]
    assert "tensorflow 2.16.1" in fix_text(report) and "environment" in fix_text(report)


def test_an_older_nccl_than_torchs_pin_is_named_from_the_undefined_symbol(check_machine):
    report = check_machine(broken_wheel(OLD_NCCL, **{"nvidia-nccl-cu12": ("2.18.1", []),
                                                    "nvidia-cudnn-cu12": ("9.1.0.70", [])}))
    assert report.primary.code == "NVIDIA_WHEEL_MISMATCH"
    assert report.primary.fix[0] == "%pip install nvidia-nccl-cu12==2.21.5"


def test_an_import_error_from_a_library_whose_wheel_matches_torchs_pin_is_not_blamed_on_it(check_machine):
    report = check_machine(broken_wheel(**{"nvidia-cudnn-cu12": ("9.1.0.70", [])}))
    assert report.primary.code == "TORCH_IMPORT_BROKEN"


SITUATIONS = {"SLURM_JOB_WITHOUT_GPU": slurm_node, "DOCKER_DESKTOP_NO_GPU": docker_desktop,
              "JETSON_NEEDS_JETPACK_TORCH": jetson_with_pypi_torch,
              "WSL_NO_WINDOWS_DRIVER_CUDA": wsl_without_windows_cuda, "GPU_LOST_OR_XID": lost_gpu,
              "GPU_ECC_ERROR": ecc_error, "NVIDIA_WHEEL_MISMATCH": broken_wheel}


@pytest.mark.parametrize("code", list(SITUATIONS))
def test_each_situation_reads_the_same_in_text_html_and_json(check_machine, code: str) -> None:
    report = check_machine(SITUATIONS[code]())
    primary = report.primary
    assert primary.code == code
    text, page = render_text(report), html.unescape(render_html(report))
    as_json = json.loads(json.dumps(report.to_dict(include_facts=False)))
    [finding] = [f for f in as_json["findings"] if f["code"] == code]
    assert finding["headline"] == primary.headline and finding["fix"] == list(primary.fix)
    for shown in (text, page):
        assert primary.headline in shown or report.verdict.endswith(primary.headline[1:]), code
        assert primary.fix[0] in shown, code


# -- every documented fix against every situation ---------------------------------------------------------------

# X, INDEX, NN, PYTHON: filled in by the real finding (LD_LIBRARY_PATH= and other variables are not placeholders)
PLACEHOLDER = re.compile(r"(?<![A-Z_])[A-Z]+(?![\w=-])")


def documented_commands() -> dict[str, set[str]]:
    """Each finding code's fix commands, as docs/findings.md lists them (the `...` spans of its fix column), each
    cut where its first placeholder starts; a cut too short to be that fix's own (`%env `) is left out."""
    commands: dict[str, set[str]] = {}
    for line in FINDINGS_PAGE.read_text().splitlines():
        cells = [cell.strip() for cell in line.split(" | ")]
        match = re.match(r"\|\s*`([A-Z0-9_]+)`", line)
        if match and len(cells) >= 4:
            spans = [PLACEHOLDER.split(span.replace("\\|", "|"))[0].split("  ")[0]
                     for span in re.findall(r"`([^`]+)`", cells[-1])]
            commands[match.group(1)] = {s for s in spans if len(s) >= 12}
    return commands


# What cannot apply where: a module load where the module is loaded, a container set-up where no GPU can reach
# one, a reinstall for a hardware fault or a missing Windows driver.
CANNOT_APPLY = {
    "a Slurm job without a GPU": (slurm_node, ("DRIVER_NOT_LOADED", "CONTAINER_NO_GPU", "TORCH_IMPORT_BROKEN",
                                               "NVIDIA_UVM_MISSING", "WSL_LINUX_DRIVER_INSTALLED")),
    "Docker Desktop on a Mac": (docker_desktop, ("CONTAINER_NO_GPU", "DRIVER_NOT_LOADED", "NVIDIA_UVM_MISSING",
                                                 "HPC_LOGIN_NODE")),
    "WSL without the Windows driver's CUDA": (wsl_without_windows_cuda, ("DRIVER_NOT_LOADED", "TORCH_IMPORT_BROKEN",
                                                                         "CONTAINER_NO_GPU", "NVIDIA_UVM_MISSING")),
    "a GPU lost (Xid 79)": (lost_gpu, ("NVIDIA_UVM_MISSING", "TORCH_IMPORT_BROKEN", "DRIVER_NOT_LOADED",
                                       "CONTAINER_NO_GPU")),
    "an uncorrectable ECC error": (ecc_error, ("TORCH_IMPORT_BROKEN", "DRIVER_NOT_LOADED", "NVIDIA_UVM_MISSING",
                                               "CONTAINER_NO_GPU")),
    "a Jetson with PyPI's torch": (jetson_with_pypi_torch, ("DRIVER_NOT_LOADED", "CONTAINER_NO_GPU",
                                                             "NVIDIA_UVM_MISSING", "HPC_LOGIN_NODE")),
    # The full reinstall stays, as the alternative: the finding's own, not TORCH_IMPORT_BROKEN's.
    "a missing nvidia-cudnn wheel": (broken_wheel, ("LD_LIBRARY_PATH_SHADOWING", "DRIVER_NOT_LOADED",
                                                    "CONTAINER_NO_GPU", "CUDNN_UNAVAILABLE")),
}


@pytest.mark.parametrize("situation", list(CANNOT_APPLY))
def test_no_documented_fix_that_cannot_apply_reaches_the_report(check_machine, situation: str) -> None:
    make, wrong_codes = CANNOT_APPLY[situation]
    report = check_machine(make())
    commands = documented_commands()
    given = {f.code for f in report.findings}
    allowed = set().union(*(commands.get(code, set()) for code in given))
    assert given.isdisjoint(wrong_codes), given & set(wrong_codes)
    text = fix_text(report)
    for code in wrong_codes:
        assert commands.get(code), f"{code} lists no fix command in docs/findings.md"
        for command in commands[code] - allowed:
            assert command not in text, (situation, code, command)
