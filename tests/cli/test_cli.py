"""`jupyter-gpu check`, `python -m jupyter_gpu check` and `require_gpu()`, run as real processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fake_machine import Machine

REPO = Path(__file__).resolve().parents[2]


def run(args: list[str], env: dict[str, str] | None = None, python: str = sys.executable, cwd: str | None = None):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([python, *args], env=full_env, capture_output=True, text=True, timeout=120, cwd=cwd)


def strip_timings(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if "wall_s" not in line and "duration_s" not in line)


def test_console_script_and_module_print_the_same_report():
    script = shutil.which("jupyter-gpu", path=str(Path(sys.executable).parent))
    assert script, "the jupyter-gpu console script is installed next to the interpreter"
    by_script = subprocess.run([script, "check"], capture_output=True, text=True, timeout=120)
    interpreter = Path(script).read_text().splitlines()[0].removeprefix("#!")  # the same Python, same path
    by_module = run(["-m", "jupyter_gpu", "check"], python=interpreter)
    assert by_script.returncode == by_module.returncode == 1  # this machine: CPU-only torch, no GPU
    assert by_script.stdout == by_module.stdout
    assert by_script.stdout.startswith("✗ PyTorch is running on the CPU")
    assert "CPU_ONLY_BUILD" in by_script.stdout


def test_usage_errors_exit_2_with_one_sentence():
    done = run(["-m", "jupyter_gpu", "check", "--nope"])
    assert done.returncode == 2
    assert done.stderr.strip() == "jupyter-gpu: Unrecognized arguments: --nope."
    assert run(["-m", "jupyter_gpu"]).returncode == 2
    assert run(["-m", "jupyter_gpu", "check", "--facts", "/nonexistent.json"]).returncode == 2


def test_cuda_visible_devices_minus_one_on_this_machine():
    done = run(["-m", "jupyter_gpu", "check", "--json"], env={"CUDA_VISIBLE_DEVICES": "-1"})
    report = json.loads(done.stdout)
    assert done.returncode == 1
    assert report["facts"]["env"]["CUDA_VISIBLE_DEVICES"] == "-1"
    codes = {f["code"] for f in report["findings"]}
    assert {"CPU_ONLY_BUILD", "CUDA_VISIBLE_DEVICES_HIDES_GPUS"} <= codes


def test_save_and_replay_from_the_command_line(tmp_path):
    facts = tmp_path / "facts.json"
    saved = run(["-m", "jupyter_gpu", "check", "--save", str(facts)])
    snapshot = json.loads(facts.read_text())
    assert snapshot["schema"] == "jupyter-gpu/facts" and snapshot["schema_version"] == 2
    replayed = run(["-m", "jupyter_gpu", "check", "--facts", str(facts)])
    assert strip_timings(replayed.stdout) == strip_timings(saved.stdout)
    assert replayed.returncode == saved.returncode


@pytest.mark.parametrize(("content", "words"), [
    ({"schema": "jupyter-gpu/facts", "schema_version": 99}, "upgrade jupyter-gpu"),
    ({"schema": "jupyter-gpu/facts"}, "no integer schema_version"),
    ([1, 2, 3], "is not a jupyter-gpu facts snapshot"),
])
def test_unreadable_snapshots_are_refused_clearly(tmp_path, content, words):
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(content))
    done = run(["-m", "jupyter_gpu", "check", "--facts", str(facts)])
    assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr


@pytest.fixture
def bare_env(tmp_path, bare_python):
    """The bare venv sees the jupyter_gpu sources but no torch: a fresh environment."""
    return {"PYTHONPATH": str(REPO), "VIRTUAL_ENV": ""}


def test_fresh_venv_without_torch_names_its_interpreter(bare_python, bare_env, tmp_path):
    done = run(["-m", "jupyter_gpu", "check"], env=bare_env, python=bare_python, cwd=str(tmp_path))
    assert done.returncode == 1
    # Worded for a terminal (issue 52): the interpreter's environment, and pip through that interpreter.
    assert f"torch is not installed in this Python's environment ({bare_python})" in done.stdout
    assert f"{bare_python} -m pip install" in done.stdout and "%pip" not in done.stdout


def test_exit_zero_when_a_gpu_is_usable(tmp_path, bare_python):
    machine = Machine().nvidia_host().cuda_torch()
    ctx = machine.build(tmp_path, bare_python)
    env = {**ctx.env, "PYTHONPATH": f"{ctx.env['PYTHONPATH']}:{REPO}", "JUPYTER_GPU_ROOT": str(ctx.root)}
    done = subprocess.run([bare_python, "-m", "jupyter_gpu", "check"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=ctx.cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("✓ PyTorch can use 1x NVIDIA H100 80GB HBM3 (cuda:0)")


def test_require_gpu_raises_the_diagnosis_on_this_machine():
    done = run(["-c", "import jupyter_gpu\ntry:\n    jupyter_gpu.require_gpu()\nexcept jupyter_gpu.GpuUnavailableError"
                " as e:\n    print(type(e).__name__, e.report.status)\n    print(e)"])
    assert done.stdout.startswith("GpuUnavailableError fail\n✗ PyTorch is running on the CPU")


def test_require_gpu_returns_the_device_on_a_gpu_machine(tmp_path, bare_python):
    machine = Machine().nvidia_host().cuda_torch()
    ctx = machine.build(tmp_path, bare_python)
    (Path(ctx.env["PYTHONPATH"]) / "torch" / "__init__.py").open("a").write("\ndevice = str\n")
    env = {**ctx.env, "PYTHONPATH": f"{ctx.env['PYTHONPATH']}:{REPO}", "JUPYTER_GPU_ROOT": str(ctx.root)}
    done = subprocess.run([bare_python, "-c", "import jupyter_gpu; print(jupyter_gpu.require_gpu())"], env=env,
                          capture_output=True, text=True, timeout=120, cwd=ctx.cwd)
    assert done.stdout.strip() == "cuda:0", done.stderr


def test_import_has_no_side_effects():
    done = run(["-c", "import sys, jupyter_gpu; print(sorted(m for m in ('torch', 'pynvml', 'IPython') "
                "if m in sys.modules))"])
    assert done.stdout.strip() == "[]"


def test_cuda_launch_blocking_is_flagged_from_the_command_line():
    done = run(["-m", "jupyter_gpu", "check", "--json"], env={"CUDA_LAUNCH_BLOCKING": "1"})
    debug = [f for f in json.loads(done.stdout)["findings"] if f["code"] == "DEBUG_MODE_ON"]
    assert debug and "CUDA_LAUNCH_BLOCKING" in debug[0]["headline"] + str(debug[0]["evidence"])


def test_root_option_reads_a_fake_machine(tmp_path, bare_python):
    ctx = Machine(files={"/.dockerenv": ""}, env={"NVIDIA_VISIBLE_DEVICES": "void"}).cpu_torch().build(
        tmp_path, bare_python)
    env = {**ctx.env, "PYTHONPATH": f"{ctx.env['PYTHONPATH']}:{REPO}"}
    done = subprocess.run([bare_python, "-m", "jupyter_gpu", "check", "--root", str(ctx.root)], env=env,
                          capture_output=True, text=True, timeout=120, cwd=ctx.cwd)
    assert "CONTAINER_NO_GPU" in done.stdout and "NVIDIA_VISIBLE_DEVICES: void" in done.stdout
