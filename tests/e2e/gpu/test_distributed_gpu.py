"""The checked all-reduce on real GPUs (scripts/gpu-check.sh runs these where one is lent): NCCL with one process
per GPU, every element correct, nccl-tests' figures against the link's peak from NVML; and with two GPUs or more
a checked copy between every pair (broken P2P returns zeros: nccl-tests #117)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from processes import child_pids

from jupyter_gpu.distributed.allreduce import run_allreduce
from jupyter_gpu.distributed.collective import KIB, MIB

pytestmark = pytest.mark.gpu  # skipped with its reason where CUDA is not available (conftest.py)
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
needs_two = pytest.mark.skipif(GPUS < 2, reason="needs two GPUs or more")


def link_peak():
    from jupyter_gpu.distributed.nvml_topology import topology_for_backend

    return topology_for_backend({}).link_peak()


@pytest.fixture
def no_process_left_behind():
    before = child_pids()
    yield
    assert child_pids() <= before, "a rank outlived run_allreduce"


def test_nccl_all_reduce_across_every_gpu_is_correct(no_process_left_behind):
    peak = link_peak()
    result = run_allreduce(backend="nccl", sizes=[4 * KIB, MIB, 64 * MIB], iterations=5, timeout_s=300, peak=peak)
    assert result.ok, str(result)
    assert result.backend == "nccl" and result.world_size == GPUS
    assert [device.split()[0] for device in result.devices] == [f"cuda:{index}" for index in range(GPUS)]
    for row in result.rows:
        assert row.wrong == 0 and row.time_s > 0
        if GPUS >= 2:
            assert row.busbw == pytest.approx(row.algbw * 2 * (GPUS - 1) / GPUS)
        else:
            assert row.busbw == 0 and row.ratio is None
    largest = result.rows[-1]
    if GPUS >= 2 and peak is not None:
        assert 0 < largest.ratio < 1.5, f"busbw {largest.busbw / 1e9:.1f} GB/s against {peak.description}"
    print(result)


def test_auto_is_nccl_with_one_process_per_gpu(no_process_left_behind):
    result = run_allreduce(sizes=[MIB], iterations=2, timeout_s=300)
    assert (result.backend, result.world_size, result.ok) == ("nccl", GPUS, True)


@needs_two
def test_every_pairs_p2p_copy_arrives_intact(no_process_left_behind):
    result = run_allreduce(backend="nccl", sizes=[MIB], iterations=2, timeout_s=300)
    pairs = {(copy.src, copy.dst) for copy in result.p2p}
    assert pairs == {(f"cuda:{a}", f"cuda:{b}") for a in range(GPUS) for b in range(GPUS) if a != b}
    for copy in result.p2p:
        assert copy.wrong == 0, f"{copy.src} -> {copy.dst}: {copy.wrong} of {copy.elements} elements wrong"
        assert copy.bytes_per_s > 1e9  # any GPU link moves 64 MiB faster than 1 GB/s
    print(result)


def test_the_command_runs_nccl_and_exits_0():
    done = subprocess.run([sys.executable, "-m", "jupyter_gpu", "allreduce", "--sizes", "1M,64M", "--iterations", "5"],
                          env=dict(os.environ), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"nccl, {GPUS} process" in done.stdout
    print(done.stdout)


def test_the_readiness_report_reads_the_real_nvml_topology_and_nccl():
    from jupyter_gpu.distributed.gather import gather_readiness
    from jupyter_gpu.distributed.report import ReadinessReport
    from jupyter_gpu.facts.context import ProbeContext

    facts = gather_readiness(ProbeContext.from_environment(), user_ns={})
    assert facts["topology"]["status"] == "ok" and not facts["topology"]["simulated"]
    assert len(facts["topology"]["gpus"]) >= GPUS  # NVML sees every GPU; CUDA_VISIBLE_DEVICES may hide some
    assert facts["torch"]["nccl_available"] is True and facts["torch"]["nccl_version"]
    assert facts["torch"]["device_count"] == GPUS
    report = ReadinessReport.from_facts(facts)
    print(report)  # recorded in the issue note by scripts/gpu-check.sh
    assert report.verdict.startswith("Ready for DistributedDataParallel") or GPUS < 2, report.verdict
