"""Neighbours of the Jetson case (issue 49): a Jetson whose torch is not the build for the JetPack it runs. Each
situation comes from public reports, cited beside it.

The rule these check is about the platform layer, not one wheel's name: on a Jetson (L4T's /etc/nv_tegra_release,
the Tegra libcuda, /dev/nvhost-*) torch must be a Jetson build for THIS JetPack (its CUDA and GPU architectures,
whatever its version string says), and no finding may offer a wheel that cannot run there: PyPI's or
download.pytorch.org's CUDA indexes (built for x86_64 or for server-class aarch64, SBSA), or a PyPI reinstall of an
NVIDIA version that PyPI never had. Written before the rules changed: the note of issue 49 says how many failed
first.
"""

from __future__ import annotations

import re

from fake_machine import Machine

NVML_LIBRARY_NOT_FOUND = 12
TEGRA = "/usr/lib/aarch64-linux-gnu/tegra"
# /etc/nv_tegra_release's first line, as each L4T release writes it, and the kernel each JetPack boots.
RELEASE = "# R{} (release), REVISION: {}, GCID: {}, BOARD: {}, EABI: aarch64, DATE: {}"
R32_2 = RELEASE.format("32", "2.1", "16294929", "t210ref", "Tue Aug 13 04:45:36 UTC 2019")
R32_4 = RELEASE.format("32", "4.3", "21589087", "t210ref", "Fri Jun 26 04:38:25 UTC 2020")
R35_4 = RELEASE.format("35", "4.1", "33958178", "t186ref", "Tue Aug  1 19:57:35 UTC 2023")
R35_6 = RELEASE.format("35", "6.0", "36191598", "t186ref", "Mon May 13 18:10:19 UTC 2024")
R36_3 = RELEASE.format("36", "3.0", "36191598", "generic", "Mon May  6 17:34:21 UTC 2024")
R36_4 = RELEASE.format("36", "4.0", "37537400", "generic", "Fri Sep 13 04:36:44 UTC 2024")
R36_43 = RELEASE.format("36", "4.3", "38968081", "generic", "Wed Jan  8 01:49:37 UTC 2025")
R38_2 = RELEASE.format("38", "2.0", "41844464", "generic", "Fri Aug 22 00:55:42 UTC 2025")
KERNEL = {"32": "4.9.140-tegra", "35": "5.10.120-tegra", "36": "5.15.148-tegra", "38": "6.8.12-tegra"}
ORIN = {"name": "Orin", "capability": [8, 7], "memory_total": 7_620_000_000, "uuid": None}
THOR = {"name": "NVIDIA Thor", "capability": [11, 0], "memory_total": 131_000_000_000, "uuid": None}
# torch's own arch lists: NVIDIA's JetPack 5 wheels (TORCH_CUDA_ARCH_LIST 7.2;8.7), a JetPack 6 build (8.7), and the
# aarch64 (SBSA) wheels of download.pytorch.org, built for server GPUs.
JP5_ARCH = ["sm_72", "sm_87"]
JP6_ARCH = ["sm_87"]
SBSA_CU124_ARCH = ["sm_50", "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"]
SBSA_CU129_ARCH = ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
NO_KERNEL_IMAGE = ("CUDA error: no kernel image is available for execution on the device\nCUDA kernel errors might be "
                   "asynchronously reported at some other API call, so the stacktrace below might be incorrect.")


def jetson(release: str, kernel: str | None = None) -> Machine:
    """A Jetson as L4T lays it out: the release file, the Tegra libcuda, nvhost nodes, no PCI GPU and (before
    JetPack 6) no NVML; the kernel is the host's even inside a container, /etc/nv_tegra_release the image's."""
    l4t_major = release.split()[1].lstrip("R")
    machine = Machine(files={"/etc/nv_tegra_release": release + "\n", f"{TEGRA}/libcuda.so.1.1": "",
                             "/proc/sys/kernel/osrelease": (kernel or KERNEL[l4t_major]) + "\n"},
                      symlinks={f"{TEGRA}/libcuda.so.1": "libcuda.so.1.1"},
                      nodes=["nvhost-ctrl", "nvhost-ctrl-gpu", "nvhost-gpu", "nvmap"])
    machine.nvml = {"init_error": NVML_LIBRARY_NOT_FOUND}
    return machine


def jetson_torch(machine: Machine, version: str, cuda: str, **extra) -> Machine:
    """A CUDA torch that pins no nvidia-* wheel on aarch64: NVIDIA's Jetson wheels declare none, and the pins of
    download.pytorch.org's wheels carry `platform_machine == "x86_64"`."""
    return machine.cuda_torch(version, cuda, pins_cuda_wheels=False, **extra)


def fixes(report) -> str:
    return "\n".join(line for finding in report.findings for line in finding.fix)


def assert_no_server_wheel(report) -> None:
    """No finding offers what cannot run on a Jetson: a download.pytorch.org CUDA index, a +cuXXX wheel, conda-forge's
    CUDA build (no Jetson architectures), or a PyPI reinstall of NVIDIA's own version (PyPI never had it)."""
    text = fixes(report)
    assert "download.pytorch.org" not in text, text
    assert not re.search(r"torch==[\w.*]+\+cu\d+", text), text
    assert 'pytorch=*=cuda*' not in text, text
    assert not re.search(r"torch==[\w.+]*nv\d\d", text), text


# -- NVIDIA's Jetson torch, built for another JetPack ----------------------------------------------------------------

def test_a_jetpack_5_container_on_a_jetpack_6_host_is_named_as_built_for_jetpack_5(check_machine):
    # dustynv/l4t-ml:r35.4.1 (torch 2.1.0a0+41361538.nv23.06, CUDA 11.4) on an AGX Orin flashed with JetPack 6.1
    # (L4T 36.4.0): torch cannot use CUDA; "r35.4 -> r36 was a big jump ... those definitely needed rebuilt"
    # (dusty-nv/jetson-containers#725). In the container /etc/nv_tegra_release is the image's (R35.4.1); the kernel
    # (5.15-tegra) is the host's JetPack 6.
    machine = jetson_torch(jetson(R35_4, kernel=KERNEL["36"]), "2.1.0a0+41361538.nv23.06", "11.4", arch=JP5_ARCH,
                           devices=[], device_count=0)
    report = check_machine(machine)
    primary = report.primary
    assert primary.code == "JETSON_NEEDS_JETPACK_TORCH", (primary.code, primary.headline)
    assert "JetPack 6" in primary.headline and "JetPack 5" in primary.headline, primary.headline
    assert "5.15.148-tegra" in str(primary.evidence)
    assert "jetson-ai-lab.io/jp6" in fixes(report) or "py3-igpu" in fixes(report)
    assert_no_server_wheel(report)


def test_nvidias_jetpack_5_wheel_on_jetpack_6_2_names_the_missing_cudnn_8(check_machine):
    # NVIDIA's JetPack 5 wheel (2.0.0a0+ec3941ad.nv23.02, CUDA 11.4, cuDNN 8) kept after flashing JetPack 6.2, whose
    # L4T R36.4.3 has CUDA 12.6 and cuDNN 9.3 (pytorch/TensorRT#3211 lists JetPack 6.1's CUDA 12.6 and cuDNN 9.3;
    # dusty-nv/jetson-containers#725: JetPack 5 builds do not run on R36).
    error = "libcudnn.so.8: cannot open shared object file: No such file or directory"
    report = check_machine(jetson_torch(jetson(R36_43), "2.0.0a0+ec3941ad.nv23.02", "11.4", import_error=error))
    primary = report.primary
    assert primary.code == "JETSON_NEEDS_JETPACK_TORCH", (primary.code, primary.headline)
    assert "JetPack 6.2" in primary.headline and "JetPack 5" in primary.headline, primary.headline
    assert "libcudnn.so.8" in primary.headline
    assert "https://pypi.jetson-ai-lab.io/jp6/cu126" in fixes(report)
    assert_no_server_wheel(report)


def test_a_jetpack_4_2_wheel_on_jetpack_4_4_names_cuda_10_0_against_10_2(check_machine):
    # JetPack 4.4 (L4T R32.4.x, CUDA 10.2) with the torch 1.4.0 wheel of JetPack 4.2/4.3 (CUDA 10.0):
    # "ImportError: libcudart.so.10.0: cannot open shared object file"; "are you on JetPack 4.4? ... uninstall
    # torch ... and instead install from here" (dusty-nv/jetson-inference#559, again in #622).
    error = "libcudart.so.10.0: cannot open shared object file: No such file or directory"
    report = check_machine(jetson_torch(jetson(R32_4), "1.4.0", "10.0", import_error=error))
    primary = report.primary
    assert primary.code == "JETSON_NEEDS_JETPACK_TORCH", (primary.code, primary.headline)
    assert "JetPack 4.4" in primary.headline and "CUDA 10.0" in primary.headline, primary.headline
    assert "libcudart.so.10.0" in primary.headline
    assert "forums.developer.nvidia.com/t/pytorch-for-jetson/72048" in fixes(report)
    assert "jetson-ai-lab" not in fixes(report)  # JetPack 6's index
    assert_no_server_wheel(report)


def test_a_jetpack_4_4_wheel_on_a_cuda_10_0_image_is_named_the_other_way_round(check_machine):
    # A Jetson Nano image with CUDA 10.0 preinstalled (JetPack 4.2.x) and a torch built for CUDA 10.2:
    # "ImportError: libcudart.so.10.2: cannot open shared object file" (NVIDIA-AI-IOT/jetracer#88).
    error = "libcudart.so.10.2: cannot open shared object file: No such file or directory"
    report = check_machine(jetson_torch(jetson(R32_2), "1.2.0", "10.2", import_error=error))
    primary = report.primary
    assert primary.code == "JETSON_NEEDS_JETPACK_TORCH", (primary.code, primary.headline)
    assert "CUDA 10.2" in primary.headline and "libcudart.so.10.2" in primary.headline, primary.headline
    assert_no_server_wheel(report)


# -- server-class (SBSA) CUDA wheels on a Jetson -----------------------------------------------------------------------

def test_download_pytorchs_aarch64_cu124_wheel_on_jetpack_6_2_gets_jetpacks_index_only(check_machine):
    # A Jetson Orin NX on JetPack 6.2: a pip-installed torch, "cuda device is not available"
    # (naseemap47/streamlit-yolo#22). download.pytorch.org's aarch64 wheels are SBSA builds (bitsandbytes-foundation/
    # bitsandbytes#1941: "aarch64 wheels are aarch64-sbsa, not L4T (Jetson)").
    machine = jetson_torch(jetson(R36_43), "2.5.1+cu124", "12.4", arch=SBSA_CU124_ARCH, devices=[], device_count=0)
    report = check_machine(machine)
    primary = report.primary
    assert primary.code == "JETSON_NEEDS_JETPACK_TORCH", (primary.code, primary.headline)
    assert "SBSA" in primary.headline or "server" in primary.headline, primary.headline
    assert "https://pypi.jetson-ai-lab.io/jp6/cu126" in fixes(report)
    assert_no_server_wheel(report)


def test_an_sbsa_wheel_whose_cuda_is_newer_than_jetpack_6_0_is_not_sent_to_another_cuda_index(check_machine):
    # JetPack 6.0 (L4T R36.3, CUDA 12.2) with a download.pytorch.org CUDA wheel: torch.cuda.is_available() False
    # (dusty-nv/jetson-containers#391, "--index-url https://download.pytorch.org/whl/cu121 gives
    # torch.cuda.is_available() as False"); torch says the driver is too old for its CUDA 12.4.
    too_old = ("CUDA initialization: The NVIDIA driver on your system is too old (found version 12020). Please "
               "update your GPU driver by downloading and installing a new version from the URL: "
               "http://www.nvidia.com/Download/index.aspx")
    machine = jetson_torch(jetson(R36_3), "2.5.1+cu124", "12.4", arch=SBSA_CU124_ARCH, devices=[], device_count=0,
                           warnings=[too_old])
    report = check_machine(machine)
    assert report.primary.code == "JETSON_NEEDS_JETPACK_TORCH", (report.primary.code, report.primary.headline)
    assert "JetPack 6.0" in report.primary.headline
    assert "https://pypi.jetson-ai-lab.io/jp6/cu122" in fixes(report)
    assert_no_server_wheel(report)


def test_a_cuda_12_build_on_jetpack_5_is_named_not_sent_to_download_pytorch(check_machine):
    # JetPack 5.1.4 (L4T R35.6, CUDA 11.4) with torch 2.3.0 built for CUDA 12.2: "RuntimeError: The NVIDIA driver
    # on your system is too old (found version 11040)" (pytorch/pytorch#139210).
    too_old = ("The NVIDIA driver on your system is too old (found version 11040). Please update your GPU driver by "
               "downloading and installing a new version from the URL: http://www.nvidia.com/Download/index.aspx")
    machine = jetson_torch(jetson(R35_6), "2.3.0", "12.2", arch=JP6_ARCH, devices=[], device_count=0,
                           init_error=too_old)
    report = check_machine(machine)
    primary = report.primary
    assert primary.code == "JETSON_NEEDS_JETPACK_TORCH", (primary.code, primary.headline)
    assert "CUDA 12.2" in primary.headline and "CUDA 11.4" in primary.headline, primary.headline
    assert "developer.download.nvidia.com/compute/redist/jp/" in fixes(report)
    assert_no_server_wheel(report)


def test_a_cu129_wheel_on_jetson_thor_gets_the_jetpack_7_index(check_machine):
    # Jetson AGX Thor (JetPack 7, L4T R38, CUDA 13.0, sm_110): uv resolved torch from download.pytorch.org/whl/cu129,
    # "which CUDA 12.9 wheels were not built for"; what worked: "https://pypi.jetson-ai-lab.io/sbsa/cu130"
    # (pollen-robotics/microduck_rl#38).
    machine = jetson_torch(jetson(R38_2), "2.8.0+cu129", "12.9", arch=SBSA_CU129_ARCH, devices=[THOR],
                           init_error=NO_KERNEL_IMAGE)
    report = check_machine(machine)
    assert report.primary.code == "JETSON_NEEDS_JETPACK_TORCH", (report.primary.code, report.primary.headline)
    assert "https://pypi.jetson-ai-lab.io/sbsa/cu130" in fixes(report)
    assert_no_server_wheel(report)


# -- guards: what already reads right stays ---------------------------------------------------------------------

def test_pypis_cpu_wheel_on_a_jetson_keeps_its_verdict(check_machine):
    # `pip install torch` on an AGX Orin (JetPack 5.1.2) "installs a generic manylinux version that does not support
    # CUDA on Jetson hardware" (pinokiocomputer/pinokio#1027).
    report = check_machine(jetson(R35_4).cpu_torch("2.5.1"))
    assert report.primary.code == "JETSON_NEEDS_JETPACK_TORCH"
    assert report.primary.headline.startswith("This is a Jetson (L4T R35.4.1, JetPack 5.1.2), and torch 2.5.1 is not")
    assert {f.code for f in report.findings}.isdisjoint({"CPU_ONLY_BUILD", "NO_NVIDIA_GPU"})
    assert_no_server_wheel(report)


def test_nvidias_matching_wheel_that_works_gets_no_failure(check_machine):
    # The JetPack 5.1.2 wheel on JetPack 5.1.2 (pinokiocomputer/pinokio#1027 names it:
    # torch-2.1.0a0+41361538.nv23.06 from redist/jp/v512): the GPU works, nothing fails.
    machine = jetson_torch(jetson(R35_4), "2.1.0a0+41361538.nv23.06", "11.4", arch=JP5_ARCH, devices=[ORIN])
    report = check_machine(machine)
    assert report.gpu_usable
    assert not [f for f in report.findings if f.severity == "fail"], [f.code for f in report.findings]


def test_a_jetson_ai_lab_wheel_without_an_nv_tag_that_works_gets_no_failure(check_machine):
    # The Jetson AI Lab's JetPack 6 wheels carry no .nv tag (torch 2.5.0 from https://pypi.jetson-ai-lab.dev/jp6/cu126,
    # pytorch/TensorRT#3453): built for CUDA 12.6 and sm_87, they work on JetPack 6.1.
    machine = jetson_torch(jetson(R36_4), "2.5.0", "12.6", arch=JP6_ARCH, devices=[ORIN])
    report = check_machine(machine)
    assert report.gpu_usable
    assert not [f for f in report.findings if f.severity == "fail"], [f.code for f in report.findings]


def test_a_build_that_says_nothing_of_its_target_is_called_unknown_not_wrong(check_machine):
    # A source build on JetPack 6.1 that recorded no architecture list (torch._C._cuda_getArchFlags() returns None;
    # pytorch/pytorch#143624 builds 2.5.1 on an Orin): its CUDA is JetPack's, nothing says which GPUs it targets.
    machine = jetson_torch(jetson(R36_4), "2.5.1a0+gita8d6afb", "12.6", arch=None, devices=[], device_count=0)
    machine.torch["arch"] = None
    report = check_machine(machine)
    codes = {f.code for f in report.findings}
    assert "JETSON_NEEDS_JETPACK_TORCH" not in codes and "JETSON_TORCH_BUILD_UNKNOWN" in codes, codes
    unknown = next(f for f in report.findings if f.code == "JETSON_TORCH_BUILD_UNKNOWN")
    assert "cannot be told" in unknown.headline and "JetPack 6.1" in unknown.headline
    assert_no_server_wheel(report)
