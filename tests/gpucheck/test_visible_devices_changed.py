"""CUDA_VISIBLE_DEVICES changed after the kernel's CUDA started: caught by the GPUs' UUIDs, not only by their count.

Each case is a fake machine (stub NVML) gathered by the real code. The kernel's own torch, with CUDA already
initialised, is what this machine lacks, so it is a stand-in object passed as the kernel's modules; its device
UUIDs print as torch's `_CUuuid` does (bare 8-4-4-4-12 hex, no `GPU-` prefix).
"""

from __future__ import annotations

import types

import pytest
from fake_machine import H100, Machine, nvml_gpu

from jupyter_gpu.facts.gather import gather_facts
from jupyter_gpu.gpucheck.diagnose.engine import diagnose

CODE = "CUDA_VISIBLE_DEVICES_CHANGED_AFTER_INIT"
FIRST = dict(H100)  # GPU-1b2c3d4e-0000-1111-2222-333344445555
SECOND = dict(H100, uuid="GPU-2f3e4d5c-6b7a-4988-8776-655443322110")
A100 = "NVIDIA A100-SXM4-80GB"
MIG_A = "MIG-aa11bb22-cc33-4d44-8e55-ff6677889900"
MIG_B = "MIG-bb22cc33-dd44-4e55-8f66-007788990011"


class CudaUuid:
    """Stands in for torch._C._CUuuid: not a str, and str() of it has no GPU-/MIG- prefix."""

    def __init__(self, nvml_uuid: str) -> None:
        self._text = nvml_uuid.split("-", 1)[1]

    def __str__(self) -> str:
        return self._text


def kernel_torch(devices: list[tuple[str, str]]) -> types.SimpleNamespace:
    """A torch module whose CUDA the user already initialised, on these (name, NVML uuid) devices."""
    cuda = types.SimpleNamespace(
        is_initialized=lambda: True, device_count=lambda: len(devices),
        get_device_name=lambda i: devices[i][0],
        get_device_properties=lambda i: types.SimpleNamespace(uuid=CudaUuid(devices[i][1])))
    return types.SimpleNamespace(__version__="2.9.1+cu128", __file__=None, cuda=cuda)


@pytest.fixture
def check(tmp_path, bare_python):
    """Diagnose a fresh fake machine (its own folder, so one test can compare several)."""
    machines = iter(range(100))

    def run(visible: str | None, uses: list[tuple[str, str]], gpus: list[dict], **env: str):
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        machine = Machine(env=env).nvidia_host(devices=gpus).cuda_torch()
        ctx = machine.build(tmp_path / f"machine{next(machines)}", bare_python, modules={"torch": kernel_torch(uses)})
        return diagnose(gather_facts(ctx))

    return run


def changed(report):
    return next((f for f in report.findings if f.code == CODE), None)


def test_same_count_but_another_gpu_is_caught_and_both_gpus_are_named(check):
    report = check("1", uses=[(FIRST["name"], FIRST["uuid"])], gpus=[FIRST, SECOND])
    finding = changed(report)
    assert finding is not None, str(report)
    assert "selects GPU 1 (NVIDIA H100 80GB HBM3, GPU-2f3e4d5c)" in finding.headline
    assert "still uses cuda:0 = GPU 0 (NVIDIA H100 80GB HBM3, GPU-1b2c3d4e)" in finding.headline
    assert finding.fix == ["Restart the kernel and set the variable in the first cell, before `import torch`."]
    assert CODE in str(report)


def test_the_gpu_the_variable_still_selects_gives_nothing(check):
    report = check("1", uses=[(SECOND["name"], SECOND["uuid"])], gpus=[FIRST, SECOND])
    assert changed(report) is None


def test_the_same_gpus_in_another_order_are_caught(check):
    both = [(FIRST["name"], FIRST["uuid"]), (SECOND["name"], SECOND["uuid"])]
    assert changed(check("0,1", uses=both, gpus=[FIRST, SECOND])) is None
    finding = changed(check("1,0", uses=both, gpus=[FIRST, SECOND]))
    assert finding is not None
    assert finding.evidence["selected_devices"][0].startswith("GPU 1 ")
    assert finding.evidence["kernel_devices"][0].startswith("cuda:0 = GPU 0 ")


@pytest.mark.parametrize("visible", [SECOND["uuid"], "GPU-2f3e4d5c"])
def test_a_variable_given_as_a_uuid_or_its_prefix_is_compared(check, visible):
    finding = changed(check(visible, uses=[(FIRST["name"], FIRST["uuid"])], gpus=[FIRST, SECOND]))
    assert finding is not None and "selects GPU 1 (NVIDIA H100 80GB HBM3, GPU-2f3e4d5c)" in finding.headline
    assert changed(check(visible, uses=[(SECOND["name"], SECOND["uuid"])], gpus=[FIRST, SECOND])) is None


def test_a_count_change_is_still_caught(check):
    both = [(FIRST["name"], FIRST["uuid"]), (SECOND["name"], SECOND["uuid"])]
    finding = changed(check("0", uses=both, gpus=[FIRST, SECOND]))
    assert finding is not None
    assert (finding.evidence["kernel_device_count"], finding.evidence["selected_now"]) == (2, 1)


def mig_gpu() -> dict:
    instances = [{"uuid": u, "memory_total": 21_474_836_480, "memory_used": 0} for u in (MIG_A, MIG_B)]
    return nvml_gpu(A100, "GPU-a100a100-0000-4111-8222-333344445555", (8, 0), 85_899_345_920, mig_mode=1,
                    mig_devices=instances)


def test_another_mig_instance_than_the_kernel_uses_is_caught(check):
    finding = changed(check(MIG_B, uses=[(A100, MIG_A)], gpus=[mig_gpu()]))
    assert finding is not None
    assert "selects MIG instance MIG-bb22cc33 of GPU 0 (NVIDIA A100-SXM4-80GB)" in finding.headline
    assert "still uses cuda:0 = MIG instance MIG-aa11bb22 of GPU 0" in finding.headline


def test_the_mig_instance_the_kernel_uses_gives_nothing(check):
    assert changed(check(MIG_A, uses=[(A100, MIG_A)], gpus=[mig_gpu()])) is None
    # Unset, CUDA picks an instance of the MIG GPU itself: its UUIDs stand for that GPU.
    assert changed(check(None, uses=[(A100, MIG_B)], gpus=[mig_gpu()])) is None


def test_mixed_models_by_index_are_not_compared_by_uuid_unless_the_order_is_pci(check):
    """CUDA counts fastest first by default, NVML by PCI bus: index 0 may be either GPU, so no false alarm."""
    other = nvml_gpu("NVIDIA L4", "GPU-3c4d5e6f-0000-4111-8222-333344445555", (8, 9), 24_152_899_584)
    uses = [(other["name"], other["uuid"])]
    assert changed(check("0", uses=uses, gpus=[FIRST, other])) is None
    finding = changed(check("0", uses=uses, gpus=[FIRST, other], CUDA_DEVICE_ORDER="PCI_BUS_ID"))
    assert finding is not None and "still uses cuda:0 = GPU 1 (NVIDIA L4, GPU-3c4d5e6f)" in finding.headline


def test_unknown_kernel_uuids_fall_back_to_the_count(lay_out):
    """An older torch without `uuid` on its device properties: equal counts give nothing."""
    machine = Machine(env={"CUDA_VISIBLE_DEVICES": "1"}).nvidia_host(devices=[FIRST, SECOND]).cuda_torch()
    torch = kernel_torch([(FIRST["name"], FIRST["uuid"])])
    torch.cuda.get_device_properties = lambda i: types.SimpleNamespace()
    report = diagnose(gather_facts(lay_out(machine, modules={"torch": torch})))
    assert changed(report) is None
