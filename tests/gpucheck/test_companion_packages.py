"""TORCHVISION_MISMATCH: torchvision or torchaudio built for another torch, found on disk and, beside torch in
the probe child, by importing them (their error quoted verbatim). Fake machines, the real gathering and rules."""

from __future__ import annotations

from fake_machine import Machine

NMS = "RuntimeError: operator torchvision::nms does not exist"
CUDA_MAJOR = ("RuntimeError: Detected that PyTorch and torchvision were compiled with different CUDA major versions. "
              "PyTorch has CUDA Version=12.8 and torchvision has CUDA Version=11.8. Please reinstall the torchvision "
              "that matches your PyTorch install.")


def mismatch(report):
    found = [f for f in report.findings if f.code == "TORCHVISION_MISMATCH"]
    assert len(found) <= 1
    return found[0] if found else None


def test_a_pypi_torchvision_beside_a_cpu_torch_is_the_cuda_build_pypi_ships(check_machine):
    # pip install torch --index-url .../whl/cpu, then pip install torchvision: PyPI's Linux wheel is a CUDA build.
    report = check_machine(Machine().cpu_torch().companion("torchvision", "0.28.0", requires_torch="2.13.0"))
    finding = mismatch(report)
    assert finding.severity == "fail"
    assert "torchvision 0.28.0 does not pair with torch 2.13.0+cpu" in finding.headline
    assert "CUDA 13.0 build (cu130, PyPI), torch is a CPU-only build" in finding.headline
    assert finding.evidence["torchvision expected error"] == NMS  # no GPU evidence here: torch was not imported
    assert finding.fix[0].startswith("%pip install --force-reinstall --no-deps torchvision==0.28.0 "
                                     "--index-url https://download.pytorch.org/whl/cpu")
    # The GPU question still explains the verdict: the companion is not why PyTorch runs on the CPU.
    assert report.primary.code != "TORCHVISION_MISMATCH"


def test_a_cuda_torchvision_beside_a_cpu_torch_on_a_gpu_machine_quotes_the_real_import_error(check_machine):
    machine = Machine().nvidia_host().cpu_torch()
    machine.companion("torchvision", "0.28.0+cu126", requires_torch="2.13.0", import_error=NMS)
    finding = mismatch(check_machine(machine))
    assert finding.severity == "fail"
    assert finding.evidence["torchvision error"] == NMS  # imported beside torch in the probe child
    assert "`import torchvision` fails" in finding.headline
    assert "it is a CUDA 12.6 build (cu126), torch is a CPU-only build (cpu)" in finding.headline


def test_a_cu118_torchvision_beside_a_cu128_torch(check_machine):
    machine = Machine().nvidia_host().cuda_torch(version="2.9.1+cu128")
    machine.companion("torchvision", "0.24.1+cu118", requires_torch="2.9.1", import_error=CUDA_MAJOR)
    report = check_machine(machine)
    finding = mismatch(report)
    assert finding.severity == "fail" and report.primary is finding  # the GPU works; this is what fails
    assert finding.evidence["torchvision error"] == CUDA_MAJOR
    assert finding.fix[0].startswith("%pip install --force-reinstall --no-deps torchvision==0.24.1 "
                                     "--index-url https://download.pytorch.org/whl/cu128")


def test_without_the_probe_the_cuda_major_error_is_the_one_torchvision_will_raise(check_machine):
    # A saved snapshot of a machine whose probe did not run: the build labels alone tell the error.
    machine = Machine().cuda_torch(version="2.9.1+cu128").companion("torchvision", "0.24.1+cu118",
                                                                    requires_torch="2.9.1")
    finding = mismatch(check_machine(machine))
    assert finding.evidence["torchvision expected error"] == CUDA_MAJOR


def test_a_torchaudio_for_an_older_torch_that_still_imports_is_a_warning(check_machine):
    machine = Machine().nvidia_host().cuda_torch(version="2.9.1+cu128")
    machine.companion("torchvision", "0.24.1+cu128", requires_torch="2.9.1")
    machine.companion("torchaudio", "2.8.0+cu128", requires_torch="2.8.0")
    finding = mismatch(check_machine(machine))
    assert finding.severity == "warn"
    assert finding.headline == ("torchaudio 2.8.0+cu128 does not pair with torch 2.9.1+cu128: "
                                "it was built for torch 2.8.0.")
    assert finding.evidence["torchaudio import"] == "imported in the probe (2.8.0+cu128)"
    assert "--no-deps torchaudio==2.9.1 --index-url https://download.pytorch.org/whl/cu128" in finding.fix[0]


def test_both_companions_wrong_are_one_finding_with_one_command(check_machine):
    machine = Machine().cpu_torch(version="2.13.0+cpu")
    machine.companion("torchvision", "0.27.0+cu126", requires_torch="2.12.0")
    machine.companion("torchaudio", "2.12.0+cu126", requires_torch="2.12.0")
    finding = mismatch(check_machine(machine))
    assert "torchvision 0.27.0+cu126" in finding.headline and "torchaudio 2.12.0+cu126" in finding.headline
    assert "it was built for torch 2.12.0" in finding.headline
    assert finding.fix[0].startswith("%pip install --force-reinstall --no-deps torchvision==0.28.0 torchaudio==2.13.0 "
                                     "--index-url https://download.pytorch.org/whl/cpu")


def test_paired_companions_give_nothing(check_machine):
    machine = Machine().nvidia_host().cuda_torch(version="2.9.1+cu128")
    machine.companion("torchvision", "0.24.1+cu128", requires_torch="2.9.1")
    machine.companion("torchaudio", "2.9.1+cu128", requires_torch="2.9.1")
    report = check_machine(machine)
    assert mismatch(report) is None and report.status == "ok", str(report)


def test_a_cuda_minor_difference_is_not_a_mismatch(check_machine):
    # torchvision refuses only another CUDA major: cu126 beside cu128 loads and runs.
    machine = Machine().nvidia_host().cuda_torch(version="2.9.1+cu128")
    machine.companion("torchvision", "0.24.1+cu126", requires_torch="2.9.1")
    assert mismatch(check_machine(machine)) is None


def test_reinstalling_torch_pairs_the_installed_companions_too(check_machine):
    machine = Machine().nvidia_host().cpu_torch()
    machine.companion("torchvision", "0.28.0+cpu", requires_torch="2.13.0")
    machine.companion("torchaudio", "2.13.0+cpu", requires_torch="2.13.0")
    report = check_machine(machine)
    assert mismatch(report) is None
    cpu_only = next(f for f in report.findings if f.code == "CPU_ONLY_BUILD")
    assert '"torchvision==0.28.*" "torchaudio==2.13.*" --index-url' in cpu_only.fix[0]


def test_a_cpu_torchvision_beside_a_cuda_torch(check_machine):
    # The other way round: its ops have no CUDA kernels, so torchvision.ops.nms on a GPU tensor fails.
    machine = Machine().nvidia_host().cuda_torch(version="2.9.1+cu128")
    machine.companion("torchvision", "0.24.1+cpu", requires_torch="2.9.1")
    finding = mismatch(check_machine(machine))
    assert "it is a CPU-only build (cpu), torch is a CUDA 12.8 build (cu128)" in finding.headline
    assert finding.fix[0].startswith("%pip install --force-reinstall --no-deps torchvision==0.24.1 "
                                     "--index-url https://download.pytorch.org/whl/cu128")
