"""Neighbours of the nvidia-* wheel case (issue 49): a wheel of the OTHER CUDA major left beside torch, or a package
that pinned another version of torch's wheel. Each situation comes from a public report, cited beside it.

The layer these check: the nvidia-* wheels of both CUDA majors install the same paths (nvidia/nccl/lib/libnccl.so.2
is in nvidia-nccl-cu11, -cu12 and -cu13 alike), so whichever was installed last is the file torch loads, while pip's
metadata still says torch's own wheel is there at the right version. The finding names the stray wheel and who asked
for it; "reinstall torch" alone leaves the stray in place. Written before the rules changed: the note of issue 49
says how many failed first.
"""

from __future__ import annotations

from fake_machine import Machine

NCCL_LIB = "nvidia/nccl/lib/libnccl.so.2"
LINUX_X86 = '; platform_system == "Linux" and platform_machine == "x86_64"'


def fixes(report) -> str:
    return "\n".join(line for finding in report.findings for line in finding.fix)


def nccl_beside(torch_version: str, cuda: str, own: tuple[str, str], stray: tuple[str, str], symbol: str,
                *, stray_requires: dict[str, tuple[str, list[str]]] | None = None) -> Machine:
    """torch whose pinned NCCL wheel `own` (name, version) shares libnccl.so.2 with a `stray` one installed after it;
    `import torch` then fails on a symbol the stray's older NCCL lacks."""
    error = f"/usr/local/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so: undefined symbol: {symbol}"
    driver = ("580.95.05", 13000) if cuda.startswith("13") else ("570.124.06", 12080)
    machine = Machine().nvidia_host(*driver).cuda_torch(torch_version, cuda, import_error=error,
                                                        requires=[f"{own[0]}=={own[1]}{LINUX_X86}"])
    machine.wheel(own[0], own[1], files=[NCCL_LIB])
    machine.wheel(stray[0], stray[1], files=[NCCL_LIB])  # installed last: its libnccl.so.2 is the one on disk
    for name, (version, requires) in (stray_requires or {}).items():
        machine.wheel(name, version, requires)
    return machine


def test_a_cu12_nccl_wheel_beside_a_cu13_torch_is_named(check_machine):
    # `[pip3] nvidia-nccl-cu12==2.29.3` and `[pip3] nvidia-nccl-cu13==2.29.7` beside torch for CUDA 13; importing
    # torch: "undefined symbol ncclCommResume"; "Uninstall the nvidia-nccl-cu12 package" (pytorch/pytorch#186591).
    report = check_machine(nccl_beside("2.13.0+cu130", "13.0", ("nvidia-nccl-cu13", "2.29.7"),
                                       ("nvidia-nccl-cu12", "2.29.3"), "ncclCommResume"))
    primary = report.primary
    assert primary.code == "STRAY_NVIDIA_WHEEL", (primary.code, primary.headline)
    assert "nvidia-nccl-cu12 2.29.3" in primary.headline and "CUDA 12" in primary.headline
    assert "libnccl.so.2" in primary.headline and "nvidia-nccl-cu13==2.29.7" in primary.headline
    assert primary.fix[0] == "%pip uninstall -y nvidia-nccl-cu12"
    # The two wheels share the file: uninstalling the stray removes it, so torch's own is put back.
    assert "%pip install --force-reinstall --no-deps nvidia-nccl-cu13==2.29.7" in primary.fix[1]


def test_a_leftover_cu11_nccl_beside_a_cu12_torch_is_named(check_machine):
    # CI with `nvidia-nccl-cu11==2.14.3` and `nvidia-nccl-cu12==2.27.3` (and most other nvidia packages in both
    # majors): `import torch` fails with "libtorch_cuda.so: undefined symbol: ncclMemFree" (rwth-i6/returnn#1802).
    report = check_machine(nccl_beside("2.8.0+cu128", "12.8", ("nvidia-nccl-cu12", "2.27.3"),
                                       ("nvidia-nccl-cu11", "2.14.3"), "ncclMemFree"))
    primary = report.primary
    assert primary.code == "STRAY_NVIDIA_WHEEL", (primary.code, primary.headline)
    assert "nvidia-nccl-cu11 2.14.3" in primary.headline and "CUDA 11" in primary.headline
    assert primary.fix[0] == "%pip uninstall -y nvidia-nccl-cu11"
    assert not primary.fix[0].startswith("%pip install --force-reinstall torch")


def test_a_cu12_nccl_a_base_image_left_beside_a_cu13_torch_is_named(check_machine):
    # A base container's requirements put nvidia-nccl-cu12 2.21.5 beside torch 2.13.0 (CUDA 13): "libtorch_cuda.so:
    # undefined symbol: ncclCommResume" (GoogleCloudPlatform/scientific-computing-examples#157).
    report = check_machine(nccl_beside("2.13.0+cu130", "13.0", ("nvidia-nccl-cu13", "2.29.7"),
                                       ("nvidia-nccl-cu12", "2.21.5"), "ncclCommResume"))
    primary = report.primary
    assert primary.code == "STRAY_NVIDIA_WHEEL", (primary.code, primary.headline)
    assert "nvidia-nccl-cu12 2.21.5" in primary.headline
    assert primary.evidence["asked for by"] is None  # a requirements file installed it, no package asks for it


def test_a_stray_wheel_another_package_asks_for_names_that_package(check_machine):
    # The same stray when a package asks for it: tensorflow[and-cuda] 2.15's METADATA pins nvidia-nccl-cu12==2.16.5
    # (the package pytorch/pytorch#120186 blamed: "I think tensorflow-gpu ruined my enviroment"). Uninstalling the
    # stray alone would break tensorflow, so the fix names it and says to keep the two apart.
    report = check_machine(nccl_beside(
        "2.13.0+cu130", "13.0", ("nvidia-nccl-cu13", "2.29.7"), ("nvidia-nccl-cu12", "2.16.5"), "ncclCommResume",
        stray_requires={"tensorflow": ("2.15.0", ["nvidia-nccl-cu12 ==2.16.5 ; extra == 'and-cuda'"])}))
    primary = report.primary
    assert primary.code == "STRAY_NVIDIA_WHEEL", (primary.code, primary.headline)
    assert "tensorflow 2.15.0" in "\n".join(primary.fix) and "environment" in "\n".join(primary.fix)
    assert primary.evidence["asked for by"] == ["tensorflow 2.15.0 (nvidia-nccl-cu12==2.16.5)"]


def test_tensorflows_older_nccl_pin_is_named_as_the_package_that_pinned_it(check_machine):
    # tensorflow[and-cuda] 2.15 pins nvidia-nccl-cu12==2.16.5 while torch 2.2.0 pins 2.19.3: "undefined symbol:
    # ncclCommRegister" ("I think tensorflow-gpu ruined my enviroment", pytorch/pytorch#120186; the cause, another
    # package providing NCCL, in pytorch/pytorch#119932). tensorflow's METADATA writes the pin with an extra marker.
    error = "/opt/venv/lib/python3.10/site-packages/torch/lib/libtorch_cuda.so: undefined symbol: ncclCommRegister"
    machine = Machine().nvidia_host().cuda_torch("2.2.0+cu121", "12.1", import_error=error,
                                                 requires=[f"nvidia-nccl-cu12==2.19.3{LINUX_X86}"])
    machine.wheel("nvidia-nccl-cu12", "2.16.5", files=[NCCL_LIB])
    machine.wheel("tensorflow", "2.15.0", ["nvidia-nccl-cu12 ==2.16.5 ; extra == 'and-cuda'"])
    primary = check_machine(machine).primary
    assert primary.code == "NVIDIA_WHEEL_MISMATCH", (primary.code, primary.headline)
    assert primary.fix[0] == "%pip install nvidia-nccl-cu12==2.19.3"
    assert "tensorflow 2.15.0" in "\n".join(primary.fix)


def test_guard_stray_cu11_wheels_beside_a_working_cu13_torch_do_not_fail_the_check(check_machine):
    # Four nvidia-*-cu11 pins left over from an older torch beside torch 2.13.0+cu130, which trains fine
    # (microsoft/CyberBattleSim#189): nothing is broken, so no failure is reported and the GPU is usable.
    machine = Machine().nvidia_host(driver="580.95.05", cuda=13000).cuda_torch(
        "2.13.0+cu130", "13.0", requires=[f"nvidia-nccl-cu13==2.28.9{LINUX_X86}"])
    machine.wheel("nvidia-nccl-cu13", "2.28.9", files=[NCCL_LIB])
    for name, version in (("nvidia-cublas-cu11", "11.10.3.66"), ("nvidia-cuda-nvrtc-cu11", "11.7.99"),
                          ("nvidia-cuda-runtime-cu11", "11.7.99"), ("nvidia-cudnn-cu11", "8.5.0.96")):
        machine.wheel(name, version)
    report = check_machine(machine)
    assert report.gpu_usable
    assert not [f for f in report.findings if f.severity == "fail"], [f.code for f in report.findings]
