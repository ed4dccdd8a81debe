"""Neighbours of the shared-library layer (issue 49): `import torch` fails with `libX.so.N: cannot open shared
object file` or `undefined symbol: ...`. Each situation comes from a public report, cited beside it.

What a user needs to read in the headline: the library file that was loaded (or not found), who owns it (a pip
wheel's nvidia-* distribution, a conda package, a system CUDA reached through LD_LIBRARY_PATH) and what torch
expects (its Requires-Dist pin). LD_LIBRARY_PATH is blamed only where one of its folders holds that library.
Written before the rules changed: the note of issue 49 says how many failed first.
"""

from __future__ import annotations

from fake_machine import Machine

LINUX_X86 = '; platform_system == "Linux" and platform_machine == "x86_64"'
SITE = "/usr/local/lib/python3.10/dist-packages"


def fixes(report) -> str:
    return "\n".join(line for finding in report.findings for line in finding.fix)


def test_a_system_cuda_nvjitlink_on_ld_library_path_is_named_with_torchs_wheel(check_machine):
    # LD_LIBRARY_PATH=/usr/local/cuda-12.1/lib64; `ldd .../nvidia/cusparse/lib/libcusparse.so.12` shows
    # "libnvJitLink.so.12 => /usr/local/cuda-12.1/lib64/libnvJitLink.so.12" (infiniflow/ragflow#4466); the same
    # error in pytorch/pytorch#111469. torch 2.5.1+cu124 pins nvidia-nvjitlink-cu12==12.4.127.
    error = (f"{SITE}/torch/lib/../../nvidia/cusparse/lib/libcusparse.so.12: undefined symbol: "
             "__nvJitLinkComplete_12_4, version libnvJitLink.so.12")
    machine = Machine(env={"LD_LIBRARY_PATH": "/usr/local/cuda-12.1/lib64:"}).nvidia_host()
    machine.files["/usr/local/cuda-12.1/lib64/libnvJitLink.so.12.1.105"] = ""
    machine.symlinks["/usr/local/cuda-12.1/lib64/libnvJitLink.so.12"] = "libnvJitLink.so.12.1.105"
    machine.cuda_torch("2.5.1+cu124", "12.4", import_error=error,
                       requires=[f"nvidia-nvjitlink-cu12==12.4.127{LINUX_X86}"])
    machine.wheel("nvidia-nvjitlink-cu12", "12.4.127", files=["nvidia/nvjitlink/lib/libnvJitLink.so.12"])
    report = check_machine(machine)
    primary = report.primary
    assert primary.code == "LD_LIBRARY_PATH_SHADOWING", (primary.code, primary.headline)
    assert "/usr/local/cuda-12.1/lib64/libnvJitLink.so.12" in primary.headline
    assert "nvidia-nvjitlink-cu12==12.4.127" in primary.headline
    assert primary.evidence["owner"] == "no Python package (a CUDA toolkit installed on the system)"
    assert "/usr/local/cuda-12.1/lib64" in primary.fix[0]


def test_a_conda_library_on_ld_library_path_names_its_conda_package(check_machine):
    # On Kaggle, LD_LIBRARY_PATH starts with /opt/conda/lib and pip's torch fails with "libcusparse.so.12: undefined
    # symbol: __nvJitLinkComplete_12_4, version libnvJitLink.so.12" (pytorch/pytorch#134929). The libnvJitLink.so.12
    # there belongs to a conda package, named from /opt/conda/conda-meta.
    error = ("/opt/conda/lib/python3.10/site-packages/torch/lib/../../nvidia/cusparse/lib/libcusparse.so.12: "
             "undefined symbol: __nvJitLinkComplete_12_4, version libnvJitLink.so.12")
    machine = Machine(env={"LD_LIBRARY_PATH": "/opt/conda/lib:/usr/local/nvidia/lib64"}).nvidia_host()
    machine.files["/opt/conda/lib/libnvJitLink.so.12.3.101"] = ""
    machine.symlinks["/opt/conda/lib/libnvJitLink.so.12"] = "libnvJitLink.so.12.3.101"
    machine.files["/opt/conda/conda-meta/libnvjitlink-12.3.101-hd3aeb46_0.json"] = (
        '{"name": "libnvjitlink", "version": "12.3.101", "build": "hd3aeb46_0", '
        '"channel": "https://conda.anaconda.org/conda-forge/linux-64", '
        '"files": ["lib/libnvJitLink.so.12", "lib/libnvJitLink.so.12.3.101"]}')
    machine.cuda_torch("2.5.1+cu124", "12.4", import_error=error,
                       requires=[f"nvidia-nvjitlink-cu12==12.4.127{LINUX_X86}"])
    machine.wheel("nvidia-nvjitlink-cu12", "12.4.127", files=["nvidia/nvjitlink/lib/libnvJitLink.so.12"])
    primary = check_machine(machine).primary
    assert primary.code == "LD_LIBRARY_PATH_SHADOWING", (primary.code, primary.headline)
    assert "/opt/conda/lib/libnvJitLink.so.12" in primary.headline
    assert "conda package libnvjitlink 12.3.101" in primary.headline
    assert "/opt/conda/lib" in primary.fix[0] and "/usr/local/nvidia/lib64" not in primary.fix[0]


def test_a_system_cublaslt_beside_the_cublas_wheel_is_named(check_machine):
    # torch 1.13 in a Google Cloud deep-learning image (CUDA 11.3 on the system) with pip's nvidia-cublas-cu11:
    # ".../nvidia/cublas/lib/libcublas.so.11: undefined symbol: cublasLtGetStatusString, version libcublasLt.so.11";
    # uninstalling the wheel "starts working" (pytorch/pytorch#103832).
    error = (f"OSError: {SITE}/torch/lib/../../nvidia/cublas/lib/libcublas.so.11: undefined symbol: "
             "cublasLtGetStatusString, version libcublasLt.so.11")
    machine = Machine(env={"LD_LIBRARY_PATH": "/usr/local/cuda/lib64:/usr/local/nvidia/lib64"}).nvidia_host()
    machine.files["/usr/local/cuda-11.3/lib64/libcublasLt.so.11.5.1.109"] = ""
    machine.symlinks["/usr/local/cuda"] = "cuda-11.3"
    machine.symlinks["/usr/local/cuda-11.3/lib64/libcublasLt.so.11"] = "libcublasLt.so.11.5.1.109"
    machine.cuda_torch("1.13.0", "11.7", import_error=error, requires=[f"nvidia-cublas-cu11==11.10.3.66{LINUX_X86}"])
    machine.wheel("nvidia-cublas-cu11", "11.10.3.66",
                  files=["nvidia/cublas/lib/libcublas.so.11", "nvidia/cublas/lib/libcublasLt.so.11"])
    primary = check_machine(machine).primary
    assert primary.code == "LD_LIBRARY_PATH_SHADOWING", (primary.code, primary.headline)
    assert "/usr/local/cuda/lib64/libcublasLt.so.11" in primary.headline
    assert "nvidia-cublas-cu11==11.10.3.66" in primary.headline


def test_guard_ld_library_path_without_the_library_is_not_blamed(check_machine):
    # NVIDIA's CUDA images set LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64, which holds the
    # driver's libraries only (nvidia/cuda Dockerfiles). A missing cuDNN wheel there (libcudnn.so.9 "cannot open
    # shared object file", pytorch/pytorch#104259's kind) is the wheel's finding, never LD_LIBRARY_PATH's.
    error = "libcudnn.so.9: cannot open shared object file: No such file or directory"
    machine = Machine(env={"LD_LIBRARY_PATH": "/usr/local/nvidia/lib:/usr/local/nvidia/lib64"}).nvidia_host()
    machine.files["/usr/local/nvidia/lib64/libcuda.so.1"] = ""
    machine.cuda_torch("2.5.1+cu124", "12.4", import_error=error,
                       requires=[f"nvidia-cudnn-cu12==9.1.0.70{LINUX_X86}"])
    report = check_machine(machine)
    assert report.primary.code == "NVIDIA_WHEEL_MISMATCH"
    assert "LD_LIBRARY_PATH_SHADOWING" not in {f.code for f in report.findings}


def test_guard_an_unknown_library_error_with_ld_library_path_elsewhere_is_not_blamed_on_it(check_machine):
    # The same container variable beside an undefined symbol of torch's own library (a build mixed from two torch
    # versions, as in tests/gpucheck/test_catalogue_codes.py): LD_LIBRARY_PATH holds no such library, so the
    # reinstall of torch stays the finding.
    error = "/x/lib/libtorch_python.so: undefined symbol: _ZN3c104cuda9SetDeviceEi"
    machine = Machine(env={"LD_LIBRARY_PATH": "/usr/local/nvidia/lib:/usr/local/nvidia/lib64"}).nvidia_host()
    machine.files["/usr/local/nvidia/lib64/libcuda.so.1"] = ""
    report = check_machine(machine.cuda_torch(import_error=error))
    assert report.primary.code == "TORCH_IMPORT_BROKEN"
