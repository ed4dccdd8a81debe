"""`jupyter-gpu allreduce` as a user runs it: real processes, the table on stdout, progress on stderr, and the exit
status a script can test."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch.distributed

NO_NCCL = not (torch.distributed.is_available() and torch.distributed.is_nccl_available())


def allreduce(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jupyter_gpu", "allreduce", *args], env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not NO_NCCL, reason="on a CUDA build the default is NCCL across the GPUs")
def test_default_backend_on_a_cpu_build_is_two_gloo_processes_and_every_result_correct():
    done = allreduce("--sizes", "4K,1M", "--iterations", "3")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("✓ all-reduce: all 2 sizes correct; busbw ")
    assert "gloo, 2 processes (cpu)" in done.stdout
    heading = next(line for line in lines if "#wrong" in line)
    assert heading.split() == ["size", "count", "type", "time", "(us)", "algbw", "(GB/s)", "busbw", "(GB/s)",
                               "#wrong", "%", "of", "peak"]
    assert any(line.split()[:2] == ["1.0", "MiB"] and line.split()[-2] == "0" for line in lines)
    assert "2 ranks ready in" in done.stderr and "1.0 MiB:" in done.stderr  # progress, not in the table
    assert "ranks ready" not in done.stdout


def test_json_with_three_processes_follows_the_bus_bandwidth_formula():
    done = allreduce("--backend", "gloo", "--processes", "3", "--sizes", "64K", "--iterations", "2", "--json", "-q")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # -q: no progress either
    result = json.loads(done.stdout)
    assert result["ok"] is True and result["world_size"] == 3 and result["devices"] == ["cpu"] * 3
    (row,) = result["rows"]
    assert row["wrong"] == 0 and row["size_bytes"] == 65536
    assert row["busbw"] == pytest.approx(row["algbw"] * 4 / 3)


def test_a_failing_rank_exits_1_with_its_error_on_stderr():
    done = allreduce("--backend", "gloo", "--sizes", "4K", "--iterations", "1", env={"GLOO_SOCKET_IFNAME": "nosuchif0"})
    assert done.returncode == 1
    assert done.stdout == ""
    assert "jupyter-gpu: Rank " in done.stderr and "Unable to find address for: nosuchif0" in done.stderr


@pytest.mark.skipif(not NO_NCCL, reason="this torch has NCCL")
def test_nccl_without_nccl_exits_1_and_points_to_gloo():
    done = allreduce("--backend", "nccl")
    assert done.returncode == 1
    assert done.stderr.startswith("jupyter-gpu: This torch (") and "use --backend gloo" in done.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--sizes", "1X"], "Argument --sizes: '1X' is not a size; write sizes as a list like 1K,64K,16M or a range "
                        "FROM:TO[:FACTOR] like 8:64M (powers of 2 from 8 B to 64 MiB)."),
    (["--sizes", "64M:8"], "Argument --sizes: the size range '64M:8' ends below where it starts."),
    (["--processes", "0"], "Argument --processes: --processes must be at least 1, not 0."),
    (["--iterations", "many"], "Argument --iterations: --iterations needs a whole number, not 'many'."),
    (["--timeout", "-1"], "Argument --timeout: --timeout must be a positive number of seconds, not -1."),
    (["--backend", "mpi"], "Argument --backend: invalid choice: 'mpi' (choose from "),  # quoting varies by Python
])
def test_usage_errors_exit_2_with_one_sentence(args, message):
    done = allreduce(*args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith(f"jupyter-gpu: {message}") and done.stderr.count("\n") == 1


def test_help_documents_the_size_syntax():
    done = allreduce("--help")
    assert done.returncode == 0
    assert "FROM:TO[:FACTOR]" in done.stdout and "powers of 1024 as in" in done.stdout
