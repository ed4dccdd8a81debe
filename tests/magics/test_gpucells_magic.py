"""`%gpucells` in a real IPython shell: every finished cell is recorded from `%load_ext`, its GPU figures measured
around it only when CUDA is already up, and the cells to look at flagged.

The GPU is what this machine lacks: `torch.cuda` is the fake that fails the way torch's does (fixtures/fake_cuda.py),
and the sampler reads the simulated H200. The shell, the recorder, the rules and torch itself are real.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
from fake_cuda import FakeCuda, FakeGpu, nvml_uuid

from jupyter_gpu.metrics.backends.base import BACKEND_ENV
from jupyter_gpu.metrics.backends.claims import CLAIMS_ENV, claim_memory, release_memory
from jupyter_gpu.metrics.hub import close_shared_hubs, shared_hub

MIB = 1 << 20


@pytest.fixture
def cuda(monkeypatch):
    """Two H200s; the kernel already initialised CUDA on GPU 0."""
    fake = FakeCuda([FakeGpu(uuid=nvml_uuid(0)), FakeGpu(uuid=nvml_uuid(1))])
    monkeypatch.setattr(torch, "cuda", fake)
    return fake


def last_rows(ip, count=10):
    return ip.run_line_magic("gpucells", f"-n {count} -q -o").rows


def test_every_cell_since_load_ext_is_a_row_with_its_wall_time_and_first_line(ip):
    ip.run_cell("import time", store_history=True)
    ip.run_cell("# sleep a known time\ntime.sleep(0.3)", store_history=True)
    ip.run_cell("1 / 0", store_history=True)  # a failing cell is a row too
    rows = last_rows(ip, 3)
    first = ip.execution_count - 3
    assert [row.execution_count for row in rows] == [first, first + 1, first + 2]
    assert rows[1].cell == "# sleep a known time" and 0.29 <= rows[1].wall_seconds < 3
    assert [row.gpu_seconds for row in rows] == [None] * 3 and [row.peak_allocated for row in rows] == [None] * 3
    assert not torch.cuda.is_initialized()  # the CPU torch: nothing here started CUDA


def test_the_table_is_shown_and_n_picks_how_many(ip, capsys):
    for n in range(4):
        ip.run_cell(f"x{n} = {n}", store_history=True)
    capsys.readouterr()
    ip.run_line_magic("gpucells", "-n 2")
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("gpucells: the last 2 cells of ") and "recorded" in out[0]
    assert [line.split()[2] for line in out[2:4]] == ["x2", "x3"]


def test_with_cuda_up_a_cell_gets_its_gpu_time_peak_and_what_it_left_behind(ip, cuda):
    ip.user_ns["cuda"] = cuda
    ip.run_cell("kept = cuda.allocate(64 * 2**20)\ntemp = cuda.allocate(256 * 2**20)\ncuda.launch(40.0)\n"
                "cuda.free(temp)", store_history=True)
    row = last_rows(ip, 1)[0]
    assert row.gpu_seconds == pytest.approx(0.040)
    assert row.peak_allocated == 320 * MIB and row.left_behind == 64 * MIB and row.allocated_after == 64 * MIB
    assert row.held_gpu and not row.cuda_started
    assert cuda.event_waits == [0], "one wait, at the cell's end, on the GPU this kernel has a context on"
    assert cuda.contexts == {0}, "no context on GPU 1, which the kernel never used"
    ip.run_cell("cuda.free(kept)", store_history=True)
    assert last_rows(ip, 1)[0].left_behind == -64 * MIB


def test_a_cell_that_starts_cuda_gets_its_memory_but_no_gpu_time(ip, monkeypatch):
    fake = FakeCuda(initialized=False)
    monkeypatch.setattr(torch, "cuda", fake)
    ip.user_ns["cuda"] = fake
    ip.run_cell("x = 1", store_history=True)
    assert not fake.initialized and fake.event_waits == [], "a cell without CUDA is never made to start it"
    ip.run_cell("cuda.current_device()\nweights = cuda.allocate(100 * 2**20)\ncuda.launch(5.0)", store_history=True)
    before, started = last_rows(ip, 2)
    assert before.peak_allocated is None and before.gpu_seconds is None
    assert started.cuda_started and started.gpu_seconds is None
    assert started.peak_allocated == 100 * MIB and started.left_behind == 100 * MIB
    text = str(ip.run_line_magic("gpucells", "-n 1 -q -o"))
    assert "CUDA started" in text.splitlines()[2]


def test_a_cell_run_again_that_keeps_growing_memory_is_flagged(ip, cuda):
    ip.user_ns.update(cuda=cuda, held=[])
    for _ in range(3):
        ip.run_cell("held.append(cuda.allocate(8 * 2**20))", store_history=True)
    rows = last_rows(ip, 3)
    assert all("memory-grows" in [flag.code for flag in row.flags] for row in rows)
    assert "+8.0 MiB, +8.0 MiB, +8.0 MiB" in rows[-1].flags[0].message


def test_a_failing_record_never_breaks_the_cell_and_the_row_says_why(ip, cuda, monkeypatch, capsys):
    def broken(device=None):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(cuda, "reset_peak_memory_stats", broken)
    result = ip.run_cell("y = 21 * 2", store_history=True)
    assert result.success and ip.user_ns["y"] == 42
    assert "Error in callback" not in capsys.readouterr().err
    row = last_rows(ip, 1)[0]
    assert row.error.startswith("at the start: RuntimeError: CUDA error: an illegal memory access")
    assert row.wall_seconds >= 0


def test_while_the_sampler_runs_a_long_cell_on_an_idle_gpu_this_kernel_holds_is_flagged(ip, tmp_path, monkeypatch):
    monkeypatch.setenv(BACKEND_ENV, "simulated:h200")  # an idle H200 (0-5 %)
    monkeypatch.setenv(CLAIMS_ENV, str(tmp_path))
    claim_memory("2GB", device=0)  # NVML then lists this process on it, as it lists a kernel holding the GPU
    lease = shared_hub().acquire(interval=0.1)
    try:
        ip.run_cell("import time; time.sleep(5.3)", store_history=True)
        ip.run_cell("z = 1", store_history=True)
        long, short = last_rows(ip, 2)
    finally:
        lease.close()
        release_memory()
        close_shared_hubs()
    assert long.readings >= 30 and long.gpu_busy < 10 and long.held_gpu
    assert long.flags[0].code == "idle-gpu"
    assert short.flags == () and short.readings <= 2


def test_the_rows_go_into_a_gpucheck_snapshot(ip, cuda, tmp_path):
    ip.user_ns["cuda"] = cuda
    ip.run_cell("cuda.launch(12.0)", store_history=True)
    path = tmp_path / "facts.json"
    ip.run_line_magic("gpucheck", f"-q --save {path}")
    cells = json.loads(path.read_text())["notebook"]["activity"]["cells"]
    launched = next(cell for cell in cells if cell["cell"] == "cuda.launch(12.0)")
    assert launched["gpu_seconds"] == pytest.approx(0.012) and launched["execution_count"] is not None
    assert json.loads(path.read_text())["notebook"]["activity"]["pid"] == os.getpid()


@pytest.mark.timing
def test_recording_costs_under_a_millisecond_per_cell_before_cuda_starts(ip):
    from jupyter_gpu.magics.activity import activity_for

    recorder = activity_for(ip)
    info = type("Info", (), {"raw_cell": "for i in range(10):\n    total += i", "cell_id": None})()
    result = type("Result", (), {"execution_count": 7})()
    recorder._pre(info)
    recorder._post(result)  # the first cell imports the meter
    runs = 2000
    began = time.perf_counter()
    for _ in range(runs):
        recorder._pre(info)
        recorder._post(result)
    per_cell = (time.perf_counter() - began) / runs
    assert per_cell < 1e-3, f"{per_cell * 1e6:.0f} µs per cell"
