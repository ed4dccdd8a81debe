"""The torch probe's answer is cached on disk across processes, keyed on everything it depends on.

Each check here is a fresh `python -m jupyter_gpu check --json` process on a fake GPU machine (its own
HOME, so its own cache folder); the stub torch appends a line to a log each time it is imported, which is
how a test proves that a cached check started no torch child at all.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fake_machine import Machine

from jupyter_gpu.facts.context import ProbeContext
from jupyter_gpu.facts.probe_cache import cache_dir

REPO = Path(__file__).resolve().parents[2]


def log_torch_imports(ctx: ProbeContext) -> Path:
    """Make the machine's stub torch record every import of it in a log file; return the log's path."""
    log = Path(ctx.env["HOME"]) / "torch-imports.log"
    init = Path(ctx.env["PYTHONPATH"]) / "torch" / "__init__.py"
    init.write_text(f"open({str(log)!r}, 'a').write('imported\\n')\n" + init.read_text())
    return log


def imports(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


class Checker:
    """Runs `jupyter-gpu check --json` as a new process against one fake machine."""

    def __init__(self, ctx: ProbeContext) -> None:
        self.ctx = ctx
        self.log = log_torch_imports(ctx)

    def __call__(self, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
        full_env = {**self.ctx.env, "PYTHONPATH": f"{self.ctx.env['PYTHONPATH']}:{REPO}",
                    "JUPYTER_GPU_ROOT": str(self.ctx.root), **(env or {})}
        done = subprocess.run([self.ctx.python, "-m", "jupyter_gpu", "check", "--json", *args], env=full_env,
                              cwd=self.ctx.cwd, capture_output=True, text=True, timeout=120, check=False)
        assert done.stdout.startswith("{"), done.stdout + done.stderr
        return json.loads(done.stdout)

    @property
    def imports(self) -> int:
        return imports(self.log)


def probe_record(report: dict[str, Any]) -> dict[str, Any]:
    return report["facts"]["probe"]["torch"]


def verdict(report: dict[str, Any]) -> tuple[Any, ...]:
    return report["status"], report["verdict"], report["findings"], report["devices"]


@pytest.fixture
def gpu_machine(lay_out: Callable[..., ProbeContext]) -> Checker:
    return Checker(lay_out(Machine().nvidia_host().cuda_torch()))


def test_second_check_in_a_new_process_imports_no_torch_and_says_the_same(gpu_machine):
    first = gpu_machine()
    assert gpu_machine.imports == 1
    record = probe_record(first)
    assert record["ran"] and not record["cached"] and record["cache_status"] == "miss"
    entry = Path(record["cache_file"])
    assert entry.parent == Path(gpu_machine.ctx.env["HOME"]) / ".cache" / "jupyter-gpu" and entry.exists()

    second = gpu_machine()
    assert gpu_machine.imports == 1, "the cached check imported torch"
    again = probe_record(second)
    assert again["cached"] and again["ran"] and again["cache_status"] == "hit"
    assert again["cache_file"] == str(entry) and again["cache_created"]
    assert verdict(second) == verdict(first)
    assert second["facts"]["torch"] == first["facts"]["torch"]
    assert first["status"] == "ok"


def touch_torch_file(ctx: ProbeContext) -> None:
    version = Path(ctx.env["PYTHONPATH"]) / "torch" / "version.py"
    stat = version.stat()
    os.utime(version, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))


def upgrade_driver_file(ctx: ProbeContext) -> None:
    version = ctx.path("/proc/driver/nvidia/version")
    version.write_text(version.read_text().replace("570.124.06", "575.51.03"))


def add_device_node(ctx: ProbeContext) -> None:
    ctx.path("/dev/nvidia1").touch()


def shadow_torch_in_cwd(ctx: ProbeContext) -> None:
    (Path(ctx.cwd) / "torch").mkdir()


def swap_the_gpu(ctx: ProbeContext) -> None:
    # Only the base child sees this (NVML's GPU UUID): the entry is found, then found stale. A longer UUID
    # changes the file's size, so Python does not reuse its bytecode compiled within the same second.
    pynvml = Path(ctx.env["PYTHONPATH"]) / "pynvml.py"
    pynvml.write_text(pynvml.read_text().replace("GPU-1b2c3d4e", "GPU-another-1b2c3d4e"))


CHANGES: dict[str, tuple[Callable[[ProbeContext], None], dict[str, str]]] = {
    "a torch file's mtime": (touch_torch_file, {}),
    "the driver version file": (upgrade_driver_file, {}),
    "a new device node": (add_device_node, {}),
    "a torch folder in the working directory": (shadow_torch_in_cwd, {}),
    "CUDA_VISIBLE_DEVICES": (lambda ctx: None, {"CUDA_VISIBLE_DEVICES": "0"}),
    "the GPU NVML lists": (swap_the_gpu, {}),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_any_change_the_answer_depends_on_probes_again(gpu_machine, change):
    gpu_machine()
    assert probe_record(gpu_machine())["cached"]
    alter, env = CHANGES[change]
    alter(gpu_machine.ctx)
    changed = gpu_machine(env=env)
    record = probe_record(changed)
    assert not record["cached"] and record["ran"], f"{change}: the old answer was reused"
    assert gpu_machine.imports == 2
    assert record["cache_status"] == ("stale" if change == "the GPU NVML lists" else "miss")
    # The new answer is cached in turn.
    assert probe_record(gpu_machine(env=env))["cached"] and gpu_machine.imports == 2


def test_refresh_probes_again_and_rewrites_the_entry(gpu_machine):
    first = probe_record(gpu_machine())
    written = os.stat(first["cache_file"]).st_ino
    refreshed = probe_record(gpu_machine("--refresh"))
    assert gpu_machine.imports == 2
    assert refreshed["ran"] and not refreshed["cached"] and refreshed["cache_status"] == "refresh"
    assert refreshed["cache_file"] == first["cache_file"]
    assert os.stat(refreshed["cache_file"]).st_ino != written, "--refresh did not rewrite the entry"
    after = probe_record(gpu_machine())
    assert after["cached"] and gpu_machine.imports == 2 and after["wall_s"] == refreshed["wall_s"]


@pytest.mark.parametrize("garbage", ["{not json", "[]", '{"format": 1}', ""])
def test_a_corrupt_entry_is_ignored_and_replaced(gpu_machine, garbage):
    first = gpu_machine()
    Path(probe_record(first)["cache_file"]).write_text(garbage)
    second = gpu_machine()
    assert not probe_record(second)["cached"] and gpu_machine.imports == 2
    assert verdict(second) == verdict(first)
    assert probe_record(gpu_machine())["cached"] and gpu_machine.imports == 2


def test_an_unwritable_cache_folder_only_means_no_caching(gpu_machine, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {"JUPYTER_GPU_CACHE_DIR": str(blocker / "cache")}  # below a file: cannot be created, even by root
    first, second = gpu_machine(env=env), gpu_machine(env=env)
    assert probe_record(first)["cache_file"] is None and not probe_record(second)["cached"]
    assert gpu_machine.imports == 2 and verdict(second) == verdict(first) and first["status"] == "ok"


def test_cache_folder_comes_from_the_checked_environment(tmp_path):
    assert cache_dir({"JUPYTER_GPU_CACHE_DIR": "/c", "XDG_CACHE_HOME": "/x", "HOME": "/h"}) == Path("/c")
    assert cache_dir({"XDG_CACHE_HOME": "/x", "HOME": "/h"}) == Path("/x/jupyter-gpu")
    assert cache_dir({"HOME": "/h"}) == Path("/h/.cache/jupyter-gpu")
    assert cache_dir({}) is None


def test_the_cache_folder_setting_is_obeyed(gpu_machine, tmp_path):
    env = {"JUPYTER_GPU_CACHE_DIR": str(tmp_path / "elsewhere")}
    first = probe_record(gpu_machine(env=env))
    assert Path(first["cache_file"]).parent == tmp_path / "elsewhere"
    assert probe_record(gpu_machine(env=env))["cached"] and gpu_machine.imports == 1


def test_no_entry_is_written_where_torch_is_not_probed(lay_out):
    checker = Checker(lay_out(Machine().cpu_torch()))
    report = checker()
    assert probe_record(report) == {"ran": False, "cached": False, "reason": probe_record(report)["reason"]}
    assert not (Path(checker.ctx.env["HOME"]) / ".cache" / "jupyter-gpu").exists() and checker.imports == 0


def test_verbose_output_says_whether_the_probe_ran_or_came_from_the_cache(gpu_machine):
    from jupyter_gpu.gpucheck.render import torch_probe_line

    first, second = gpu_machine(), gpu_machine()
    assert torch_probe_line(first["facts"]).startswith("torch probe: ran in ")
    assert ", now cached: GPU evidence: " in torch_probe_line(first["facts"])
    line = torch_probe_line(second["facts"])
    assert line.startswith("torch probe: reused from the cache (written ")
    assert probe_record(second)["cache_file"] in line and line.endswith("--refresh probes again")
    assert "(--refresh), cache rewritten" in torch_probe_line(gpu_machine("--refresh")["facts"])
