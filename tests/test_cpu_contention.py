"""Timings taken while other processes hold the CPU cores: measured from /proc for real, with real busy processes
that are not this test's children (as another notebook's training is not the probe's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from processes import busy_processes_on

from jupyter_gpu.probekit.cpu_contention import CpuContention

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")


def test_threads_that_outnumber_the_cores_left_are_oversubscribed() -> None:
    assert CpuContention(others=1.0, cores=2, threads=2).oversubscribed  # a second notebook training
    assert not CpuContention(others=0.2, cores=2, threads=2).oversubscribed  # a browser tab, a monitor
    assert not CpuContention(others=1.0, cores=8, threads=4).oversubscribed  # cores to spare
    sentence = CpuContention(others=1.0, cores=2, threads=2).sentence()
    assert "1.0 of this machine's 2 CPU cores" in sentence and "torch.set_num_threads(1)" in sentence


# The probe, in a child pinned to one core with torch's 2 threads on it, beside busy processes pinned there too:
# the contention stays on that core, so the tests running beside this one on the others are not starved (two
# unpinned busy processes had starved a browser test of the waiting lane).
PROBE = """
import json, os, torch
from torch import nn
torch.manual_seed(0)
torch.set_num_threads(2)
model = nn.Linear(64, 10)  # few operators a step: each one waits for a turn of the core
opt = torch.optim.Adam(model.parameters())
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
before = [p.detach().clone() for p in model.parameters()]

def step():
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss

from jupyter_gpu.speedprobe.runner import probe_speed
print("ready", flush=True)
input()  # the busy processes start now: importing torch on a shared core would take most of the test's time
result = probe_speed(step, options=("fused-optimizer",), steps=3, namespace={"model": model, "opt": opt})
print(json.dumps({"shared_cpu": result.shared_cpu, "best": result.best is not None, "text": str(result),
                  "restored": all(torch.equal(a, b) for a, b in zip(before, model.parameters()))}))
"""


def test_a_probe_run_beside_a_busy_process_recommends_nothing_and_says_why() -> None:
    core = max(os.sched_getaffinity(0))
    child = subprocess.Popen([sys.executable, "-c", PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    assert child.stdout is not None and child.stdout.readline().strip() == "ready", child.stderr
    # Three beside the probe's two threads: the scheduler shares the core by thread, so they hold 3/5 of it.
    with busy_processes_on(core, 3):
        output, errors = child.communicate("go\n", timeout=300)
    assert child.returncode == 0, errors[-2000:]
    result = json.loads(output.strip().splitlines()[-1])
    assert result["restored"]
    assert result["best"] is False
    assert result["shared_cpu"] is not None and "other processes kept" in result["shared_cpu"]
    assert "no recommendation: other processes kept" in result["text"]


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
