"""`jupyter-gpu autoload on|off|status` as a user runs it: a real process, a temporary environment folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from jupyter_gpu.autoload.config import config_file


def autoload(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {name: value for name, value in os.environ.items() if name != "JUPYTER_GPU_AUTOLOAD"}
    return subprocess.run([sys.executable, "-m", "jupyter_gpu", "autoload", *args], capture_output=True,
                          text=True, timeout=60, env={**environ, **(env or {})})


def test_on_status_off_round_trip(tmp_path: Path):
    prefix = str(tmp_path)
    path = config_file(tmp_path)
    before = autoload("status", "--prefix", prefix)
    assert before.returncode == 0
    assert before.stdout.splitlines() == [
        "autoload: off", f"file: {path} (does not exist)", "watch: off",
        "JUPYTER_GPU_AUTOLOAD: not set (JUPYTER_GPU_AUTOLOAD=0 silences the check)"]
    on = autoload("on", "--prefix", prefix, "--watch")
    assert on.returncode == 0 and on.stdout.startswith(f"Autoload is on: every new kernel of {prefix} checks")
    assert "keeps the GPU sampler running every 2 s" in on.stdout
    status = autoload("status", "--prefix", prefix, env={"JUPYTER_GPU_AUTOLOAD": "0"})
    assert status.stdout.splitlines() == [
        "autoload: on", f"file: {path}", "watch: on (the GPU sampler runs every 2 s in each kernel)",
        "JUPYTER_GPU_AUTOLOAD=0: silences the check: kernels load the magics only"]
    again = autoload("on", "--prefix", prefix, "--watch")
    assert again.returncode == 0 and "already on" in again.stdout and "nothing changed" in again.stdout
    off = autoload("off", "--prefix", prefix)
    assert off.returncode == 0 and off.stdout.strip() == f"Autoload is off: removed {path} (nothing else was in it)."
    assert not path.exists()


def test_the_default_prefix_is_the_running_environment(tmp_path: Path):
    done = autoload("status")
    assert done.returncode == 0
    assert f"file: {config_file(sys.prefix)}" in done.stdout


def test_usage_errors_exit_2_with_one_sentence(tmp_path: Path):
    cases = {
        ("autoload",): "jupyter-gpu: The following arguments are required: action.",
        ("autoload", "maybe"): "jupyter-gpu: Argument action: invalid choice: 'maybe' (choose from ",
        ("autoload", "off", "--watch", "--prefix", str(tmp_path)):
            "jupyter-gpu: --watch is a setting of `autoload on`; `autoload off` takes no --watch.",
        ("autoload", "on", "--prefix", str(tmp_path / "nope")):
            f"jupyter-gpu: There is no environment at {tmp_path / 'nope'}: pass --prefix with an environment's "
            f"folder (its sys.prefix).",
    }
    for args, sentence in cases.items():
        done = autoload(*args[1:])
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        # argparse quotes the choices differently across Python versions, so that one is compared up to them.
        assert done.stderr.strip() == sentence or (sentence.endswith("from ") and done.stderr.startswith(sentence))
        assert done.stderr.count("\n") == 1
        assert done.stdout == ""


def test_an_unwritable_prefix_says_so_and_suggests_another(tmp_path: Path):
    (tmp_path / "etc").write_text("")  # a file where etc/ipython must go (tests run as root, so no chmod)
    done = autoload("on", "--prefix", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.startswith(f"jupyter-gpu: Cannot write {config_file(tmp_path)} (")
    assert "an environment you can write to, or pass --prefix" in done.stderr
