"""%%gputime on a real NVIDIA GPU: CUDA events, synchronisation, CUDA operator counts, memory, NVML busy.

Not part of the default run (`-m "not gpu"`); scripts/gpu-check.sh runs them.
"""

from __future__ import annotations

import pytest
from cuda_state import warm_up_cuda_libraries

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ip():
    import torch
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython() or InteractiveShell.instance()
    shell.run_line_magic("load_ext", "jupyter_gpu")
    shell.user_ns["torch"] = torch
    shell.run_cell("import time\na = torch.randn(4096, 4096, device='cuda')\ntorch.cuda.synchronize()")
    # cuBLAS's workspaces now, not inside a timed cell whose memory change a test checks (whichever runs first).
    warm_up_cuda_libraries()
    return shell


def timed(ip, line: str, body: str):
    outcome = ip.run_cell(f"%%gputime -q -o {line}\n{body}")
    outcome.raise_error()
    print(outcome.result)
    return outcome.result


def test_cpu_only_cell_never_initialises_cuda_and_is_told_to_use_the_gpu(fresh_kernel):
    out = fresh_kernel("""
        import torch
        ip.run_cell("import torch")  # the notebook's own import: the shell's namespace is not this script's
        r = ip.run_cell("%%gputime -q -o -n 3 -r 2\\nx = torch.ones(100) * 2").result
        print(json.dumps({"init": torch.cuda.is_initialized(), "ops": r.ops_by_device,
                          "codes": [f.code for f in r.findings], "gpu": r.context["gpu_devices"]}))
    """)
    assert out["init"] is False
    assert out["ops"] == {"cpu": 1}
    assert "NO_GPU_WORK" in out["codes"] and out["gpu"]


def test_cell_that_initialises_cuda_is_told_so(fresh_kernel):
    out = fresh_kernel("""
        import torch
        ip.run_cell("import torch")  # the notebook's own import: the shell's namespace is not this script's
        r = ip.run_cell("%%gputime -q -o\\nx = torch.ones(100, device='cuda') * 2").result
        print(json.dumps({"codes": [f.code for f in r.findings], "first_gpu": r.first_gpu_time,
                          "ops": r.ops_by_device}))
    """)
    assert "CUDA_INITIALIZED_BY_CELL" in out["codes"]
    assert out["first_gpu"] is None  # no CUDA clock could start before the cell created the context
    assert out["ops"].get("cuda", 0) >= 2


def test_cuda_events_time_the_work_that_percent_timeit_misses(ip):
    result = timed(ip, "-n 5 -r 3", "b = a @ a")
    assert all(t is not None for t in result.gpu_times)
    # Synchronised wall time and the CUDA-event span agree for a GPU-bound cell.
    assert result.gpu_median == pytest.approx(result.median, rel=0.25)
    unsynchronised = ip.run_line_magic("timeit", "-n 5 -r 3 -q -o b = a @ a")
    ip.run_cell("torch.cuda.synchronize()")
    # %timeit times kernel launches; the matmul itself takes far longer.
    assert result.median > 5 * unsynchronised.best


def test_earlier_cells_queued_work_is_not_billed(ip):
    ip.run_cell("torch.cuda.synchronize()\nstarted = time.perf_counter()\n"
                "for _ in range(30): c = a @ a\ntorch.cuda.synchronize()\nqueued = time.perf_counter() - started")
    queued = ip.user_ns["queued"]
    ip.run_cell("for _ in range(30): c = a @ a")  # queued, not waited for
    result = timed(ip, "", "d = a[0, 0] + 1")
    assert result.median < 0.3 * queued, (result.median, queued)


def test_copies_and_waits_are_counted(ip):
    result = timed(ip, "", "x = torch.randn(1000).cuda()\ny = x.cpu()\nv = x.sum().item()\nprint(x[:3])")
    ops = result.ops
    assert ops.copies.get("host_to_device") == 1 and ops.copies.get("device_to_host", 0) >= 1
    assert ops.copy_bytes["host_to_device"] == 4000
    assert any(".item()" in what for what in ops.syncs) and any("print" in what for what in ops.syncs)
    assert ops.by_device.get("cuda", 0) >= 2


def test_cuda_memory_peak_and_change(ip):
    kept = timed(ip, "", "big = torch.empty(256 * 2**20, dtype=torch.uint8, device='cuda')")
    memory = kept.memory[0]
    assert memory.device == "cuda:0" and memory.peak_allocated >= 256 * 2**20
    assert memory.allocated_delta >= 256 * 2**20
    scratch = timed(ip, "", "tmp = torch.empty(512 * 2**20, dtype=torch.uint8, device='cuda')\ndel tmp")
    assert scratch.memory[0].peak_allocated >= 512 * 2**20
    assert abs(scratch.memory[0].allocated_delta) < 2**20
    ip.run_cell("del big")


def test_gpu_busy_fraction_from_nvml(ip):
    busy = timed(ip, "", "started = time.perf_counter()\n"
                         "while time.perf_counter() - started < 1.5:\n    c = a @ a\n    torch.cuda.synchronize()")
    assert busy.busy is not None and busy.busy.percent > 50, busy.busy
    idle = timed(ip, "", "c = a @ a\ntime.sleep(1.5)")
    assert idle.busy is not None and idle.busy.percent < 50, idle.busy
    assert "GPU_MOSTLY_IDLE" in {f.code for f in idle.findings}
