"""The GPU topology: the model, the NVML probe read through a fake pynvml, the simulated machines, and the backend
choice. The probe runs its real code; only the driver behind pynvml is faked (this machine has none)."""

from __future__ import annotations

import json
import sys

import pynvml
import pytest
from fake_topology import (
    A100,
    RTX4090,
    FakeTopologyNvml,
    bridged_pair,
    bus_id,
    nvlink_down,
    nvml_missing,
    nvswitch_box,
    p2p_disabled,
    pcie_pair,
    switch_links,
    two_socket_box,
)

from jupyter_gpu.distributed.links import GB
from jupyter_gpu.distributed.nvml_topology import (
    ARCHITECTURE_BY_NVML_CODE,
    P2P_CAPS_INDEX,
    REMOTE_KIND_BY_NVML_CODE,
    read_nvml_topology,
    topology_for_backend,
)
from jupyter_gpu.distributed.simulated_topology import simulated_topology
from jupyter_gpu.distributed.topology import (
    LEVEL_BY_NVML_TOPOLOGY,
    P2P_STATUS_BY_NVML_CODE,
    GpuLinks,
    NvLink,
    PairLink,
    Topology,
)
from jupyter_gpu.metrics.backends.base import BACKEND_ENV
from jupyter_gpu.metrics.backends.simulated import SCENARIOS, SimulatedBackend

MIB = 1024**2


def round_trip(topology: Topology) -> Topology:
    return Topology.from_dict(json.loads(json.dumps(topology.to_dict())))


# -- the model -----------------------------------------------------------------------------------------


def gpu(index: int, links: int = 0, *, architecture: str | None = "ampere",
        pcie: tuple[int | None, int | None] = (4, 16), down: int = 0) -> GpuLinks:
    nvlinks = tuple(NvLink(link, link >= down, "00000000:C4:00.0", "switch") for link in range(links))
    return GpuLinks(index, A100, f"GPU-{index}", bus_id(index + 1), architecture, *pcie, nvlinks)


def pcie_pair_link(a: int, b: int, *, nvlinks: int = 0) -> PairLink:
    return PairLink(a, b, f"NV{nvlinks}" if nvlinks else "PHB", nvlinks, "ok", "ok", None, None)


def test_a_pair_is_found_whichever_way_round_it_is_asked_for():
    topology = Topology("nvml", False, "ok", None, (gpu(0), gpu(1)), (pcie_pair_link(0, 1),))
    assert topology.pair(1, 0) is topology.pair(0, 1) is topology.pairs[0]
    assert topology.pair(0, 2) is None


def test_the_link_peak_is_the_slowest_gpus_nvlink_when_every_pair_has_nvlink():
    gpus = (gpu(0, 12), gpu(1, 12, down=2), gpu(2, 12))
    pairs = (pcie_pair_link(0, 1, nvlinks=10), pcie_pair_link(0, 2, nvlinks=12), pcie_pair_link(1, 2, nvlinks=10))
    peak = Topology("nvml", False, "ok", None, gpus, pairs).link_peak()
    assert peak is not None
    assert (peak.kind, peak.bytes_per_s, peak.simulated) == ("nvlink", 10 * 25 * GB, False)
    assert "10 NVLink links" in peak.description


def test_one_pair_without_nvlink_makes_pcie_the_bottleneck():
    gpus = (gpu(0, 12), gpu(1, 12), gpu(2, pcie=(3, 8)))
    pairs = (pcie_pair_link(0, 1, nvlinks=12), pcie_pair_link(0, 2), pcie_pair_link(1, 2))
    peak = Topology("nvml", False, "ok", None, gpus, pairs).link_peak()
    assert peak is not None and (peak.kind, peak.description) == ("pcie", "PCIe Gen3 x8")
    assert peak.bytes_per_s == pytest.approx(0.985 * 8 * GB)


@pytest.mark.parametrize(("gpus", "pairs"), [
    ((gpu(0),), ()),  # an all-reduce over one GPU uses no link
    ((gpu(0), gpu(1, pcie=(None, 16))), (pcie_pair_link(0, 1),)),  # the unread link may be the slowest
    ((gpu(0, 12, architecture=None), gpu(1, 12, architecture=None)), (pcie_pair_link(0, 1, nvlinks=12),)),
])
def test_the_link_peak_is_unknown_rather_than_guessed(gpus, pairs):
    assert Topology("nvml", False, "ok", None, gpus, pairs).link_peak() is None


def test_an_unread_topology_has_no_peak_and_round_trips():
    topology = read_nvml_topology(nvml_missing())
    assert topology.link_peak() is None
    assert round_trip(topology) == topology


# -- the probe, through a fake driver ------------------------------------------------------------------


def test_an_nvswitch_box_reads_like_nvidia_smi_topo_m():
    nvml = nvswitch_box()
    topology = read_nvml_topology(nvml)
    assert (topology.status, topology.source, topology.simulated) == ("ok", "nvml", False)
    assert [g.name for g in topology.gpus] == [A100] * 8
    assert topology.gpus[1].bus_id == "00000000:0F:00.0" and topology.gpus[1].uuid == "GPU-dgx-1"
    assert {(g.architecture, g.active_nvlinks, len(g.nvlinks)) for g in topology.gpus} == {("ampere", 12, 12)}
    # The most the link allows, not the Gen1 an idle GPU drops to.
    assert {(g.pcie_generation, g.pcie_width) for g in topology.gpus} == {(4, 16)}
    assert {g.nvlinks[0].remote_kind for g in topology.gpus} == {"switch"}
    assert len(topology.pairs) == 28
    assert {(p.level, p.nvlinks, p.p2p_read, p.p2p_write, p.p2p_nvlink, p.p2p_atomics) for p in topology.pairs} == {
        ("NV12", 12, "ok", "ok", "ok", "ok")}
    assert topology.link_peak().bytes_per_s == 300 * GB  # type: ignore[union-attr]
    assert round_trip(topology) == topology


def test_nvml_is_shut_down_after_every_read():
    nvml = nvswitch_box(2)
    read_nvml_topology(nvml)
    assert (nvml.calls["nvmlInit"], nvml.calls["nvmlShutdown"], nvml.initialised) == (1, 1, False)
    nvml.count_error = pynvml.NVML_ERROR_UNKNOWN
    failed = read_nvml_topology(nvml)
    assert failed.status == "error" and "could not count the GPUs" in (failed.message or "")
    assert (nvml.calls["nvmlShutdown"], nvml.initialised) == (2, False)


def test_the_link_list_stops_where_the_gpu_has_no_more_links():
    nvml = nvswitch_box(2)
    topology = read_nvml_topology(nvml)
    # 12 links answered and the 13th refused (Invalid Argument) per GPU, although NVML numbers up to 36.
    assert pynvml.NVML_NVLINK_MAX_LINKS > 13
    assert nvml.calls["nvlink_state"] == 2 * 13
    assert [len(g.nvlinks) for g in topology.gpus] == [12, 12]
    no_nvlink = pcie_pair()
    assert [g.nvlinks for g in read_nvml_topology(no_nvlink).gpus] == [(), ()]
    assert no_nvlink.calls["nvlink_state"] == 2  # Not Supported at link 0: one call per GPU


def test_links_down_lower_the_link_count_of_every_pair_through_that_gpu():
    topology = read_nvml_topology(nvlink_down(gpu=3, down=(4, 7)))
    third = topology.gpus[3]
    assert (third.active_nvlinks, len(third.nvlinks)) == (10, 12)
    assert [link.link for link in third.nvlinks if not link.active] == [4, 7]
    assert third.nvlinks[4].remote_bus_id is None  # the far end of an inactive link is not asked for
    assert topology.pair(3, 5).level == "NV10" and topology.pair(0, 1).level == "NV12"  # type: ignore[union-attr]
    assert topology.link_peak().bytes_per_s == 250 * GB  # type: ignore[union-attr]


def test_bridged_gpus_count_the_links_that_end_at_each_other():
    topology = read_nvml_topology(bridged_pair(links=4))
    assert topology.gpus[0].nvlinks[0].remote_kind == "gpu"
    assert (topology.pairs[0].level, topology.pairs[0].nvlinks) == ("NV4", 4)


def test_switch_links_are_told_apart_by_bus_id_when_the_driver_cannot_name_the_far_end():
    nvml = nvswitch_box(2)
    for board in nvml.boards:
        board.links = switch_links(12, typed=False)
    topology = read_nvml_topology(nvml)
    assert topology.gpus[0].nvlinks[0].remote_kind is None
    assert topology.pairs[0].level == "NV12"


@pytest.mark.parametrize(("machine", "level", "p2p"), [
    (pcie_pair, "PHB", "not_supported"),
    (p2p_disabled, "PIX", "disabled_by_registry"),
])
def test_pcie_machines_give_the_common_ancestor_and_the_p2p_status(machine, level, p2p):
    topology = read_nvml_topology(machine())
    (pair,) = topology.pairs
    assert (pair.level, pair.nvlinks, pair.p2p_read, pair.p2p_write, pair.p2p_nvlink) == (
        level, 0, p2p, p2p, "not_supported")
    assert pair.p2p_copy_broken
    assert topology.link_peak().description == "PCIe Gen4 x16"  # type: ignore[union-attr]


def test_gpus_on_two_sockets_are_sys_to_each_other():
    topology = read_nvml_topology(two_socket_box())
    assert {(p.a, p.b): p.level for p in topology.pairs} == {
        (0, 1): "PIX", (2, 3): "PIX", (0, 2): "SYS", (0, 3): "SYS", (1, 2): "SYS", (1, 3): "SYS"}


def test_each_unsupported_call_leaves_only_its_own_field_empty():
    nvml = pcie_pair()
    nvml.boards[0].errors.update(architecture=pynvml.NVML_ERROR_NOT_SUPPORTED, pci=pynvml.NVML_ERROR_UNKNOWN,
                                 pcie_width=pynvml.NVML_ERROR_NOT_SUPPORTED, name=pynvml.NVML_ERROR_GPU_IS_LOST)
    nvml.ancestor_errors[(0, 1)] = pynvml.NVML_ERROR_NOT_SUPPORTED
    topology = read_nvml_topology(nvml)
    first, second = topology.gpus
    assert (first.name, first.architecture, first.bus_id, first.pcie_width) == (None, None, None, None)
    assert (first.uuid, first.pcie_generation) == ("GPU-4090-0", 4)
    assert (second.name, second.architecture, second.pcie_width) == (RTX4090, "ada", 16)
    (pair,) = topology.pairs
    assert pair.level is None and pair.p2p_read == "not_supported"
    assert topology.link_peak() is None  # GPU 0's width is unknown


def test_a_failing_p2p_query_leaves_the_statuses_unread_not_ok():
    nvml = nvswitch_box(2)
    nvml.p2p_errors[(0, 1)] = pynvml.NVML_ERROR_NOT_SUPPORTED
    (pair,) = read_nvml_topology(nvml).pairs
    assert (pair.p2p_read, pair.p2p_write, pair.p2p_nvlink, pair.p2p_atomics) == (None, None, None, None)
    assert not pair.p2p_copy_broken and pair.level == "NV12"


def test_a_link_nvml_cannot_read_is_unknown_and_the_rest_are_still_read():
    nvml = nvswitch_box(2)
    nvml.boards[0].link_errors[5] = pynvml.NVML_ERROR_UNKNOWN
    first = read_nvml_topology(nvml).gpus[0]
    assert len(first.nvlinks) == 12 and first.nvlinks[5] == NvLink(5, None, None)
    assert first.active_nvlinks == 11


def test_a_gpu_nvml_cannot_open_is_listed_without_pairs():
    nvml = two_socket_box()
    nvml.handle_errors[2] = pynvml.NVML_ERROR_GPU_IS_LOST
    topology = read_nvml_topology(nvml)
    assert topology.status == "ok"
    assert topology.gpus[2] == GpuLinks(2, None, None, None, None, None, None)
    assert sorted((p.a, p.b) for p in topology.pairs) == [(0, 1), (0, 3), (1, 3)]


def test_no_driver_is_a_status_quoting_nvml():
    topology = read_nvml_topology(nvml_missing())
    assert (topology.status, topology.gpus, topology.simulated) == ("no_nvml", (), False)
    assert "NVML Shared Library Not Found" in (topology.message or "")
    assert "driver is not installed" in (topology.message or "")


def test_without_nvidia_ml_py_the_read_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # what `import pynvml` meets where it is not installed
    topology = read_nvml_topology()
    assert topology.status == "no_nvml" and "pip install nvidia-ml-py" in (topology.message or "")


def test_the_real_pynvml_on_this_machine():
    topology = read_nvml_topology()
    if topology.status == "ok":  # a GPU machine
        assert topology.gpus and all(g.name and g.uuid for g in topology.gpus)
    else:
        assert topology.status == "no_nvml" and (topology.message or "").startswith("NVML could not start: ")


def _value(constant: object) -> int:
    # pynvml 13.615 writes `NVML_P2P_CAPS_INDEX_READ = 0,`: the tuple (0,).
    return int(constant[0]) if isinstance(constant, tuple) else int(constant)  # type: ignore[index, call-overload]


def test_the_nvml_numbers_agree_with_pynvml():
    assert {name: _value(getattr(pynvml, f"NVML_P2P_CAPS_INDEX_{name.removeprefix('p2p_').upper()}"))
            for name in P2P_CAPS_INDEX} == P2P_CAPS_INDEX
    statuses = {"ok": "OK", "chipset_not_supported": "CHIPSET_NOT_SUPPORTED",
                "gpu_not_supported": "GPU_NOT_SUPPORTED", "ioh_topology_not_supported": "IOH_TOPOLOGY_NOT_SUPPORTED",
                "disabled_by_registry": "DISABLED_BY_REGKEY", "not_supported": "NOT_SUPPORTED", "unknown": "UNKNOWN"}
    assert {getattr(pynvml, f"NVML_P2P_STATUS_{c}"): n for n, c in statuses.items()} == P2P_STATUS_BY_NVML_CODE
    levels = {"INTERNAL": "PIX", "SINGLE": "PIX", "MULTIPLE": "PXB", "HOSTBRIDGE": "PHB", "NODE": "NODE",
              "SYSTEM": "SYS"}
    assert {getattr(pynvml, f"NVML_TOPOLOGY_{n}"): code for n, code in levels.items()} == LEVEL_BY_NVML_TOPOLOGY
    assert {getattr(pynvml, f"NVML_DEVICE_ARCH_{name.upper()}"): name
            for name in ARCHITECTURE_BY_NVML_CODE.values()} == ARCHITECTURE_BY_NVML_CODE
    assert {getattr(pynvml, f"NVML_NVLINK_DEVICE_TYPE_{k.upper()}"): k for k in REMOTE_KIND_BY_NVML_CODE.values()} == (
        REMOTE_KIND_BY_NVML_CODE)


def test_the_fake_refuses_pynvmls_tuple_index_as_ctypes_would():
    # Why the probe carries its own P2P index numbers: the module's READ constant cannot be passed to NVML.
    import ctypes

    nvml = FakeTopologyNvml(*nvswitch_box(2).boards)
    nvml.nvmlInit()
    with pytest.raises(ctypes.ArgumentError):
        nvml.nvmlDeviceGetP2PStatus(nvml.boards[0], nvml.boards[1], pynvml.NVML_P2P_CAPS_INDEX_READ)


# -- simulated machines --------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_metrics_scenario_has_a_topology_of_the_same_gpus(scenario):
    topology = simulated_topology(scenario)
    sample = SimulatedBackend(scenario).read()
    assert (topology.source, topology.simulated) == (f"simulated:{scenario}", True)
    assert [(g.index, g.name, g.uuid) for g in topology.gpus] == [(d.index, d.name, d.uuid) for d in sample.devices]
    if sample.status == "ok":
        assert topology.status == "ok"
        assert len(topology.pairs) == len(topology.gpus) * (len(topology.gpus) - 1) // 2
    else:
        assert (topology.status, topology.message) == ("no_nvml", sample.message)
    assert round_trip(topology) == topology


def test_the_eight_a100s_are_a_dgx_a100():
    topology = simulated_topology("a100x8-mig")
    assert len(topology.gpus) == 8
    assert {(g.architecture, g.active_nvlinks, len(g.nvlinks), g.pcie_generation, g.pcie_width)
            for g in topology.gpus} == {("ampere", 12, 12, 4, 16)}
    assert {(p.level, p.p2p_read, p.p2p_write, p.p2p_nvlink, p.p2p_atomics) for p in topology.pairs} == {
        ("NV12", "ok", "ok", "ok", "ok")}
    peak = topology.link_peak()
    assert peak is not None and (peak.bytes_per_s, peak.kind, peak.simulated) == (300 * GB, "nvlink", True)


@pytest.mark.parametrize("scenario", ["h200", "h200-busy", "h200-hot", "lost"])
def test_the_h200_scenarios_are_one_hopper_with_18_links(scenario):
    topology = simulated_topology(scenario)
    (h200,) = topology.gpus
    assert (h200.name, h200.architecture, h200.active_nvlinks, h200.pcie_generation) == ("NVIDIA H200", "hopper", 18, 5)
    assert topology.pairs == () and topology.link_peak() is None


def test_the_pcie_pair_is_two_rtx_4090_without_p2p():
    topology = simulated_topology("pcie-pair")
    assert [(g.name, g.architecture, g.nvlinks, g.pcie_generation, g.pcie_width) for g in topology.gpus] == [
        (RTX4090, "ada", (), 4, 16)] * 2
    (pair,) = topology.pairs
    assert (pair.level, pair.nvlinks, pair.p2p_read, pair.p2p_write) == ("PHB", 0, "not_supported", "not_supported")
    assert topology.link_peak().bytes_per_s == pytest.approx(31.504 * GB)  # type: ignore[union-attr]


def test_the_pcie_pair_metrics_scenario_is_two_idle_24_gb_cards():
    sample = SimulatedBackend("pcie-pair").read()
    assert (sample.status, sample.simulated, sample.backend) == ("ok", True, "simulated:pcie-pair")
    assert [(d.index, d.name, d.memory_total) for d in sample.devices] == [
        (0, RTX4090, 24564 * MIB), (1, RTX4090, 24564 * MIB)]
    assert sample.devices[0].uuid != sample.devices[1].uuid
    for device in sample.devices:
        assert device.utilization_gpu is not None and device.utilization_gpu <= 3
        assert device.memory_used is not None and device.memory_used < 400 * MIB
        assert device.processes == () and not device.mig_enabled and device.power_limit_w == 450.0
    assert "RTX 4090" in SCENARIOS["pcie-pair"] and "PCIe" in SCENARIOS["pcie-pair"]


def test_an_unknown_scenario_is_refused():
    with pytest.raises(ValueError, match="Unknown simulated scenario 'h100'"):
        simulated_topology("h100")


# -- which backend -------------------------------------------------------------------------------------


def test_the_backend_variable_chooses_the_topology():
    assert topology_for_backend({BACKEND_ENV: "simulated:pcie-pair"}) == simulated_topology("pcie-pair")
    assert topology_for_backend({BACKEND_ENV: " simulated:a100x8-mig "}).source == "simulated:a100x8-mig"
    for env in ({}, {BACKEND_ENV: "nvml"}, {BACKEND_ENV: ""}):
        real = topology_for_backend(env)
        assert (real.source, real.simulated) == ("nvml", False)


def test_a_recording_holds_no_topology():
    topology = topology_for_backend({BACKEND_ENV: "replay:/tmp/run.jsonl"})
    assert (topology.status, topology.gpus) == ("unavailable", ())
    assert "replay:/tmp/run.jsonl" in (topology.message or "") and "no topology" in (topology.message or "")


@pytest.mark.parametrize(("spec", "words"), [("simulated:h100", "Unknown simulated scenario 'h100'"),
                                             ("cuda", "names no GPU backend")])
def test_a_bad_spec_is_a_status_not_an_exception(spec, words):
    topology = topology_for_backend({BACKEND_ENV: spec})
    assert topology.status == "error" and words in (topology.message or "") and BACKEND_ENV in (topology.message or "")
