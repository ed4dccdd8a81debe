"""Timings taken while other processes hold the CPU cores: measured from /proc for real, with real busy processes
that are not this test's children (as another notebook's training is not the probe's)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from training_steps import assert_same_state, mlp_with_adam, state_of

from jupyter_gpu.probekit.cpu_contention import CpuContention
from jupyter_gpu.speedprobe.runner import probe_speed

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")


def test_threads_that_outnumber_the_cores_left_are_oversubscribed() -> None:
    assert CpuContention(others=1.0, cores=2, threads=2).oversubscribed  # a second notebook training
    assert not CpuContention(others=0.2, cores=2, threads=2).oversubscribed  # a browser tab, a monitor
    assert not CpuContention(others=1.0, cores=8, threads=4).oversubscribed  # cores to spare
    sentence = CpuContention(others=1.0, cores=2, threads=2).sentence()
    assert "1.0 of this machine's 2 CPU cores" in sentence and "torch.set_num_threads(1)" in sentence


@contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """`count` processes spinning on the CPU, started through a shell that exits: not this process's children."""
    started = subprocess.run(["sh", "-c", f"for i in $(seq {count}); do {sys.executable} -c 'while True: pass' "
                                          ">/dev/null 2>&1 & echo $!; done"], capture_output=True, text=True,
                             check=True).stdout.split()
    try:
        time.sleep(0.2)
        yield
    finally:
        for pid in started:
            os.kill(int(pid), signal.SIGKILL)


def test_a_probe_run_beside_busy_processes_recommends_nothing_and_says_why() -> None:
    cores = len(os.sched_getaffinity(0))
    threads = torch.get_num_threads()
    torch.set_num_threads(cores)  # torch's default: a thread per core, each one a busy process can hold up
    training = mlp_with_adam()
    before = state_of(training)
    try:
        with busy_processes(cores):
            result = probe_speed(training.step, options=("fused-optimizer",), steps=3,
                                 namespace=training.namespace())
    finally:
        torch.set_num_threads(threads)
    assert_same_state(before, state_of(training))
    assert result.best is None and result.code() == []
    assert result.shared_cpu is not None and "other processes kept" in result.shared_cpu
    assert "no recommendation: other processes kept" in str(result)
    assert result.to_dict()["shared_cpu"] == result.shared_cpu


def test_this_process_s_live_children_count_as_its_own_cpu_time() -> None:
    # A DataLoader's workers are the probe's own: their CPU time is taken off the machine's busy time with the
    # probe's, or a loader with workers would read as other processes holding the cores.
    from jupyter_gpu.probekit.cpu_contention import _live_children_seconds

    ticks = os.sysconf("SC_CLK_TCK")
    spin = "import time\nend = time.time() + 3\nwhile time.time() < end: pass"
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(1.5)
        assert _live_children_seconds(ticks) >= 0.5  # it has spun for most of that
    finally:
        child.kill()
        child.wait()
