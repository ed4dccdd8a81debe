"""Windows: gathering does not crash there, and Windows snapshots are diagnosed right on any host.

Windows is what this machine lacks, so a fake machine is stamped as Windows (the context's `system`), with
its files laid out under the fake root (C:\\x\\y lives at <root>/C/x/y) and `os.statvfs` removed as it is on
Windows. The kernel's own interpreter is still this machine's (the probe child must really run), so the
facts about the environments around it are the Windows ones: PATH with `;`, PATHEXT, venvs with Scripts\\.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fake_machine import H100, Machine

from jupyter_gpu.facts.context import ProbeContext
from jupyter_gpu.facts.gather import SCHEMA_NAME, SCHEMA_VERSION, gather_facts, load_snapshot
from jupyter_gpu.gpucheck.diagnose.engine import diagnose

TRAIN = "C:\\Users\\ana\\envs\\train"
WINDOWS_ENV = {
    "PATH": f"{TRAIN}\\Scripts;C:\\Windows\\System32;C:\\Windows",
    "PATHEXT": ".COM;.EXE;.BAT;.CMD;.VBS;.JS",
    "SystemRoot": "C:\\Windows",
    "APPDATA": "C:\\Users\\ana\\AppData\\Roaming",
    "COMPUTERNAME": "ANA-LAPTOP",
}
CUDA_METADATA = "Name: torch\nVersion: 2.9.1+cu128\nRequires-Dist: nvidia-cuda-runtime-cu12==12.8.90\n"


def put(ctx: ProbeContext, path: str, text: str = "") -> None:
    """Write a file of the fake Windows machine where the context maps it."""
    target = ctx.path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


@pytest.fixture
def windows(lay_out, monkeypatch):
    """A fake machine stamped as Windows, on a host whose os module has no statvfs (as Windows' has none)."""
    monkeypatch.delattr(os, "statvfs", raising=False)

    def build(machine: Machine) -> ProbeContext:
        machine.env = {**WINDOWS_ENV, **machine.env}
        return lay_out(machine, system="Windows")

    return build


def windows_gpu_machine() -> Machine:
    machine = Machine()
    machine.nvml = {"driver_version": "576.02", "cuda_driver_version": 12090, "devices": [dict(H100, index=0)]}
    return machine


def test_gathering_a_windows_machine_does_not_crash_and_finds_python_by_pathext(windows):
    ctx = windows(windows_gpu_machine())
    put(ctx, f"{TRAIN}\\Scripts\\python.exe")  # lower case on disk, .EXE in PATHEXT
    put(ctx, f"{TRAIN}\\Lib\\site-packages\\torch-2.9.1+cu128.dist-info\\METADATA", CUDA_METADATA)
    put(ctx, "C:\\Windows\\System32\\nvcuda.dll")
    snapshot = gather_facts(ctx)
    assert snapshot["system"]["platform"]["system"] == "Windows"
    assert snapshot["system"]["shm_bytes"] is None
    assert snapshot["kernel"]["which_python"] == f"{TRAIN}\\Scripts\\python.exe"
    report = diagnose(snapshot)
    # The kernel (this machine's bare Python, no torch) is not the env on PATH, which has a CUDA torch.
    assert report.primary.code == "KERNEL_ENV_MISMATCH" and report.primary.severity == "fail"
    assert f"torch 2.9.1+cu128 is installed in {TRAIN}" in report.primary.headline
    assert f"{TRAIN}\\Scripts\\python.exe -m ipykernel install --user --name train" in "\n".join(report.primary.fix)
    # Nothing Linux-only is claimed about a Windows machine.
    assert not {"CONTAINER_NO_GPU", "NO_NVIDIA_GPU", "NVIDIA_UVM_MISSING", "DRIVER_NOT_LOADED"} & set(report.codes)


def test_a_program_not_in_pathext_is_not_found(windows):
    machine = windows_gpu_machine()
    machine.env = {"PATHEXT": ".COM;.BAT"}
    ctx = windows(machine)
    put(ctx, f"{TRAIN}\\Scripts\\python.exe")
    assert gather_facts(ctx)["kernel"]["which_python"] is None


def test_a_conda_kernelspec_on_windows_is_offered_as_the_kernel_to_switch_to(windows):
    conda = "C:\\Users\\ana\\miniforge3\\envs\\vision"
    ctx = windows(windows_gpu_machine())
    spec = {"argv": [f"{conda}\\python.exe", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python (vision)", "language": "python"}
    put(ctx, "C:\\Users\\ana\\AppData\\Roaming\\jupyter\\kernels\\vision\\kernel.json", json.dumps(spec))
    put(ctx, f"{conda}\\python.exe")
    put(ctx, f"{conda}\\Lib\\site-packages\\torch-2.9.1+cu128.dist-info\\METADATA", CUDA_METADATA)
    report = diagnose(gather_facts(ctx))
    assert report.primary.code == "KERNEL_ENV_MISMATCH"
    assert 'Change Kernel → "Python (vision)"' in report.primary.fix[0]
    assert conda in report.primary.headline


def test_the_windows_driver_counts_as_a_gpu_even_without_nvidia_ml_py(windows):
    """No pynvml in the kernel's env, no /dev or /proc on Windows: nvcuda.dll is what says a GPU is there."""
    ctx = windows(Machine().cpu_torch("2.9.1+cpu"))
    put(ctx, "C:\\Windows\\System32\\nvcuda.dll")
    report = diagnose(gather_facts(ctx))
    assert report.primary.code == "CPU_ONLY_BUILD" and report.primary.severity == "fail", str(report)
    assert "even though this machine has one" in report.primary.headline


def test_a_cuda_torch_on_windows_without_nvidia_ml_py_is_still_probed(windows):
    gpu = {"name": H100["name"], "capability": [9, 0], "memory_total": H100["memory_total"], "uuid": H100["uuid"]}
    ctx = windows(Machine().cuda_torch(devices=[gpu]))
    put(ctx, "C:\\Windows\\System32\\nvcuda.dll")
    report = diagnose(gather_facts(ctx))
    assert report.verdict == "PyTorch can use 1x NVIDIA H100 80GB HBM3 (cuda:0)", str(report)


def test_a_healthy_windows_gpu_machine_gets_the_ok_verdict(windows):
    report = diagnose(gather_facts(windows(windows_gpu_machine().cuda_torch())))
    assert report.status == "ok", str(report)
    assert report.verdict == "PyTorch can use 1x NVIDIA H100 80GB HBM3 (cuda:0)"


# -- saved Windows snapshots, diagnosed on this Linux host ---------------------------------------------------

BASE = "C:\\Users\\ana\\envs\\base"


def windows_snapshot(tmp_path: Path, *, env: dict[str, str], kernel: dict, install: dict,
                     torch: dict | None = None) -> dict:
    """A snapshot as `%gpucheck --save` writes it on a Windows laptop, read back through load_snapshot."""
    snapshot = {
        "schema": SCHEMA_NAME, "schema_version": SCHEMA_VERSION, "created": "2026-01-05T10:00:00+00:00",
        "context": {"root": "/", "python": f"{BASE}\\Scripts\\python.exe", "cwd": "C:\\Users\\ana\\work",
                    "pid": 4242},
        "probe": {"base": {"ok": True, "returncode": 0}, "torch": {"ran": torch is not None, "ok": True}},
        "python": {"executable": f"{BASE}\\Scripts\\python.exe", "prefix": BASE,
                   "base_prefix": "C:\\Users\\ana\\AppData\\Local\\Programs\\Python\\Python312",
                   "user_site": "C:\\Users\\ana\\AppData\\Roaming\\Python\\Python312\\site-packages",
                   "cwd": "C:\\Users\\ana\\work", "sys_path": [], "version": "3.12.8"},
        "install": install,
        "nvml": {"status": "ok", "driver_version": "576.02", "cuda_driver_version": 12090,
                 "devices": [dict(H100, index=0, mig_enabled=False, mig_instances=None)]},
        "system": {"platform": {"system": "Windows", "machine": "AMD64", "release": "11", "cpu_count": 16},
                   "driver": {"proc_version_text": None, "kernel_module_version": None,
                              "libraries": {"nvcuda.dll": [{"path": "C:\\Windows\\System32\\nvcuda.dll",
                                                            "resolved": "C:\\Windows\\System32\\nvcuda.dll"}]}},
                   "device_nodes": [], "pci_gpus": [], "shm_bytes": None,
                   "hosting": {"docker": False, "podman": False, "cgroup_container": False, "kubernetes": False,
                               "wsl": False, "hostname": "ANA-LAPTOP"}},
        "env": env, "kernel": kernel, "in_kernel": {"torch_imported": False}, "torch": torch, "notebook": None,
    }
    path = tmp_path / "windows.json"
    path.write_text(json.dumps(snapshot))
    return load_snapshot(str(path))


def cpu_install(location: str = f"{BASE}\\Lib\\site-packages") -> dict:
    return {"distributions": [{"version": "2.9.1+cpu", "location": location, "cuda_requirements": []}],
            "spec_origin": f"{location}\\torch\\__init__.py",
            "build": {"version": "2.9.1+cpu", "cuda": None, "hip": None}, "conda_builds": []}


def test_a_saved_windows_snapshot_names_the_venv_that_has_the_cuda_torch(tmp_path):
    train_torch = {"version": "2.9.1+cu128", "site_packages": f"{TRAIN}\\Lib\\site-packages",
                   "cuda_requirements": ["cu12"], "cuda_build": True}
    kernel = {"python": f"{BASE}\\Scripts\\python.exe", "which_python": f"{TRAIN}\\Scripts\\python.exe",
              "virtual_env": TRAIN, "kernelspecs": [],
              "other_environments": {"virtual_env": {"prefix": TRAIN, "torch": train_torch,
                                                     "python": f"{TRAIN}\\Scripts\\python.exe"}}}
    snapshot = windows_snapshot(tmp_path, env={"VIRTUAL_ENV": TRAIN, "PYTHONPATH": "C:\\Users\\ana\\libs;D:\\src"},
                                kernel=kernel, install=cpu_install())
    report = diagnose(snapshot)
    assert report.primary.code == "KERNEL_ENV_MISMATCH" and report.primary.severity == "fail"
    assert report.primary.headline == (
        f"This kernel runs {BASE}\\Scripts\\python.exe, which has a CPU-only torch 2.9.1+cpu, but torch "
        f"2.9.1+cu128 is installed in {TRAIN} (virtual_env).")
    assert f"{TRAIN}\\Scripts\\python.exe -m pip install ipykernel" in report.primary.fix[0]
    assert "SHADOWED_TORCH_INSTALL" not in report.codes


def test_the_kernels_own_env_spelt_in_another_case_is_not_a_mismatch(tmp_path):
    """Windows paths ignore case and slash kind: VIRTUAL_ENV=c:/users/ana/envs/base is the kernel's env."""
    kernel = {"python": f"{BASE}\\Scripts\\python.exe", "which_python": "c:/users/ana/envs/base/Scripts/python.exe",
              "virtual_env": "c:/users/ana/envs/base", "kernelspecs": [], "other_environments": {}}
    report = diagnose(windows_snapshot(tmp_path, env={"VIRTUAL_ENV": "c:/users/ana/envs/base"}, kernel=kernel,
                                       install=cpu_install()))
    assert "KERNEL_ENV_MISMATCH" not in report.codes, str(report)


def test_a_torch_folder_on_a_windows_pythonpath_is_found_shadowing_the_install(tmp_path):
    install = cpu_install()
    install["spec_origin"] = "C:\\Users\\ana\\libs\\torch\\__init__.py"
    kernel = {"python": f"{BASE}\\Scripts\\python.exe", "kernelspecs": [], "other_environments": {}}
    report = diagnose(windows_snapshot(tmp_path, env={"PYTHONPATH": "D:\\src;C:\\Users\\ana\\libs"}, kernel=kernel,
                                       install=install))
    finding = next(f for f in report.findings if f.code == "SHADOWED_TORCH_INSTALL")
    assert finding.severity == "fail"
    assert "Rename or remove C:\\Users\\ana\\libs\\torch: it is imported instead of the installed torch." in finding.fix


def test_ld_library_path_means_nothing_in_a_windows_snapshot(tmp_path):
    """An MSYS shell may export LD_LIBRARY_PATH; the Windows loader ignores it, so it is not blamed."""
    error = "OSError: [WinError 126] cannot open shared object: error loading c10.dll or one of its dependencies."
    kernel = {"python": f"{BASE}\\Scripts\\python.exe", "kernelspecs": [], "other_environments": {}}
    report = diagnose(windows_snapshot(tmp_path, env={"LD_LIBRARY_PATH": "C:\\msys64\\usr\\lib"}, kernel=kernel,
                                       install=cpu_install(), torch={"import_error": error}))
    assert report.primary.code == "TORCH_IMPORT_BROKEN", str(report)
    assert "LD_LIBRARY_PATH_SHADOWING" not in report.codes
