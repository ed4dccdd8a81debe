"""Neighbours of the companion-package case (issue 49): torchvision and torchaudio judged beside a torch that conda
installed. Each situation comes from a public report, cited beside it.

The layer these check: how each package was installed (pip, or conda and from which channel, as conda-meta/*.json
records it) comes before any guess from a version number. A conda package's build string says what it was built
for (cpu_..., cuda126_..., py311_cpu); an unlabelled version is PyPI's default build only when pip installed it.
Where torch came from conda, the fix is a conda command for torch's own channel, never a pip index. Written before the
rules changed: the note of issue 49 says how many failed first.
"""

from __future__ import annotations

from fake_machine import Machine


def companion_finding(report):
    return next((f for f in report.findings if f.code == "TORCHVISION_MISMATCH"), None)


def conda_cpu_torch(channel: str, torch_build: str, version: str = "2.5.1") -> Machine:
    """conda's CPU pytorch (no +cpu label, torch.version.cuda None) in the kernel's conda environment."""
    machine = Machine().nvidia_host().cpu_torch(version)
    return machine.conda_package("pytorch", version, torch_build, channel=channel, dists=["torch"])


def test_conda_forge_cpu_pytorch_and_torchvision_pair(check_machine):
    # `conda create -c conda-forge pytorch torchvision` resolving to the CPU builds of both (conda/conda#14761; the
    # CPU build of conda-forge's pytorch is named cpu_mkl_py3XX...): a pair, not a mismatch.
    machine = conda_cpu_torch("conda-forge", "cpu_mkl_py311h1f3ab6a_102")
    machine.companion("torchvision", "0.20.1", requires_torch="2.5.1")
    machine.conda_package("torchvision", "0.20.1", "cpu_py311h2a9a6bb_1", dists=["torchvision"])
    report = check_machine(machine)
    assert companion_finding(report) is None, companion_finding(report).headline
    assert "download.pytorch.org" not in "\n".join(line for f in report.findings for line in f.fix)


def test_pytorch_channel_cpuonly_pytorch_and_torchvision_pair(check_machine):
    # `conda install pytorch torchvision cpuonly -c pytorch`: the pytorch channel's CPU builds (py3.11_cpu_0 and
    # py311_cpu), torchvision's CPU package beside the CPU pytorch (pytorch/pytorch#6938, pytorch/vision#390).
    machine = conda_cpu_torch("pytorch", "py3.11_cpu_0")
    machine.companion("torchvision", "0.20.1", requires_torch="2.5.1")
    machine.conda_package("torchvision", "0.20.1", "py311_cpu", channel="pytorch", dists=["torchvision"])
    machine.companion("torchaudio", "2.5.1", requires_torch="2.5.1")
    machine.conda_package("torchaudio", "2.5.1", "py311_cpu", channel="pytorch", dists=["torchaudio"])
    report = check_machine(machine)
    assert companion_finding(report) is None, companion_finding(report).headline


def test_a_pip_torchvision_beside_conda_pytorch_gets_a_conda_command(check_machine):
    # conda's pytorch with torchvision from pip ("[conda] pytorch" beside "[pip3] torchvision"): "No such operator
    # torchvision::nms" (facebookresearch/detectron2#3351). The fix installs torchvision from torch's own channel.
    machine = conda_cpu_torch("conda-forge", "cpu_mkl_py311h1f3ab6a_102")
    machine.companion("torchvision", "0.20.1", requires_torch="2.5.1",
                      import_error="RuntimeError: operator torchvision::nms does not exist")
    finding = companion_finding(check_machine(machine))
    assert finding is not None and finding.severity == "fail"
    assert "pip" in finding.headline and "conda" in finding.headline and "conda-forge" in finding.headline
    fix = "\n".join(finding.fix)
    assert "%pip uninstall -y torchvision" in fix and "conda install -c conda-forge" in fix
    assert "download.pytorch.org" not in fix


def test_guard_pip_cpu_torch_with_pypis_torchvision_keeps_its_pip_index(check_machine):
    # pip's torch 2.2.1+cpu with PyPI's torchvision (a CUDA build on Linux): "operator torchvision::nms does not
    # exist", fixed from the cpu index (pytorch/pytorch#122494). No conda here: the pip command stays.
    machine = Machine().nvidia_host().cpu_torch("2.2.1+cpu")
    machine.companion("torchvision", "0.17.1", requires_torch="2.2.1",
                      import_error="RuntimeError: operator torchvision::nms does not exist")
    finding = companion_finding(check_machine(machine))
    assert finding is not None
    assert finding.fix[0].startswith("%pip install --force-reinstall --no-deps torchvision==0.17.1 "
                                     "--index-url https://download.pytorch.org/whl/cpu")
