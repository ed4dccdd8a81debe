"""The probe child against stubs that fail the way nvidia-ml-py 13 and torch really do (fake_machine.py):
old drivers without the _v3 process call, GPUs without MIG, a MIG parent's process list that needs root,
source builds with no architecture list, and NCCL versions with a suffix."""

from __future__ import annotations

from fake_machine import H100, Machine, nvml_gpu

from jupyter_gpu.facts.gather import gather_facts

GIB = 1 << 30
RTX_4090 = nvml_gpu("NVIDIA GeForce RTX 4090", "GPU-4090aaaa-0000-4111-8222-333344445555", (8, 9), 24 * GIB,
                    mig_mode=None)  # no MIG on this GPU: NVML answers NotSupported
MIG_UUIDS = ["MIG-0a0a0a0a-1111-4222-8333-444455556666", "MIG-0b0b0b0b-1111-4222-8333-444455556666"]
A100_MIG = nvml_gpu("NVIDIA A100-SXM4-80GB", "GPU-a100a100-0000-4111-8222-333344445555", (8, 0), 80 * GIB,
                    mig_mode=1, processes=[{"pid": 4242, "used": 3 * GIB}],
                    mig_devices=[{"uuid": MIG_UUIDS[0], "memory_total": 40 * GIB, "memory_used": 3 * GIB,
                                  "processes": [{"pid": 4242, "used": 3 * GIB}]},
                                 {"uuid": MIG_UUIDS[1], "memory_total": 40 * GIB, "memory_used": 0,
                                  "processes": []}])


def nvml_of(lay_out, machine: Machine) -> dict:
    return gather_facts(lay_out(machine), force_torch_probe=True)["nvml"]


def test_a_driver_older_than_r510_keeps_the_whole_nvml_section(lay_out):
    # pynvml 13's unversioned process call is _v3; on such a driver it raises NVMLLibraryMismatchError.
    machine = Machine().nvidia_host(driver="470.256.02", cuda=11040,
                                    devices=[dict(H100, processes=[{"pid": 77, "used": GIB}])]).cuda_torch()
    machine.nvml["no_v3"] = True
    nvml = nvml_of(lay_out, machine)
    assert nvml["status"] == "ok" and nvml["driver_version"] == "470.256.02"
    [device] = nvml["devices"]
    assert [(p["pid"], p["memory_used"]) for p in device["processes"]] == [(77, GIB)]
    assert device["errors"] == {}


def test_a_gpu_without_mig_is_not_in_mig_mode_and_reports_no_error(lay_out):
    nvml = nvml_of(lay_out, Machine().nvidia_host(devices=[dict(RTX_4090)]).cuda_torch())
    [device] = nvml["devices"]
    assert device["mig_enabled"] is False
    assert "mig_enabled" not in device["errors"]


def test_without_root_a_mig_gpus_processes_come_from_its_slices(lay_out):
    machine = Machine().nvidia_host(devices=[dict(A100_MIG)]).cuda_torch()  # the stub is not root by default
    [device] = nvml_of(lay_out, machine)["devices"]
    assert device["mig_enabled"] is True
    assert [(p["pid"], p["memory_used"]) for p in device["processes"]] == [(4242, 3 * GIB)]
    assert [m["uuid"] for m in device["mig_instances"]] == MIG_UUIDS


def test_a_source_build_without_an_architecture_list_still_reports_its_devices(lay_out):
    machine = Machine().nvidia_host().cuda_torch(version="2.13.0a0+gitabcdef")
    machine.torch["arch"] = None  # torch._C._cuda_getArchFlags() returns None
    facts = gather_facts(lay_out(machine), force_torch_probe=True)["torch"]
    assert facts["arch_flags"] is None
    assert [d["name"] for d in facts["devices"]] == [H100["name"]]
    assert facts["devices"][0]["uuid"] == H100["uuid"][4:], "torch's uuid is bare hex, never GPU-…"


def test_an_nccl_version_with_a_suffix_reads_as_nccl_prints_it(lay_out):
    machine = Machine().nvidia_host().cuda_torch(nccl=[2, 27, 3, "+cuda12.9"])
    assert gather_facts(lay_out(machine), force_torch_probe=True)["torch"]["nccl_version"] == "2.27.3+cuda12.9"
