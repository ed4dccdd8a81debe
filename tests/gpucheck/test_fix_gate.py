"""The one fix gate (issue 49): a fix whose precondition the evidence contradicts is never printed, whichever rule
wrote it; unknown never contradicts; a finding left with nothing says where it fails and what tells more."""

from __future__ import annotations

from machine_space import MachineState

from jupyter_gpu.gpucheck.diagnose.engine import diagnose
from jupyter_gpu.gpucheck.diagnose.fix_gate import FIX_KINDS, WITHHELD, gate_finding
from jupyter_gpu.gpucheck.diagnose.view import FactsView
from jupyter_gpu.models import Finding

HEALTHY = MachineState("nvidia", True, "present", None, None, "ok", None, "pip-cu128", "linux-x86_64")


def state(**changes) -> MachineState:
    return MachineState(**{**HEALTHY.__dict__, **changes})


def test_a_healthy_machine_has_nothing_withheld():
    report = diagnose(HEALTHY.snapshot())
    assert report.gpu_usable and not any(WITHHELD in f.evidence for f in report.findings)


def test_a_fix_from_any_rule_is_dropped_where_the_machine_contradicts_it_and_the_reason_is_shown():
    # A rule that knew nothing of containers: the gate still drops its module commands there, and says why.
    view = FactsView(state(container="docker", module_loaded=False).snapshot())
    finding = Finding("DRIVER_NOT_LOADED", "fail", "An NVIDIA GPU is installed but the driver is not loaded.",
                      fix=["sudo modprobe nvidia", "sudo dkms autoinstall"])
    gated = gate_finding(finding, view)
    assert not any("modprobe" in line or "dkms" in line for line in gated.fix)
    assert any("container" in reason for reason in gated.evidence[WITHHELD])
    # Nothing is left: the finding names its layer and the command that tells more, not the nearest fix.
    assert gated.fix[-1].startswith("No fix applies to this machine") and "lsmod" in gated.fix[-1]


def test_unknown_never_contradicts():
    # A snapshot that read nothing about the module or the PCI bus (a Windows-style gathering): modprobe is kept,
    # since nothing shows it cannot help.
    snapshot = HEALTHY.snapshot()
    snapshot["system"]["driver"] = {}
    snapshot["system"]["pci_gpus"] = []
    finding = Finding("DRIVER_NOT_LOADED", "fail", "x", fix=["sudo modprobe nvidia"])
    assert gate_finding(finding, FactsView(snapshot)).fix == ["sudo modprobe nvidia"]


def test_a_pip_cuda_index_is_withheld_for_a_conda_torch_and_kept_for_pip():
    line = "%pip install --force-reinstall torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124"
    finding = Finding("CPU_ONLY_BUILD", "fail", "x", fix=[line, "conda install -c conda-forge 'pytorch=*=cuda*'"])
    conda = gate_finding(finding, FactsView(state(torch="conda-cpu").snapshot()))
    assert line not in conda.fix and conda.fix == ["conda install -c conda-forge 'pytorch=*=cuda*'"]
    assert gate_finding(finding, FactsView(state(torch="pip-cpu").snapshot())).fix == finding.fix


def test_every_fix_kind_states_its_preconditions_in_words():
    for kind in FIX_KINDS:
        assert kind.preconditions and all(p.needs for p in kind.preconditions), kind.name
