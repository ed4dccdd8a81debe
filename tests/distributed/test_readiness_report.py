"""The multi-GPU readiness report on fake machines: host files under a fake root, a fake NVML topology, and the
torch facts a CUDA build gives (this machine's torch is a CPU build; one test reads it for real)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_topology import nvlink_down, nvswitch_box, p2p_disabled, pcie_pair

from jupyter_gpu.distributed.gather import gather_readiness, readiness_snapshot
from jupyter_gpu.distributed.host_facts import gather_host_facts
from jupyter_gpu.distributed.launch_facts import gather_launch_facts
from jupyter_gpu.distributed.nvml_topology import read_nvml_topology
from jupyter_gpu.distributed.report import ReadinessReport
from jupyter_gpu.facts.context import ProbeContext

DOCKER_SHM = "shm /dev/shm tmpfs rw,nosuid,nodev,noexec,relatime,size=65536k,inode64 0 0\n"
HOST_SHM = "tmpfs /dev/shm tmpfs rw,nosuid,nodev,size=65831068k 0 0\n"


def cuda_torch(gpus: int, name: str = "NVIDIA A100-SXM4-80GB") -> dict:
    """What the probe child reports for a CUDA build of torch that sees `gpus` GPUs."""
    return {"torch_version": "2.13.0+cu128", "cuda_build": "12.8", "distributed_available": True,
            "nccl_available": True, "gloo_available": True, "mpi_available": False, "nccl_version": "2.27.3",
            "device_count": gpus, "device_names": [name] * gpus}


def machine(tmp_path: Path, *, mounts: str = HOST_SHM, interfaces: tuple[str, ...] = ("eth0", "lo")) -> Path:
    (tmp_path / "proc").mkdir(parents=True)
    (tmp_path / "proc/mounts").write_text(mounts)
    (tmp_path / "dev/shm").mkdir(parents=True)
    (tmp_path / "dev/shm").chmod(0o1777)
    for name in interfaces:
        (tmp_path / f"sys/class/net/{name}").mkdir(parents=True)
        (tmp_path / f"sys/class/net/{name}/operstate").write_text("up\n")
    return tmp_path


def report_for(root: Path, nvml: object, torch: dict, env: dict | None = None, user_ns: dict | None = None,
               ) -> ReadinessReport:
    host = gather_host_facts(ProbeContext(root=root, env=env or {}))
    facts = readiness_snapshot(torch, read_nvml_topology(nvml).to_dict(), host, gather_launch_facts(user_ns))
    json.dumps(facts)  # the snapshot --save writes
    return ReadinessReport.from_facts(facts)


def codes(report: ReadinessReport) -> dict[str, str]:
    return {f.code: f.severity for f in report.findings}


def test_a_healthy_nvswitch_box_is_ready(tmp_path: Path) -> None:
    report = report_for(machine(tmp_path), nvswitch_box(), cuda_torch(8), user_ns={})
    assert report.status == "ok", str(report)
    assert report.verdict == "Ready for DistributedDataParallel on 8 GPUs with NCCL 2.27.3"
    text = str(report)
    assert "NV12" in text and "GPU7" in text
    assert "torchrun --standalone --nproc-per-node=8 train.py" in text
    assert "NCCL_DEBUG=WARN" in text


def test_pcie_pair_without_p2p_small_shm_and_bad_torchrun_variables(tmp_path: Path) -> None:
    env = {"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "3", "MASTER_ADDR": "localhost", "MASTER_PORT": "99999"}
    report = report_for(machine(tmp_path, mounts=DOCKER_SHM), pcie_pair(), cuda_torch(2, "NVIDIA GeForce RTX 4090"),
                        env)
    assert codes(report) == {"DIST_TORCHRUN_VARIABLES": "fail", "DIST_SHM_SMALL": "warn",
                             "DIST_P2P_UNSUPPORTED": "warn"}
    assert report.status == "fail" and report.exit_code == 1
    torchrun = next(f for f in report.findings if f.code == "DIST_TORCHRUN_VARIABLES")
    assert torchrun.evidence["problems"] == [
        "RANK=2 is outside 0..1 (WORLD_SIZE=2)",
        "LOCAL_RANK=3 but 2 GPUs are visible: cuda:3 does not exist here",
        "MASTER_PORT=99999 is not a TCP port (1-65535)"]
    assert report.verdict.startswith("Not ready for multi-GPU training: The torchrun variables here are inconsistent")
    shm = next(f for f in report.findings if f.code == "DIST_SHM_SMALL")
    assert "64.0 MiB" in shm.headline and any("--ipc=host" in line for line in shm.fix)
    assert any("NCCL_P2P_DISABLE=1" in line for line in next(
        f for f in report.findings if f.code == "DIST_P2P_UNSUPPORTED").fix)


def test_half_set_rendezvous_variables_name_the_missing_one(tmp_path: Path) -> None:
    report = report_for(machine(tmp_path), nvswitch_box(2), cuda_torch(2), {"RANK": "0", "WORLD_SIZE": "x"})
    problems = next(f for f in report.findings if f.code == "DIST_TORCHRUN_VARIABLES").evidence["problems"]
    assert problems == ["WORLD_SIZE='x' is not a whole number",
                        "MASTER_ADDR, MASTER_PORT are not set, so init_process_group fails: \"environment variable "
                        "MASTER_ADDR expected, but not set\""]


def test_torchrun_variables_inherited_by_a_kernel_are_stale(tmp_path: Path) -> None:
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "LOCAL_RANK": "0"}
    assert codes(report_for(machine(tmp_path), nvswitch_box(2), cuda_torch(2), env, user_ns={})) == {
        "DIST_TORCHRUN_IN_KERNEL": "warn"}


def test_nvlink_down_and_p2p_disabled(tmp_path: Path) -> None:
    report = report_for(machine(tmp_path), nvlink_down(), cuda_torch(8))
    down = next(f for f in report.findings if f.code == "DIST_NVLINK_DOWN")
    assert "GPU 3" in down.headline or "GPU3" in down.headline
    assert any("nvidia-smi nvlink --status -i 3" in line for line in down.fix)
    assert "DIST_P2P_UNSUPPORTED" in codes(report_for(machine(tmp_path / "b"), p2p_disabled(), cuda_torch(2)))


def test_nccl_variables_that_switch_transports_off(tmp_path: Path) -> None:
    env = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_SOCKET_IFNAME": "ib", "NCCL_IB_DISABLE": "1"}
    report = report_for(machine(tmp_path), nvswitch_box(2), cuda_torch(2), env)
    assert codes(report) == {"DIST_NCCL_SOCKET_IFNAME": "fail", "DIST_NCCL_P2P_DISABLED": "warn",
                             "DIST_NCCL_SHM_DISABLED": "warn"}  # IB_DISABLE is harmless: no InfiniBand here
    ifname = next(f for f in report.findings if f.code == "DIST_NCCL_SOCKET_IFNAME")
    assert "(eth0, lo)" in ifname.headline and "export NCCL_SOCKET_IFNAME=eth0" in ifname.fix[0]
    # NCCL's own syntax: prefixes, =exact, ^exclude.
    for number, (spec, matches) in enumerate((("eth", True), ("=eth", False), ("^eth,lo", False), ("^docker", True))):
        found = "DIST_NCCL_SOCKET_IFNAME" in codes(report_for(machine(tmp_path / str(number)), nvswitch_box(2),
                                                              cuda_torch(2), {"NCCL_SOCKET_IFNAME": spec}))
        assert found is not matches, spec


def test_p2p_disable_is_only_a_note_where_p2p_is_broken(tmp_path: Path) -> None:
    report = report_for(machine(tmp_path), pcie_pair(), cuda_torch(2), {"NCCL_P2P_DISABLE": "1"})
    assert codes(report)["DIST_NCCL_P2P_DISABLED"] == "info"


def test_data_parallel_model_gets_the_ddp_advice(tmp_path: Path) -> None:
    from torch import nn

    report = report_for(machine(tmp_path), nvswitch_box(4), cuda_torch(4),
                        user_ns={"model": nn.DataParallel(nn.Linear(2, 2))})
    finding = next(f for f in report.findings if f.code == "DIST_DATA_PARALLEL")
    assert "`model` is an nn.DataParallel (Linear)" in finding.headline
    assert any("notebook_launcher(train, num_processes=4)" in line for line in finding.fix)
    assert any("torchrun --standalone --nproc-per-node=4 train.py" in line for line in finding.fix)


def test_html_escapes_what_users_and_nvml_named(tmp_path: Path) -> None:
    report = report_for(machine(tmp_path), nvswitch_box(2), cuda_torch(2, "<b>GPU</b>"),
                        {"NCCL_SOCKET_IFNAME": "<script>"})
    html = report._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "<b>GPU</b>" not in html


@pytest.mark.probe_children  # this machine's torch probed in a child: the whole suite's, not the fast loop's
def test_this_machine_for_real_with_the_simulated_eight_a100(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_GPU_BACKEND", "simulated:a100x8-mig")
    facts = gather_readiness(ProbeContext.from_environment(), user_ns={})
    assert facts["torch"]["distributed_available"] is True and facts["torch"]["gloo_available"] is True
    assert facts["torch"]["nccl_available"] is False  # the CPU build: NCCL paths are gpu-marked tests
    report = ReadinessReport.from_facts(facts)
    assert report.simulated and "[simulated]" in str(report).splitlines()[0]
    assert report.verdict == "8 GPUs but no NCCL in this torch: only gloo, on the CPU"
    assert "NV12" in str(report)
    assert codes(report)["DIST_NO_NCCL"] == "info"  # simulated GPUs: nothing a CUDA wheel would fix here
