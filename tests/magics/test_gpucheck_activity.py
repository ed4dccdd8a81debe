"""`%gpucheck` after a long cell, with the shared sampler running (as under an open `%gpupanel`): the cell's GPU
utilisation in the stack block and, when this kernel held a GPU it barely used, LOW_GPU_UTILIZATION.

A real IPython shell and the real sampler, recorder and rules; the simulated H200 stands in for the GPU this
machine lacks, and a memory claim makes it list this process as NVML lists a kernel that holds the GPU.
"""

from __future__ import annotations

import os

import pytest

from jupyter_gpu.metrics.backends.base import BACKEND_ENV
from jupyter_gpu.metrics.backends.claims import CLAIMS_ENV, claim_memory, release_memory
from jupyter_gpu.metrics.hub import close_shared_hubs, shared_hub


@pytest.fixture
def watched(ip, tmp_path, monkeypatch):
    """An idle simulated H200 (0-5 %) on which this process holds memory, sampled every 0.1 s."""
    monkeypatch.setenv(BACKEND_ENV, "simulated:h200")
    monkeypatch.setenv(CLAIMS_ENV, str(tmp_path))
    claim_memory("2GB", device=0)
    lease = shared_hub().acquire(interval=0.1)
    yield ip
    lease.close()
    release_memory()
    close_shared_hubs()


def test_a_long_cell_on_an_idle_gpu_this_kernel_holds_gives_low_gpu_utilization(watched):
    watched.run_cell("import time; time.sleep(5.3)", store_history=True)
    cell = watched.execution_count - 1
    report = watched.run_line_magic("gpucheck", "-q -o")
    finding = next(f for f in report.findings if f.code == "LOW_GPU_UTILIZATION")
    assert finding.headline.startswith(f"The GPU was busy {report.stack.last_cell.utilization_percent:.0f}% "
                                       f"of the time during In [{cell}]")
    assert finding.evidence["backend"] == "simulated" and finding.evidence["gpus"] == ["GPU 0"]
    last = report.stack.last_cell
    assert last.utilization_percent < 10 and last.samples >= 30 and last.held_gpu
    assert last.execution_count == cell and 5.0 <= last.seconds < 30
    row = next(line for line in str(report).splitlines() if "last long cell" in line)
    assert f"In [{cell}]" in row and row.endswith("[simulated]")
    assert report.facts["notebook"]["activity"]["pid"] == os.getpid()


def test_short_cells_leave_no_row_and_no_finding(watched):
    watched.run_cell("x = 1", store_history=True)
    report = watched.run_line_magic("gpucheck", "-q -o")
    assert report.stack.last_cell is None
    assert "LOW_GPU_UTILIZATION" not in report.codes
