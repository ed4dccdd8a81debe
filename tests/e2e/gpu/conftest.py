"""What the gpu-marked tests here share: the warm-up of cuBLAS's workspaces before memory is measured, a fresh
process for checks that need CUDA untouched, and whether NVML lists this machine's process IDs at all. (The skip
where CUDA is not available is in tests/conftest.py, for every gpu-marked test.)"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest
from cuda_state import warm_up_cuda_libraries


@pytest.fixture
def cublas_workspace() -> int:
    """The bytes cuBLAS's workspaces hold once warm (see `warm_up_cuda_libraries`)."""
    return warm_up_cuda_libraries()


FRESH_KERNEL = """
import json
from IPython.testing.globalipapp import start_ipython
ip = start_ipython()
ip.run_line_magic("load_ext", "jupyter_gpu")
"""


@pytest.fixture
def fresh_kernel() -> Callable[[str], Any]:
    """Run code in a new IPython shell in a new process, where CUDA was never initialised, and return the JSON it
    prints last. Checks that CUDA stays uninitialised need one: in this pytest process an earlier test, or a
    module-scoped fixture, may have initialised it already."""

    def run(code: str) -> Any:
        done = subprocess.run([sys.executable, "-c", FRESH_KERNEL + textwrap.dedent(code)], capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    return run


PID_PROBE = """
import json, os, sys, time
import pynvml, torch

held = torch.ones(1 << 20, device="cuda")  # a CUDA context and 4 MiB: NVML lists a process once it has a context
torch.cuda.synchronize()
pynvml.nvmlInit()
seen, error = set(), None
deadline = time.monotonic() + float(sys.argv[1])
while os.getpid() not in seen and error is None and time.monotonic() < deadline:
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            seen.update(process.pid for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
    except Exception as exc:  # NVMLError, or NVMLLibraryMismatchError (not an NVMLError) on drivers before R510
        error = f"{type(exc).__name__}: {exc}"
    time.sleep(0.2)
print(json.dumps({"pid": os.getpid(), "listed": os.getpid() in seen, "seen": sorted(seen), "error": error}))
"""


@pytest.fixture(scope="session")
def nvml_lists_our_pids() -> None:
    """Skip unless NVML's process lists hold this machine's process IDs.

    Inside a container's PID namespace, and under gVisor, NVML reports host PIDs (or none), so a process holding a
    CUDA context is never found under its own `os.getpid()`, and a test that matches a notebook's kernel through
    NVML would wait for a match that cannot come. Found out once, in a child that holds a context and looks for
    its own PID for a few seconds.
    """
    done = subprocess.run([sys.executable, "-c", PID_PROBE, "5"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if found["error"] is not None:
        pytest.skip(f"NVML cannot list the processes on this GPU: {found['error']}")
    if not found["listed"]:
        pytest.skip(f"NVML does not list this machine's process IDs (a container's PID namespace, or gVisor): "
                    f"process {found['pid']} holds a CUDA context, and for 5 s NVML listed {found['seen']}")
