"""Every catalogue code the facts can reveal, end to end: a fake machine, the real gathering, the real diagnosis."""

from __future__ import annotations

import json
import signal

import pytest
from fake_machine import H100, Machine, nvml_gpu

TOO_OLD = (
    "CUDA initialization: The NVIDIA driver on your system is too old (found version 12080). Please update "
    "your GPU driver by downloading and installing a new version from the URL: "
    "http://www.nvidia.com/Download/index.aspx Alternatively, go to: https://pytorch.org to install a PyTorch "
    "version that has been compiled with your version of the CUDA driver."
)
UNEXPECTED = (
    "CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions "
    "before calling NumCudaDevices() that might have already set an error? Error {n}: {text}"
)
UNKNOWN = (
    "CUDA initialization: CUDA unknown error - this may be due to an incorrectly set up environment, e.g. "
    "changing env variable CUDA_VISIBLE_DEVICES after program start. Setting the available devices to be zero."
)
P100 = nvml_gpu("Tesla P100-PCIE-16GB", "GPU-p100", (6, 0), 17_071_734_784)
RTX5090 = nvml_gpu("NVIDIA GeForce RTX 5090", "GPU-5090", (12, 0), 34_190_917_632)
A100_MIG = nvml_gpu("NVIDIA A100-SXM4-80GB", "GPU-a100", (8, 0), 85_899_345_920, mig_mode=1)


def text(report) -> str:
    return str(report).lower()


def test_healthy_gpu_machine_gives_ok_verdict_and_exit_zero(check_machine):
    report = check_machine(Machine().nvidia_host().cuda_torch())
    assert report.status == "ok", str(report)
    assert report.verdict == "PyTorch can use 1x NVIDIA H100 80GB HBM3 (cuda:0)"
    assert report.gpu_usable and report.exit_code == 0
    assert str(report).splitlines()[0].endswith(report.verdict)


def test_torch_not_installed_names_the_kernel_interpreter(check_machine, bare_python):
    report = check_machine(Machine().nvidia_host())
    assert report.primary.code == "TORCH_NOT_INSTALLED"
    assert bare_python in report.primary.headline
    assert "%pip install" in "\n".join(report.primary.fix)
    # The newest torch (2.14) has no cu128 wheel, so a CUDA 12.8 driver gets cu126, with the driver upgrade offered.
    assert "torch==2.14.1 --index-url https://download.pytorch.org/whl/cu126" in "\n".join(report.primary.fix)


def test_kernel_env_mismatch_points_at_the_env_that_has_torch(check_machine):
    machine = Machine(env={"VIRTUAL_ENV": "/opt/venvs/train"}).nvidia_host()
    machine.files["/opt/venvs/train/lib/python3.11/site-packages/torch-2.9.1+cu128.dist-info/METADATA"] = (
        "Name: torch\nVersion: 2.9.1+cu128\nRequires-Dist: nvidia-cublas-cu12==12.8.4.1\n"
    )
    report = check_machine(machine)
    assert report.primary.code == "KERNEL_ENV_MISMATCH" and report.primary.severity == "fail"
    assert "/opt/venvs/train/bin/python -m ipykernel install" in "\n".join(report.primary.fix)


def test_kernelspec_with_torch_is_offered_as_the_kernel_to_switch_to(check_machine):
    machine = Machine().nvidia_host()
    machine.files["/usr/local/share/jupyter/kernels/train/kernel.json"] = json.dumps(
        {
            "argv": [
                "/opt/conda/envs/train/bin/python",
                "-m",
                "ipykernel_launcher",
                "-f",
                "{connection_file}",
            ],
            "display_name": "Python (train)",
            "language": "python",
        }
    )
    machine.files["/opt/conda/envs/train/lib/python3.12/site-packages/torch-2.11.0.dist-info/METADATA"] = (
        "Name: torch\nVersion: 2.11.0\nRequires-Dist: nvidia-cuda-runtime-cu13==13.0.96\n"
    )
    report = check_machine(machine)
    assert report.primary.code == "KERNEL_ENV_MISMATCH"
    assert 'Change Kernel → "Python (train)"' in report.primary.fix[0]


def test_cpu_only_build_on_gpu_machine_gets_the_right_index_url(check_machine):
    report = check_machine(Machine().nvidia_host(cuda=12080).cpu_torch("2.13.0+cpu"))
    assert report.primary.code == "CPU_ONLY_BUILD" and report.primary.severity == "fail"
    fix = "\n".join(report.primary.fix)
    assert "torch==2.13.0" in fix and "--index-url https://download.pytorch.org/whl/cu126" in fix
    assert "580.65.06" in fix  # the driver upgrade alternative
    assert report.verdict.startswith("PyTorch is running on the CPU: torch 2.13.0+cpu is a CPU-only build")


def test_torch_folder_in_working_directory_shadows_the_install(check_machine):
    machine = Machine(cwd_files={"torch/__init__.py": "__version__ = 'local'\n"}).nvidia_host().cuda_torch()
    report = check_machine(machine)
    assert "SHADOWED_TORCH_INSTALL" in report.codes
    assert "Rename or remove" in "\n".join(
        next(f for f in report.findings if f.code == "SHADOWED_TORCH_INSTALL").fix
    )


def test_import_error_is_reported_verbatim(check_machine):
    error = "/x/lib/libtorch_python.so: undefined symbol: _ZN3c104cuda9SetDeviceEi"
    report = check_machine(Machine().nvidia_host().cuda_torch(import_error=error))
    assert report.primary.code == "TORCH_IMPORT_BROKEN"
    assert error in report.primary.evidence["import_error"]


def test_torch_crash_while_importing_is_caught(check_machine):
    report = check_machine(Machine().nvidia_host().cuda_torch(crash="SIGSEGV"))
    assert report.primary.code == "TORCH_IMPORT_BROKEN"
    assert signal.Signals.SIGSEGV.name in report.primary.headline


def test_probe_timeout_is_a_finding_not_a_hang(lay_out):
    from jupyter_gpu.facts.gather import gather_facts
    from jupyter_gpu.gpucheck.diagnose.engine import diagnose

    ctx = lay_out(Machine().nvidia_host().cuda_torch(hang_s=30), probe_timeout_s=1.5)
    report = diagnose(gather_facts(ctx))
    assert report.primary.code == "TORCH_PROBE_TIMEOUT"


def test_ld_library_path_shadowing(check_machine):
    error = (
        "/venv/lib/python3.11/site-packages/nvidia/cusparse/lib/libcusparse.so.12: undefined symbol: "
        "__nvJitLinkAddData_12_1, version libnvJitLink.so.12"
    )
    machine = (
        Machine(env={"LD_LIBRARY_PATH": "/usr/local/cuda-12.1/lib64"},
                files={"/usr/local/cuda-12.1/lib64/libnvJitLink.so.12": ""})  # the toolkit's copy it loads
        .nvidia_host()
        .cuda_torch(import_error=error)
    )
    report = check_machine(machine)
    assert report.primary.code == "LD_LIBRARY_PATH_SHADOWING"
    assert "/usr/local/cuda-12.1/lib64" in "\n".join(report.primary.fix)


def test_no_gpu_at_all(check_machine):
    report = check_machine(Machine().cpu_torch())
    assert report.primary.code == "NO_NVIDIA_GPU"
    assert "CPU_ONLY_BUILD" in report.codes
    assert report.exit_code == 1


@pytest.mark.parametrize(
    ("machine", "code", "keyword"),
    [
        (
            Machine(env={"COLAB_RELEASE_TAG": "release-colab_20260101"}),
            "NOTEBOOK_PLATFORM_NO_ACCELERATOR",
            "change runtime type",
        ),
        (
            Machine(files={"/.dockerenv": ""}, env={"NVIDIA_VISIBLE_DEVICES": "void"}),
            "CONTAINER_NO_GPU",
            "--gpus all",
        ),
        (
            Machine(files={"/etc/slurm/slurm.conf": "ClusterName=hpc\n", "/etc/hostname": "login01\n"}),
            "HPC_LOGIN_NODE",
            "srun --gres=gpu:1",
        ),
    ],
)
def test_no_gpu_where_the_platform_explains_it(check_machine, machine, code, keyword):
    report = check_machine(machine.cpu_torch())
    assert report.primary.code == code
    assert keyword in text(report)


def test_driver_not_loaded(check_machine):
    machine = Machine(
        pci=[
            {
                "address": "0000:01:00.0",
                "vendor": "0x10de",
                "device": "0x2330",
                "class": "0x030200",
                "driver": "nouveau",
            }
        ],
        nvml={"init_error": 9},
    ).cuda_torch(devices=[], device_count=0)
    report = check_machine(machine)
    assert report.primary.code == "DRIVER_NOT_LOADED"
    assert "sudo modprobe nvidia" in text(report) and "nouveau" in text(report)


def test_driver_library_mismatch(check_machine):
    machine = Machine().nvidia_host(driver="550.90.07")
    machine.symlinks["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"] = "libnvidia-ml.so.550.120"
    machine.files["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.120"] = (
        ""  # upgraded; module still 550.90.07
    )
    machine.nvml = {"init_error": 18}
    machine.cuda_torch(
        devices=[],
        device_count=0,
        warnings=[
            UNEXPECTED.format(n=803, text="system has unsupported display driver / cuda driver combination")
        ],
    )
    report = check_machine(machine)
    assert report.primary.code == "DRIVER_LIBRARY_MISMATCH"
    assert "550.120" in report.primary.headline and "reboot" in text(report)


def test_uvm_missing(check_machine):
    machine = Machine().nvidia_host(uvm=False).cuda_torch(devices=[], device_count=0, warnings=[UNKNOWN])
    report = check_machine(machine)
    assert report.primary.code == "NVIDIA_UVM_MISSING"
    assert "nvidia-modprobe -c 0 -u" in text(report)


def test_device_permission_denied(check_machine):
    machine = Machine(denied=["nvidia0", "nvidiactl"]).nvidia_host()
    machine.nvml = {"init_error": 4}
    machine.cuda_torch(devices=[], device_count=0)
    report = check_machine(machine)
    assert report.primary.code == "DEVICE_PERMISSION_DENIED"
    assert "/dev/nvidia0" in str(report.primary.evidence["denied"])


@pytest.mark.parametrize(
    ("number", "message", "code"),
    [
        (802, "system not yet initialized", "FABRIC_MANAGER_NOT_RUNNING"),
        (804, "forward compatibility was attempted on non supported HW", "FORWARD_COMPAT_UNSUPPORTED"),
    ],
)
def test_cuda_error_numbers_map_to_codes(check_machine, number, message, code):
    machine = (
        Machine()
        .nvidia_host()
        .cuda_torch(devices=[], device_count=0, warnings=[UNEXPECTED.format(n=number, text=message)])
    )
    report = check_machine(machine)
    assert report.primary.code == code
    assert f"Error {number}" in str(report)


def test_gpu_lost(check_machine):
    lost = dict(H100, lost=True)
    machine = (
        Machine()
        .nvidia_host(devices=[lost])
        .cuda_torch(devices=[], device_count=0, warnings=[], init_error=None)
    )
    report = check_machine(machine)
    assert report.primary.code == "GPU_LOST_OR_XID"
    assert "dmesg" in text(report)


def test_wsl_with_linux_driver_installed(check_machine):
    machine = Machine(
        files={
            "/proc/sys/kernel/osrelease": "5.15.167.4-microsoft-standard-WSL2\n",
            "/usr/lib/wsl/lib/libcuda.so.1": "",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14": "",
        },
        symlinks={"/usr/lib/x86_64-linux-gnu/libcuda.so.1": "libcuda.so.550.54.14"},
        nodes=["dxg"],
    )
    machine.cuda_torch(
        devices=[],
        device_count=0,
        warnings=[UNEXPECTED.format(n=100, text="no CUDA-capable device is detected")],
    )
    report = check_machine(machine)
    assert report.primary.code == "WSL_LINUX_DRIVER_INSTALLED"
    assert "wsl --shutdown" in text(report)


def test_wsl_windows_driver_too_old(check_machine):
    machine = Machine(
        files={"/proc/sys/kernel/osrelease": "5.15.167.4-microsoft-standard-WSL2\n"},
        nodes=["dxg"],
        nvml={"driver_version": "551.61", "cuda_driver_version": 12040, "devices": [dict(H100, index=0)]},
    )
    machine.cuda_torch(
        "2.11.0+cu130", "13.0", devices=[], device_count=0, warnings=[TOO_OLD.replace("12080", "12040")]
    )
    report = check_machine(machine)
    assert report.primary.code == "WSL_WINDOWS_DRIVER_OLD"
    assert "update the nvidia driver on windows" in text(report)


def test_rocm_without_kfd_access(check_machine):
    machine = Machine(
        pci=[{"address": "0000:03:00.0", "vendor": "0x1002", "device": "0x744c", "class": "0x030000"}]
    )
    machine.torch = {
        "version": "2.9.1+rocm6.4",
        "cuda": None,
        "hip": "6.4.43484",
        "arch": [],
        "devices": [],
        "device_count": 0,
        "warnings": [],
    }
    report = check_machine(machine)
    assert report.primary.code == "ROCM_PERMISSION"
    assert "usermod -ag render,video" in text(report)


def test_rocm_unsupported_gfx(check_machine):
    machine = Machine(
        nodes=["kfd"],
        pci=[{"address": "0000:03:00.0", "vendor": "0x1002", "device": "0x1586", "class": "0x038000"}],
    )
    machine.torch = {
        "version": "2.9.1+rocm6.4",
        "cuda": None,
        "hip": "6.4.43484",
        "arch": [],
        "devices": [{"name": "AMD Radeon 8060S", "capability": [11, 5], "memory_total": 1}],
        "warnings": [],
        "init_error": "HIP error: invalid device function",
    }
    report = check_machine(machine)
    assert report.primary.code == "ROCM_UNSUPPORTED_GFX"
    assert "hsa_override_gfx_version" in text(report)


def test_driver_too_old_for_wheel_recommends_same_torch_on_cu128(check_machine):
    machine = (
        Machine()
        .nvidia_host(driver="570.124.06", cuda=12080)
        .cuda_torch("2.11.0+cu130", "13.0", devices=[], device_count=0, warnings=[TOO_OLD])
    )
    report = check_machine(machine)
    assert report.primary.code == "DRIVER_TOO_OLD_FOR_WHEEL"
    fix = "\n".join(report.primary.fix)
    assert "torch==2.11.0" in fix and "whl/cu128" in fix and "580.65.06" in fix
    assert report.verdict.startswith(
        "PyTorch is running on the CPU: the NVIDIA driver 570.124.06 (CUDA 12.8)"
    )


def test_gpu_too_old_for_wheel(check_machine):
    machine = (
        Machine()
        .nvidia_host(devices=[dict(P100)], cuda=12060)
        .cuda_torch(
            "2.8.0+cu128",
            "12.8",
            init_error="CUDA error: no kernel image is available for execution on the device",
        )
    )
    report = check_machine(machine)
    assert report.primary.code == "GPU_ARCH_TOO_OLD_FOR_WHEEL"
    assert "whl/cu126" in "\n".join(report.primary.fix) and "torch==2.8.0" in "\n".join(report.primary.fix)
    assert not report.gpu_usable  # is_available() was True, which is exactly why this one is nasty


def test_gpu_too_new_for_wheel(check_machine):
    machine = (
        Machine()
        .nvidia_host(devices=[dict(RTX5090)], cuda=12090)
        .cuda_torch(
            "2.6.0+cu124",
            "12.4",
            arch=["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"],
            init_error="CUDA error: no kernel image is available for execution on the device",
        )
    )
    report = check_machine(machine)
    assert report.primary.code == "GPU_ARCH_TOO_NEW_FOR_WHEEL"
    assert "torch==2.11.0" in "\n".join(report.primary.fix) and "whl/cu128" in "\n".join(report.primary.fix)


def test_ptx_toolchain_too_new(check_machine):
    machine = (
        Machine()
        .nvidia_host()
        .cuda_torch(init_error="CUDA error: the provided PTX was compiled with an unsupported toolchain.")
    )
    assert check_machine(machine).primary.code == "PTX_TOOLCHAIN_TOO_NEW"


@pytest.mark.parametrize("value", ["-1", "", "0,0", "3"])
def test_cuda_visible_devices_hiding_every_gpu(check_machine, value):
    machine = (
        Machine(env={"CUDA_VISIBLE_DEVICES": value}).nvidia_host().cuda_torch(devices=[], device_count=0)
    )
    report = check_machine(machine)
    assert report.primary.code == "CUDA_VISIBLE_DEVICES_HIDES_GPUS"
    assert "%env CUDA_VISIBLE_DEVICES=0" in "\n".join(report.primary.fix)


def test_mig_enabled_without_instances(check_machine):
    machine = Machine().nvidia_host(devices=[dict(A100_MIG)]).cuda_torch(devices=[], device_count=0)
    report = check_machine(machine)
    assert report.primary.code == "MIG_NO_INSTANCES"
    assert "nvidia-smi mig -cgi" in text(report)


def test_two_mig_devices_in_cuda_visible_devices(check_machine):
    migs = [{"uuid": f"MIG-{n}", "memory_total": 20 << 30, "memory_used": 0} for n in ("aaaa", "bbbb")]
    machine = (
        Machine(env={"CUDA_VISIBLE_DEVICES": "MIG-aaaa,MIG-bbbb"})
        .nvidia_host(devices=[dict(A100_MIG, mig_devices=migs)])
        .cuda_torch(
            devices=[
                {"name": "NVIDIA A100-SXM4-80GB MIG 3g.40gb", "capability": [8, 0], "memory_total": 20 << 30}
            ]
        )
    )
    report = check_machine(machine)
    assert "MIG_MULTI_DEVICE" in report.codes and report.status == "warn"
    assert report.gpu_usable


def test_exclusive_process_gpu_held_by_another_process(check_machine):
    busy = dict(H100, compute_mode=3, processes=[{"pid": 4242, "used": 2 << 30}])
    machine = (
        Machine()
        .nvidia_host(devices=[busy])
        .cuda_torch(init_error="CUDA error: CUDA-capable device(s) is/are busy or unavailable")
    )
    report = check_machine(machine)
    assert report.primary.code == "GPU_EXCLUSIVE_BUSY"
    assert "Exclusive_Process" in report.primary.headline


def test_memory_held_by_another_process_is_a_warning(check_machine):
    crowded = dict(H100, processes=[{"pid": 4242, "used": 70 << 30}])
    machine = Machine(files={"/proc/4242/status": "Name:\tpython\n"}).nvidia_host(devices=[crowded]).cuda_torch()
    report = check_machine(machine)
    assert report.status == "warn" and report.gpu_usable and report.exit_code == 0
    assert report.primary.code == "GPU_MEMORY_HELD_BY_OTHER_PROCESS"
    assert "kill 4242" in "\n".join(report.primary.fix)


def test_memory_held_under_a_host_pid_in_a_container_is_not_killed_blindly(check_machine):
    crowded = dict(H100, processes=[{"pid": 987654, "used": 70 << 30}])
    report = check_machine(Machine(files={"/.dockerenv": ""}).nvidia_host(devices=[crowded]).cuda_torch())
    finding = report.primary
    assert finding.code == "GPU_MEMORY_HELD_BY_OTHER_PROCESS"
    assert "kill" not in "\n".join(finding.fix) and "host PIDs" in "\n".join(finding.fix)
    assert "(host PID)" in str(finding.evidence)


def test_cudnn_missing_from_cuda_build(check_machine):
    report = check_machine(Machine().nvidia_host().cuda_torch(cudnn_version=None))
    assert "CUDNN_UNAVAILABLE" in report.codes and report.status == "warn"


def test_minor_version_compatibility_is_info_not_warning(check_machine):
    report = check_machine(Machine().nvidia_host(driver="560.35.03", cuda=12060).cuda_torch())
    assert "CUDA_MINOR_VERSION_COMPAT" in report.codes and report.status == "ok"


def test_xpu_is_reported(check_machine):
    intel_gpu = {"address": "0000:03:00.0", "vendor": "0x8086", "device": "0xe20b", "class": "0x030000"}
    report = check_machine(Machine(pci=[intel_gpu]).cpu_torch("2.9.1+xpu", xpu=True))
    assert "XPU_AVAILABLE" in report.codes


def test_cuda_not_available_without_known_cause_shows_torch_words(check_machine):
    machine = (
        Machine()
        .nvidia_host()
        .cuda_torch(devices=[], device_count=0, warnings=["CUDA initialization: something new and strange"])
    )
    report = check_machine(machine)
    assert report.primary.code == "CUDA_NOT_AVAILABLE"
    assert "something new and strange" in str(report)


def test_missing_interpreter_is_a_finding(check_machine):
    report = check_machine(Machine(), python="/nonexistent/bin/python")
    assert report.primary.code == "KERNEL_PROBE_FAILED"


def test_failure_after_import_keeps_torch_warnings(check_machine):
    machine = Machine().nvidia_host().cuda_torch(warnings=["CUDA initialization: odd but recoverable"])
    machine.torch["devices"] = []  # device_count says 1, but reading device 0 fails
    machine.torch["device_count"] = 1
    report = check_machine(machine)
    assert report.primary.code == "CUDA_NOT_AVAILABLE" and not report.gpu_usable
    assert "odd but recoverable" in str(report) and "IndexError" in str(report)


def test_cuda_visible_devices_by_uuid_prefix_selects_the_gpu(check_machine):
    machine = Machine(env={"CUDA_VISIBLE_DEVICES": "GPU-1b2c3d4e"}).nvidia_host().cuda_torch()
    report = check_machine(machine)
    assert report.status == "ok" and "CUDA_VISIBLE_DEVICES_HIDES_GPUS" not in report.codes


def test_cuda_visible_devices_with_an_unknown_uuid_hides_every_gpu(check_machine):
    machine = Machine(env={"CUDA_VISIBLE_DEVICES": "GPU-deadbeef"}).nvidia_host().cuda_torch(
        devices=[], device_count=0)
    report = check_machine(machine)
    assert report.primary.code == "CUDA_VISIBLE_DEVICES_HIDES_GPUS"


@pytest.mark.parametrize(("machine_arch", "mps", "code", "usable"), [
    ("arm64", True, "MAC_USE_MPS", True),
    ("x86_64", False, "MAC_ROSETTA_PYTHON", False),
    ("arm64", False, "MAC_OS_TOO_OLD", False),
])
def test_macos_snapshots(lay_out, machine_arch, mps, code, usable):
    """A Mac cannot be laid out under a Linux root (the platform comes from the running host), so these are
    snapshots as a Mac would save them: gathered for real with the stub torch, then stamped with macOS."""
    from jupyter_gpu.facts.gather import gather_facts
    from jupyter_gpu.gpucheck.diagnose.engine import diagnose

    machine = Machine().cpu_torch("2.11.0")
    machine.torch["mps"] = mps
    snapshot = gather_facts(lay_out(machine), force_torch_probe=True)
    snapshot["system"]["platform"] = {"system": "Darwin", "machine": machine_arch, "release": "23.6.0"}
    snapshot["torch"]["mps"] = {"built": True, "available": mps}
    report = diagnose(snapshot)
    assert code in report.codes and report.gpu_usable is usable
    if usable:
        assert report.verdict == "PyTorch can use 1x Apple GPU (mps)" and report.exit_code == 0
    else:
        assert report.primary.code == code


def test_stale_import_after_reinstall(lay_out):
    """This process really imported torch 2.13.0+cpu; the disk now holds another build, as after %pip install."""
    import sys

    import torch

    from jupyter_gpu.facts.gather import gather_facts
    from jupyter_gpu.gpucheck.diagnose.engine import diagnose

    ctx = lay_out(Machine().nvidia_host(cuda=13000).cuda_torch("2.13.0+cu130", "13.0"), modules=sys.modules)
    report = diagnose(gather_facts(ctx))
    assert report.primary.code == "STALE_TORCH_IMPORT"
    assert report.primary.evidence["imported_version"] == torch.__version__
    assert report.primary.evidence["installed_version"] == "2.13.0+cu130"
    assert "Restart Kernel" in report.primary.fix[0]


def test_cuda_visible_devices_changed_after_cuda_started(lay_out):
    """The kernel's torch initialised CUDA with both GPUs; the variable now names one (a CUDA-initialised
    torch is what this machine lacks, so the in-kernel module is a plain stand-in object)."""
    import types

    from jupyter_gpu.facts.gather import gather_facts
    from jupyter_gpu.gpucheck.diagnose.engine import diagnose

    second = dict(H100, uuid="GPU-second")
    machine = Machine(env={"CUDA_VISIBLE_DEVICES": "0"}).nvidia_host(devices=[dict(H100), second])
    machine.cuda_torch(devices=[{"name": H100["name"], "capability": [9, 0], "memory_total": 1}])
    props = types.SimpleNamespace(uuid=None)
    cuda = types.SimpleNamespace(is_initialized=lambda: True, device_count=lambda: 2,
                                 get_device_name=lambda i: H100["name"], get_device_properties=lambda i: props)
    kernel_torch = types.SimpleNamespace(__version__="2.9.1+cu128", __file__=None, cuda=cuda)
    report = diagnose(gather_facts(lay_out(machine, modules={"torch": kernel_torch})))
    finding = next(f for f in report.findings if f.code == "CUDA_VISIBLE_DEVICES_CHANGED_AFTER_INIT")
    assert finding.evidence["kernel_device_count"] == 2 and finding.evidence["selected_now"] == 1
    assert "before `import torch`" in finding.fix[0]
