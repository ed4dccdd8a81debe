"""Neighbours of the CUDA driver layer (issue 49, layer 5): the libcuda the loader gives torch and cuInit's own code.

The probe child loads libcuda.so.1 as the CUDA runtime does and asks cuInit before torch does; the fake machines here
present a real compiled libcuda (tests/fixtures/fake_machine.py, `Machine.libcuda`) answering cuInit with a code, as
the real one does. Three families, each situation from a public report cited beside it: the toolkit's stub libcuda
reached first (34), a forward-compatibility libcuda where it cannot work (804 on a GPU without forward-compat support,
803 against a kernel module newer than it), and a cuInit failure torch says nothing or little about (100). Written
before the rules changed: the commit says how many failed first and how.
"""

from __future__ import annotations

import pytest
from fake_machine import Machine, nvml_gpu

from jupyter_gpu.gpucheck.diagnose import cuda_driver as cd

WSL_KERNEL = "5.15.167.4-microsoft-standard-WSL2\n"
RTX_3090 = nvml_gpu("NVIDIA GeForce RTX 3090", "GPU-5a6b7c8d-0000-1111-2222-333344445555", (8, 6), 25_769_803_776)


def fixes(report) -> str:
    return "\n".join(line for finding in report.findings for line in finding.fix)


def codes(report) -> list[str]:
    return [finding.code for finding in report.findings]


def evidence(finding) -> str:
    return " ".join(str(value) for value in finding.evidence.values())


# -- the toolkit's stub libcuda reached first (CUDA_ERROR_STUB_LIBRARY, 34) -----------------------------------------
def test_a_stub_found_through_the_loaders_configuration_is_named_with_ldconfig(check_machine):
    # NVIDIA/warp#219: "Unable to determine CUDA driver version", error 34; the maintainer: "your system has the
    # directory of the stub (typically /usr/local/cuda/lib64/stubs) configured to be searched before the user-mode
    # driver". Not on LD_LIBRARY_PATH here: the loader's own configuration (/etc/ld.so.conf.d) names it.
    machine = Machine().nvidia_host().cuda_torch().libcuda("/usr/local/cuda/lib64/stubs", stub=True)
    report = check_machine(machine)
    primary = report.primary
    assert primary.code == "CUDA_DRIVER_STUB", (primary.code, primary.headline)
    assert "/usr/local/cuda/lib64/stubs" in primary.headline
    text = "\n".join(primary.fix)
    assert "ld.so.conf" in text and "ldconfig" in text and "LD_LIBRARY_PATH=" not in text


def test_a_stub_on_ld_library_path_under_wsl_is_taken_off_it(check_machine):
    # xmake-io/xmake#4686 (WSL2): "CUDA driver is a stub library"; the log showed LD_LIBRARY_PATH naming
    # /usr/local/cuda/lib64/stubs, and another path made it run. The Windows driver's libcuda is in /usr/lib/wsl/lib.
    machine = Machine(files={"/proc/sys/kernel/osrelease": WSL_KERNEL, "/usr/lib/wsl/lib/libcuda.so.1": ""},
                      nodes=["dxg"], env={"LD_LIBRARY_PATH": "/usr/lib/wsl/lib"},
                      nvml={"driver_version": "551.61", "cuda_driver_version": 12040, "devices": [dict(RTX_3090,
                                                                                                       index=0)]})
    machine.cuda_torch("2.5.1+cu124", "12.4")
    machine.libcuda("/usr/local/cuda/lib64/stubs", stub=True, ld_library_path=True)
    report = check_machine(machine)
    primary = report.primary
    assert primary.code == "CUDA_DRIVER_STUB", (primary.code, primary.headline)
    text = "\n".join(primary.fix)
    assert "%env LD_LIBRARY_PATH=/usr/lib/wsl/lib" in text and "/usr/local/cuda/lib64/stubs" in text


def test_a_stub_in_the_toolkits_targets_folder_from_a_conda_kernel_is_named(check_machine):
    # numba/numba#9732: CudaAPIError [34] from a conda environment; "Mapped libcuda.so paths:
    # /usr/local/cuda-11.8/targets/x86_64-linux/lib/stubs/libcuda.so" (pytorch/pytorch#148441's Dockerfile sets
    # LD_LIBRARY_PATH=/usr/local/cuda-12.8/targets/x86_64-linux/lib/stubs/ the same way).
    stubs = "/usr/local/cuda-11.8/targets/x86_64-linux/lib/stubs"
    machine = Machine(env={"CONDA_PREFIX": "/home/pxr/miniconda3/envs/visionmb"}).nvidia_host().cuda_torch()
    machine.libcuda(stubs, stub=True, ld_library_path=True)
    report = check_machine(machine)
    primary = report.primary
    assert primary.code == "CUDA_DRIVER_STUB", (primary.code, primary.headline)
    assert stubs in primary.headline and "34" in evidence(primary)
    assert "%env LD_LIBRARY_PATH=" in "\n".join(primary.fix)


# -- a forward-compatibility libcuda where it cannot work (804, 803) -------------------------------------------------
def test_a_compat_libcuda_from_the_loader_on_a_geforce_names_the_package_not_ld_library_path(check_machine):
    # NVIDIA/nvidia-docker#1515: error 804 on a GPU without forward-compatibility support; no LD_LIBRARY_PATH was
    # involved: the host's cuda-compat-11-3 package put its libcuda where the loader finds it. The maintainer: remove
    # the cuda-compat package. (The package installs /usr/local/cuda-11.3/compat/libcuda.so.<its driver>.)
    machine = Machine().nvidia_host(driver="460.80", cuda=11020, devices=[dict(RTX_3090)])
    machine.cuda_torch("1.10.0+cu113", "11.3")
    machine.libcuda("/usr/local/cuda-11.3/compat", init_result=804, version=11030)
    report = check_machine(machine)
    primary = report.primary
    assert primary.code == "FORWARD_COMPAT_UNSUPPORTED", (primary.code, primary.headline)
    assert "/usr/local/cuda-11.3/compat" in primary.headline
    text = "\n".join(primary.fix)
    assert "from LD_LIBRARY_PATH" not in text and "cuda-compat" in text and "ldconfig" in text


def test_a_compat_libcuda_older_than_the_kernel_module_is_not_a_reboot(check_machine):
    # NVIDIA/nvidia-container-toolkit#1679: code=803(cudaErrorSystemDriverMismatch) with `ldconfig -p` showing
    # libcuda.so.1 => /usr/local/cuda-13.0/compat/libcuda.so.1 ahead of the driver's; removing
    # /etc/ld.so.conf.d/00-compat-*.conf and running ldconfig fixed it. The kernel module is newer than that libcuda.
    machine = Machine().nvidia_host(driver="590.44.01", cuda=13010).cuda_torch("2.9.1+cu130", "13.0")
    machine.libcuda("/usr/local/cuda-13.0/compat", init_result=803, version=13000)
    report = check_machine(machine)
    primary = report.primary
    assert primary.code == "FORWARD_COMPAT_MISMATCH", (primary.code, primary.headline)
    assert "/usr/local/cuda-13.0/compat" in primary.headline
    text = fixes(report)
    assert "reboot" not in text and "rmmod" not in text and "ldconfig" in text


def test_a_compat_libcuda_put_on_ld_library_path_of_a_newer_host_is_taken_off_it(check_machine):
    # NVIDIA-NeMo/labs-molt#44: cuda-compat-13-0 (the 580 libcuda) forced onto a host with driver 595 "gives CUDA
    # error 803"; the image now prepends it to LD_LIBRARY_PATH only when the host driver is older than 580.
    machine = Machine(env={"LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"})
    machine.nvidia_host(driver="595.45.04", cuda=13020).cuda_torch("2.9.1+cu130", "13.0")
    machine.libcuda("/usr/local/cuda-13.0/compat/lib", init_result=803, version=13000, ld_library_path=True)
    report = check_machine(machine)
    primary = report.primary
    assert primary.code == "FORWARD_COMPAT_MISMATCH", (primary.code, primary.headline)
    text = fixes(report)
    assert "%env LD_LIBRARY_PATH=/usr/local/nvidia/lib64" in text and "reboot" not in text


# -- cuInit fails and torch says nothing, or little (100) ------------------------------------------------------------
def test_cuinit_no_device_while_nvml_lists_the_gpu_is_named_by_the_driver(check_machine):
    # Genesis-Embodied-AI/quadrants#766: "CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected while calling init
    # (cuInit)" on a cloud instance whose GPU the tools list; torch, for the same code, only answers False
    # (c10's device_count_impl: cudaErrorNoDevice is zero devices, without a warning).
    machine = Machine().nvidia_host().cuda_torch().libcuda(init_result=100)
    report = check_machine(machine)
    primary = report.primary
    assert primary.code == "CUDA_DRIVER_INIT_FAILED", (primary.code, primary.headline)
    assert "CUDA_ERROR_NO_DEVICE" in primary.headline and "100" in primary.headline
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.570.124.06" in evidence(primary)


def test_cuinit_no_device_on_a_desktop_geforce_says_what_tells_more(check_machine):
    # NVIDIA/cuda-samples#34: code=100(cudaErrorNoDevice) from cudaGetDeviceCount while nvidia-smi lists the GPU
    # (a reinstall of the driver fixed it later). The finding points at what tells more, not at a guess.
    machine = Machine().nvidia_host(driver="550.120", cuda=12040, devices=[dict(RTX_3090)])
    machine.cuda_torch("2.5.1+cu124", "12.4").libcuda(init_result=100)
    report = check_machine(machine)
    primary = report.primary
    assert primary.code == "CUDA_DRIVER_INIT_FAILED", (primary.code, primary.headline)
    assert "nvidia-smi" in "\n".join(primary.fix) and "is_available() is False" not in primary.headline


# -- guards: a lower layer that explains it keeps the headline; a healthy machine is unchanged -----------------------
def test_cuinit_no_device_under_a_hiding_visible_devices_keeps_that_headline(check_machine):
    # numba/numba#5793: cuInit gave CUDA_ERROR_NO_DEVICE because the script set CUDA_VISIBLE_DEVICES=-1; the lower
    # layer (visibility) explains it, and the driver's code only confirms.
    machine = Machine(env={"CUDA_VISIBLE_DEVICES": "-1"}).nvidia_host().cuda_torch().libcuda(init_result=100)
    report = check_machine(machine)
    assert report.primary.code == "CUDA_VISIBLE_DEVICES_HIDES_GPUS"
    assert "CUDA_DRIVER_INIT_FAILED" not in codes(report)


def test_cuinit_unknown_error_without_nvidia_uvm_keeps_the_uvm_headline(check_machine):
    # pytorch/pytorch#100095: "CUDA unknown error - this may be due to an incorrectly set up environment" on a GTX
    # 1050 Ti; with /dev/nvidia-uvm absent the module layer explains cuInit's 999.
    machine = Machine().nvidia_host(uvm=False).cuda_torch().libcuda(init_result=999)
    report = check_machine(machine)
    assert report.primary.code == "NVIDIA_UVM_MISSING"
    assert "CUDA_DRIVER_INIT_FAILED" not in codes(report)


def test_a_healthy_driver_adds_nothing(check_machine):
    machine = Machine().nvidia_host().cuda_torch().libcuda(init_result=0)
    report = check_machine(machine)
    assert report.gpu_usable and report.status == "ok", [(f.code, f.headline) for f in report.findings]


# -- the pure readings: where a libcuda came from, what a code means --------------------------------------------------
@pytest.mark.parametrize(("path", "origin"), [
    ("/usr/lib/x86_64-linux-gnu/libcuda.so.570.124.06", cd.SYSTEM),
    ("/usr/lib64/libcuda.so.550.54.15", cd.SYSTEM),
    ("/usr/lib/wsl/lib/libcuda.so.1.1", cd.WSL),
    ("/usr/lib/wsl/drivers/nv_dispi.inf_amd64_0123/libcuda.so.1.1", cd.WSL),
    ("/usr/lib/aarch64-linux-gnu/tegra/libcuda.so.1.1", cd.TEGRA),
    ("/usr/lib/aarch64-linux-gnu/nvidia/libcuda.so.1", cd.TEGRA),
    ("/usr/local/cuda-12.8/compat/libcuda.so.570.124.06", cd.COMPAT_PACKAGE),
    ("/usr/local/cuda-13.0/compat/lib/libcuda.so.1", cd.COMPAT_PACKAGE),
    ("/usr/local/cuda-11.8/targets/x86_64-linux/lib/stubs/libcuda.so", cd.TOOLKIT_STUB),
    ("/home/ana/miniconda3/envs/train/lib/stubs/libcuda.so", cd.TOOLKIT_STUB),
    ("/home/ana/miniconda3/envs/train/lib/libcuda.so.1", cd.CONDA),
    ("/opt/vendor/lib/libcuda.so.1", cd.ORIGIN_UNKNOWN),
])
def test_a_libcuda_path_reads_as_its_origin(path, origin):
    assert cd.libcuda_origin(path) == origin


def test_a_code_the_table_lacks_keeps_the_drivers_own_name():
    assert cd.cu_result(34).kind == cd.STUB and cd.cu_result(804).kind == cd.COMPAT
    unknown = cd.cu_result(222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION")
    assert unknown.kind == cd.OTHER and unknown.name == "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"
