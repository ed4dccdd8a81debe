from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.testing.globalipapp import start_ipython

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))

from fake_machine import Machine

from jupyter_gpu.facts.context import ProbeContext
from jupyter_gpu.facts.gather import gather_facts
from jupyter_gpu.gpucheck.diagnose.engine import diagnose
from jupyter_gpu.gpucheck.report import GpuCheckReport
from jupyter_gpu.probekit.storages import live_storages

# nbval waits a hard-coded 5 s for each output message once a notebook cell has replied. Under the suite's own
# parallel load on 2 cores, a kernel's output once came later than that (04_gpupanel.ipynb, cell 5, run 9 of ten
# clean-clone runs, "Timeout of 5 seconds exceeded waiting for output"). The outputs are still compared; only the wait
# for them is longer.
NOTEBOOK_OUTPUT_WAIT_SECONDS = 30

# Tests that spend their time waiting (for a browser's polls and backoff, a server's sampler, a notebook's sleep), not
# computing: `./dev test` runs them (marker `waits`) in a lane of their own beside the two parallel workers, where
# they overlap the CPU-bound tests instead of taking a core's turn. Measured on a warm checkout (CPU = the test
# process and its reaped children): the browser tests 114 s of wall time for 19 s of CPU, the real Prometheus 10 s for
# 0.4 s, the server API 9.6 s for 1.4 s, the autoload kernels 15.8 s for 3.4 s, notebook 04 10.4 s for 1.2 s, the
# sampler-fed idle-GPU flags of %gpucells and %gpucheck 5.7 s and 5.6 s for 0.2 s each, the panel widget 4.0 s for
# 0.2 s, a stuck start-up check's timeout 5.1 s for 0.6 s, `jupyter-gpu record` 2.8 s for 0.6 s.
MOSTLY_WAITING = (
    "tests/e2e/browser/", "tests/server/test_real_prometheus.py", "tests/server/test_server_api.py",
    "tests/server/test_stream.py",
    "tests/autoload/test_autoload_kernel.py", "example_notebooks/04_gpupanel.ipynb",
    "tests/magics/test_gpucells_magic.py", "tests/magics/test_gpucheck_activity.py", "tests/widgets/test_panel.py",
    "tests/autoload/test_startup_check.py", "tests/cli/test_record.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        # A test that lays out a fake machine runs the real probe children on it: it starts processes, so it belongs
        # to the whole suite, not to the fast loop (`./dev test --fast` selects "not probe_children").
        if "lay_out" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.probe_children)
        if item.nodeid.startswith(MOSTLY_WAITING):
            item.add_marker(pytest.mark.waits)
        if hasattr(item, "output_timeout"):  # an nbval notebook cell (this hook sees every collected item)
            item.output_timeout = NOTEBOOK_OUTPUT_WAIT_SECONDS


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Every gpu-marked test skips with its reason where CUDA is not available, before any fixture: a module-scoped
    # shell or model that touches CUDA is never built on a machine without it.
    if item.get_closest_marker("gpu") is not None:
        from cuda_state import cuda_missing

        if (reason := cuda_missing()) is not None:
            pytest.skip(reason)


@pytest.fixture(autouse=True, scope="session")
def _probe_cache_in_a_temp_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Checks run with the real environment keep the torch-probe cache out of the user's ~/.cache: one folder per
    test process, shared by its tests as processes on one machine share it (the cache is keyed on everything the
    probe depends on). A folder per test cost 2.3 ms each, 7 s of the fast loop's 3,000 tests."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JUPYTER_GPU_CACHE_DIR", str(tmp_path_factory.mktemp("probe-cache")))
        yield


@pytest.fixture(scope="module")
def shell() -> InteractiveShell:
    """The one global IPython test shell (start_ipython() makes it, and returns None once it exists)."""
    return start_ipython() or InteractiveShell.instance()


@pytest.fixture
def ip(shell: InteractiveShell):
    """The shell with the extension loaded, as after `%load_ext jupyter_gpu`; the user's names go afterwards."""
    shell.run_line_magic("load_ext", "jupyter_gpu")
    yield shell
    shell.run_line_magic("unload_ext", "jupyter_gpu")
    for name in [n for n in shell.user_ns if not n.startswith("_") and n not in ("In", "Out", "exit", "quit",
                                                                                   "get_ipython")]:
        shell.user_ns.pop(name, None)


@pytest.fixture(scope="session")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh virtual environment with nothing installed: no torch, no pynvml."""
    venv = tmp_path_factory.mktemp("bare-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return str(venv / "bin" / "python")


@pytest.fixture
def lay_out(tmp_path: Path, bare_python: str) -> Callable[..., ProbeContext]:
    def build(machine: Machine, **context: object) -> ProbeContext:
        return machine.build(tmp_path, bare_python, **context)

    return build


@pytest.fixture
def check_machine(lay_out: Callable[..., ProbeContext]) -> Callable[..., GpuCheckReport]:
    """Gather facts from a fake machine with the real code, then diagnose them."""

    def check(machine: Machine, **context: object) -> GpuCheckReport:
        return diagnose(gather_facts(lay_out(machine, **context)))

    return check


@pytest.fixture(scope="session")
def lab_a100(tmp_path_factory: pytest.TempPathFactory):
    """A real JupyterLab under a JupyterHub-style base URL, eight simulated A100s (tests/fixtures/lab_server.py)."""
    from lab_server import start_lab_server

    server = start_lab_server(tmp_path_factory.mktemp("lab-a100"), "a100x8-mig", base_url="/user/alice/")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def lab_nodriver(tmp_path_factory: pytest.TempPathFactory):
    """A real JupyterLab on a machine with no NVIDIA driver (simulated)."""
    from lab_server import start_lab_server

    server = start_lab_server(tmp_path_factory.mktemp("lab-nodriver"), "nodriver")
    yield server
    server.stop()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze every object that exists once the tests are collected, so full collections and scans skip them.

    A test process has imported every library the suite uses (JupyterLab, Playwright, nbformat, matplotlib...):
    about 435,000 objects that the cycle collector and `gc.get_objects()` walked at each probe's collection and
    each live-storage scan, against 250,000-300,000 in a notebook kernel with torch. The probes' tests spent half
    their time there (96 s -> 40 s for four batch-probe files). Frozen objects are never collected and are not
    listed by `gc.get_objects()`, so no tensor may be among them: the live-storage scans must still see every
    tensor a test makes. Checked here; a module-level tensor in a test file stops the run, saying why.
    """
    gc.collect()
    torch = sys.modules.get("torch")  # not imported: no tensor can exist
    # The probes' own scan, so the check sees exactly what freezing would hide from them.
    if torch is not None and next(live_storages(torch), None) is not None:
        raise pytest.UsageError("a tensor exists after collection (module-level in a test file?); tests/conftest.py "
                                "freezes what exists then, and the probes' scans would miss it: build it inside the "
                                "test or fixture")
    gc.freeze()
