"""The topology findings, on topologies the real probe reads through a fake driver and on the simulated machines."""

from __future__ import annotations

import json

import pynvml
from fake_topology import nvlink_down, nvml_missing, nvswitch_box, p2p_disabled, pcie_pair, switch_links, two_socket_box

from jupyter_gpu.distributed.nvml_topology import read_nvml_topology, topology_for_backend
from jupyter_gpu.distributed.simulated_topology import simulated_topology
from jupyter_gpu.distributed.topology import GpuLinks, NvLink, Topology
from jupyter_gpu.distributed.topology_rules import topology_findings
from jupyter_gpu.metrics.backends.base import BACKEND_ENV
from jupyter_gpu.models import LAYER_HOST, Finding


def codes(findings: list[Finding]) -> list[str]:
    return [f.code for f in findings]


def only(findings: list[Finding], code: str) -> Finding:
    (finding,) = [f for f in findings if f.code == code]
    return finding


def test_a_healthy_nvswitch_box_has_nothing_to_say():
    assert topology_findings(read_nvml_topology(nvswitch_box())) == []
    assert topology_findings(simulated_topology("a100x8-mig")) == []
    assert topology_findings(simulated_topology("h200")) == []


def test_a_pair_without_p2p_says_nccl_copies_through_the_host_and_how_to_check():
    findings = topology_findings(read_nvml_topology(pcie_pair()))
    assert codes(findings) == ["DIST_P2P_UNSUPPORTED"]
    finding = findings[0]
    assert (finding.severity, finding.layer) == ("warn", LAYER_HOST)
    assert finding.headline.startswith("GPU 0 (NVIDIA GeForce RTX 4090) and GPU 1 (NVIDIA GeForce RTX 4090) cannot "
                                       "copy peer-to-peer")
    assert "not supported" in finding.headline and "(simulated)" not in finding.headline
    assert finding.evidence == {"pairs": ["GPU0-GPU1 (PHB): read not_supported, write not_supported"]}
    assert any("through host memory" in line and "`NCCL_P2P_DISABLE=1`" in line for line in finding.fix)
    assert any("`jupyter-gpu allreduce` checks every pair's copy" in line for line in finding.fix)
    assert finding.refs == ["https://github.com/NVIDIA/nccl-tests/issues/117"]


def test_p2p_switched_off_by_a_registry_key_points_at_the_administrator():
    finding = only(topology_findings(read_nvml_topology(p2p_disabled())), "DIST_P2P_UNSUPPORTED")
    assert "disabled by a driver registry key" in finding.headline
    assert any("NVreg_RegistryDwords" in line and "administrator" in line for line in finding.fix)


def test_many_pairs_without_p2p_are_one_finding_that_counts_them():
    nvml = two_socket_box()
    for pair in nvml.every_pair():
        if pair[0] // 2 != pair[1] // 2:
            nvml.p2p[pair] = {0: pynvml.NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED,
                              1: pynvml.NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED}
    finding = only(topology_findings(read_nvml_topology(nvml)), "DIST_P2P_UNSUPPORTED")
    assert finding.headline.startswith("4 GPU pairs (0-2, 0-3, 1-2, 1-3) cannot copy peer-to-peer")
    assert len(finding.evidence["pairs"]) == 4
    assert any("NUMA node" in line for line in finding.fix)


def test_unread_p2p_is_not_reported_as_broken():
    nvml = pcie_pair()
    nvml.p2p_errors[(0, 1)] = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert "DIST_P2P_UNSUPPORTED" not in codes(topology_findings(read_nvml_topology(nvml)))


def test_a_gpu_with_links_down_names_itself_and_the_command_to_look():
    findings = topology_findings(read_nvml_topology(nvlink_down(gpu=3, down=(4, 7))))
    assert codes(findings) == ["DIST_NVLINK_DOWN"]
    finding = findings[0]
    assert finding.severity == "warn"
    assert finding.headline.startswith("GPU 3 (NVIDIA A100-SXM4-80GB) has 10 of 12 NVLink links active; its peers "
                                       "have 12")
    assert finding.evidence["inactive_links"] == [4, 7] and finding.evidence["gpu"] == 3
    assert any("`nvidia-smi nvlink --status -i 3`" in line for line in finding.fix)
    assert any("reset" in line and "reboot" in line and "administrator" in line for line in finding.fix)


def test_a_gpu_whose_links_are_all_down_among_healthy_peers_is_found():
    nvml = nvswitch_box(4)
    nvml.boards[2].links = switch_links(12, down=tuple(range(12)))
    finding = only(topology_findings(read_nvml_topology(nvml)), "DIST_NVLINK_DOWN")
    assert finding.evidence["gpu"] == 2 and "0 of 12" in finding.headline


def test_a_lone_gpu_without_a_bridge_has_no_nvlink_finding():
    links = tuple(NvLink(link, False, None) for link in range(18))
    topology = Topology("nvml", False, "ok", None, (GpuLinks(0, "NVIDIA H100 PCIe", "GPU-x", None, "hopper", 5, 16,
                                                             links),))
    assert topology_findings(topology) == []


def test_gpus_across_sockets_are_told_to_stay_on_one_numa_node():
    findings = topology_findings(read_nvml_topology(two_socket_box()))
    finding = only(findings, "DIST_CROSS_SOCKET")
    assert finding.severity == "info"
    assert finding.headline.startswith("GPU pairs 0-2, 0-3, 1-2, 1-3 connect across CPU sockets (SYS)")
    assert finding.evidence == {"pairs": ["GPU0-GPU2", "GPU0-GPU3", "GPU1-GPU2", "GPU1-GPU3"]}
    assert any("`CUDA_VISIBLE_DEVICES=0,1`" in line for line in finding.fix)


def test_no_nvml_is_an_info_with_the_reason():
    finding = only(topology_findings(read_nvml_topology(nvml_missing())), "DIST_NO_NVML")
    assert finding.severity == "info"
    assert "NVML Shared Library Not Found" in finding.headline and "(simulated)" not in finding.headline
    assert any("%gpucheck" in line for line in finding.fix)


def test_simulated_findings_say_so():
    pair = only(topology_findings(simulated_topology("pcie-pair")), "DIST_P2P_UNSUPPORTED")
    assert pair.headline.endswith("(simulated)")
    nodriver = only(topology_findings(simulated_topology("nodriver")), "DIST_NO_NVML")
    assert "(simulated)" in nodriver.headline


def test_a_replayed_recording_explains_why_there_is_no_topology():
    finding = only(topology_findings(topology_for_backend({BACKEND_ENV: "replay:run.jsonl"})), "DIST_NO_NVML")
    assert "no topology" in finding.headline
    assert any("Unset JUPYTER_GPU_BACKEND" in line for line in finding.fix)


def test_findings_serialise():
    findings = topology_findings(read_nvml_topology(two_socket_box())) + topology_findings(
        read_nvml_topology(pcie_pair()))
    assert [Finding.from_dict(json.loads(json.dumps(f.to_dict()))) for f in findings] == findings
