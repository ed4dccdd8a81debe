"""Real kernels in a temporary environment, for the autoload tests and the bench.

The environment is a bare venv whose site-packages holds one `.pth` line that adds this project's
site-packages as a site dir (processing its `.pth` files too, so the editable jupyter_gpu install is seen):
kernels started with its interpreter have `sys.prefix` = the temporary environment, so
`jupyter-gpu autoload on --prefix ENV` affects only them. IPYTHONDIR points into the temporary folder, so the
profile of whoever runs the tests is never read.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

from jupyter_gpu.autoload.config import SILENCE_VARIABLE

KERNEL_NAME = "autoload-test"
STARTUP_TIMEOUT_S = 60


@dataclass(frozen=True)
class TempEnvironment:
    prefix: Path
    python: str
    ipython_dir: Path
    kernels: Path  # a kernelspec folder (what a temp JUPYTER_PATH would hold under kernels/)

    def autoload(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """`jupyter-gpu autoload ARGS --prefix ENV`, run by this project's interpreter as a user would."""
        return subprocess.run([sys.executable, "-m", "jupyter_gpu", "autoload", *args, "--prefix", str(self.prefix)],
                              capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})


TORCH_ENTRIES = ("torch", "torchgen", "functorch")  # what `pip install torch` puts in site-packages


def make_environment(base: Path, *, without_torch: bool = False) -> TempEnvironment:
    """A temporary environment seeing this project's packages; `without_torch` hides the CPU torch (a stub
    torch on PYTHONPATH then stands alone, as on a real GPU machine, instead of shadowing an installed one)."""
    prefix = base / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True)
    python = prefix / "bin" / "python"
    target = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    project = Path(site.getsitepackages()[0])
    if without_torch:
        filtered = base / "site-packages-without-torch"
        filtered.mkdir()
        for entry in project.iterdir():
            if entry.name not in TORCH_ENTRIES and not entry.name.startswith("torch-"):
                (filtered / entry.name).symlink_to(entry)
        project = filtered
    Path(target, "project-site.pth").write_text(f"import site; site.addsitedir({str(project)!r})\n")
    ipython_dir = base / "ipython"
    ipython_dir.mkdir()
    kernels = base / "kernels"
    (kernels / KERNEL_NAME).mkdir(parents=True)
    (kernels / KERNEL_NAME / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "autoload test", "language": "python"}))
    return TempEnvironment(prefix, str(python), ipython_dir, kernels)


@dataclass
class CellResult:
    stdout: str = ""
    stderr: str = ""
    errors: list[str] = field(default_factory=list)
    user_expressions: dict[str, Any] = field(default_factory=dict)


class RunningKernel:
    """A kernel of the temporary environment, started and talked to with jupyter_client."""

    def __init__(self, environment: TempEnvironment, env: dict[str, str] | None = None,
                 cwd: str | None = None) -> None:
        inherited = {name: value for name, value in os.environ.items() if name != SILENCE_VARIABLE}
        kernel_env = {**inherited, "IPYTHONDIR": str(environment.ipython_dir), **(env or {})}
        self.manager = KernelManager(kernel_name=KERNEL_NAME,
                                     kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(environment.kernels)]))
        started = time.perf_counter()
        self.manager.start_kernel(env=kernel_env, cwd=cwd or str(environment.prefix.parent))
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=STARTUP_TIMEOUT_S)
        self.start_seconds = time.perf_counter() - started  # launch to the first kernel_info reply

    def run(self, code: str, *, silent: bool = False, user_expressions: dict[str, str] | None = None,
            timeout: float = 60) -> CellResult:
        msg_id = self.client.execute(code, silent=silent, store_history=not silent,
                                     user_expressions=user_expressions or {})
        result = CellResult()
        while True:
            message = self.client.get_iopub_msg(timeout=timeout)
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                if content["name"] == "stdout":
                    result.stdout += content["text"]
                else:
                    result.stderr += content["text"]
            elif kind == "error":
                result.errors.append(f"{content['ename']}: {content['evalue']}")
            elif kind == "status" and content["execution_state"] == "idle":
                break
        reply = self.client.get_shell_msg(timeout=timeout)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = self.client.get_shell_msg(timeout=timeout)
        result.user_expressions = {name: value.get("data", {}).get("text/plain", value.get("evalue"))
                                   for name, value in reply["content"].get("user_expressions", {}).items()}
        return result

    def evaluate(self, expression: str) -> str:
        """An expression's repr, evaluated in a silent request: no cell runs, so no pre_run_cell fires."""
        return self.run("", silent=True, user_expressions={"value": expression}).user_expressions["value"]

    def wait_for_check(self, timeout: float = 150) -> None:
        """Wait, without executing a cell, until the start-up check's child has finished."""
        deadline = time.monotonic() + timeout
        probe = "__import__('jupyter_gpu.autoload.extension').autoload.extension.STATE.finished.is_set()"
        while self.evaluate(probe) != "True":
            if time.monotonic() > deadline:
                raise TimeoutError(f"The start-up check did not finish within {timeout} s.")
            time.sleep(0.2)

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)

    def __enter__(self) -> RunningKernel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
