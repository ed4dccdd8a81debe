"""The GPU check without a GPU: scripts/gpu-check.sh run end to end against a stand-in python3, the helpers that
check the wheelhouse and write the summary, and what the scripts must never do on a machine without a network."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
sys.path.insert(0, str(SCRIPTS))

import gpu_support  # noqa: E402  (scripts/ is no package)


def code_lines(path: Path) -> str:
    """A shell script without its comments: what it runs, not what it says."""
    return "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))


@pytest.mark.parametrize("name", ["gpu-check.sh", "gpu-wheels.sh"])
def test_the_scripts_parse(name: str) -> None:
    done = subprocess.run(["bash", "-n", str(SCRIPTS / name)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_check_downloads_nothing_and_makes_no_environment() -> None:
    script = code_lines(SCRIPTS / "gpu-check.sh")
    for forbidden in ("pip download", "-m venv", "virtualenv", "install -e", "curl ", "wget ", "labextension",
                      "jupyter-gpu "):
        assert forbidden not in script, forbidden
    installs = [line for line in script.splitlines() if "pip install" in line]
    assert installs and all("--no-index" in line and "--no-deps" in line for line in installs)


def test_the_wheelhouse_pins_one_version_of_each_and_nothing_the_image_has() -> None:
    script = (SCRIPTS / "gpu-wheels.sh").read_text()
    pins = re.findall(r"([A-Za-z0-9_.-]+)==([0-9][A-Za-z0-9.]*)", script.split("PINS=(")[1].split(")")[0])
    names = [gpu_support.normalise(name) for name, _ in pins]
    assert len(names) == len(set(names)) > 50
    image = set(script.split('IMAGE="')[1].split('"')[0].split())
    assert not image & set(names)
    assert {"ipython", "ipywidgets", "ipykernel", "jupyterlab", "jupyter-server", "tornado"} <= set(names)


def make_wheel(folder: Path, name: str, version: str, *requires: str) -> None:
    dist_info = f"{name.replace('-', '_')}-{version}.dist-info"
    metadata = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                        *(f"Requires-Dist: {requirement}\n" for requirement in requires)])
    with zipfile.ZipFile(folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl", "w") as wheel:
        wheel.writestr(f"{dist_info}/METADATA", metadata)


def test_the_closure_follows_extras_and_markers_and_finds_every_gap(tmp_path: Path) -> None:
    make_wheel(tmp_path, "app", "1.0", "lib>=2", "extra-user[fast]", "old-python-only; python_version < '3.11'",
               "windows-only; sys_platform == 'win32'", "jinja2>=3", "docs-tool; extra == 'docs'")
    make_wheel(tmp_path, "lib", "2.1")
    make_wheel(tmp_path, "extra-user", "0.5", "speedups>=1; extra == 'fast'")
    make_wheel(tmp_path, "speedups", "1.2")
    ok = gpu_support.closure(tmp_path, ["app"], {"jinja2"})
    assert ok["ok"], ok["problems"]
    assert ok["wheels"] == 4 and ok["from_image"] == ["jinja2"]

    make_wheel(tmp_path, "unused", "1.0")
    make_wheel(tmp_path, "speedups", "0.9")  # a second version, and one the requirement refuses
    (tmp_path / "lib-2.1-py3-none-any.whl").unlink()
    problems = gpu_support.closure(tmp_path, ["app"], {"jinja2"})["problems"]
    assert any(p.startswith("speedups: 2 wheels") for p in problems)
    assert any(p.startswith("lib>=2 (wanted by app 1.0): not in the wheelhouse") for p in problems)
    assert any(p.startswith('speedups>=1; extra == "fast" (wanted by extra-user 0.5): speedups-0.9') for p in problems)
    assert any(p.startswith("unused: ") and "not needed" in p for p in problems)
    assert len(problems) == 4, problems


def test_a_wheel_of_a_project_the_image_has_is_refused(tmp_path: Path) -> None:
    make_wheel(tmp_path, "app", "1.0", "jinja2")
    make_wheel(tmp_path, "jinja2", "3.1")
    problems = gpu_support.closure(tmp_path, ["app"], {"jinja2"})["problems"]
    assert problems == ["jinja2: the image has it; its wheel would shadow the image's copy",
                        "jinja2: jinja2-3.1-py3-none-any.whl is not needed by anything"]


def test_installed_checks_versions_in_this_environment() -> None:
    assert gpu_support.installed(["pytest>=1"])["ok"]
    result = gpu_support.installed(["pytest>=999", "no-such-project-anywhere"])
    assert [p.split(" (")[0] for p in result["problems"]] == ["pytest>=999", "no-such-project-anywhere"]


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="2" failures="1" skipped="1" tests="5">
<testcase classname="tests.e2e.gpu.test_x" name="test_passes" time="1.50"/>
<testcase classname="tests.e2e.gpu.test_x" name="test_fails[case one]" time="0.2">
  <failure message="AssertionError: 3 != 4&#10;second line">traceback</failure>
  <error message="failed on teardown with &quot;boom&quot;">teardown traceback</error>
</testcase>
<testcase classname="tests.e2e.gpu.test_x" name="test_skips" time="0.0">
  <skipped type="pytest.skip" message="needs a CUDA GPU; torch.cuda.is_available() is False here">skip</skipped>
</testcase>
<testcase classname="tests.e2e.gpu.test_x" name="test_errors" time="0.1"><error message="fixture broke"/></testcase>
<testcase classname="" name="tests.e2e.gpu.test_y" time="0.0"><error message="collection failure">ImportError</error>
</testcase>
</testsuite></testsuites>
"""


def test_junit_cases_become_outcomes_with_their_first_message_line(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    cases = gpu_support.read_junit(path)
    assert [(c["id"], c["outcome"]) for c in cases] == [
        ("tests/e2e/gpu/test_x.py::test_passes", "passed"),
        ("tests/e2e/gpu/test_x.py::test_fails[case one]", "failed"),
        ("tests/e2e/gpu/test_x.py::test_skips", "skipped"),
        ("tests/e2e/gpu/test_x.py::test_errors", "error"),
        ("tests/e2e/gpu/test_y.py", "error")]
    assert cases[1]["message"] == "AssertionError: 3 != 4"
    assert cases[2]["message"].startswith("needs a CUDA GPU")
    assert [c["collection_error"] for c in cases] == [False, False, False, False, True]
    assert gpu_support.count(cases) == {"passed": 1, "failed": 1, "error": 2, "skipped": 1}


# A stand-in for the GPU machine's python3: runs the helpers for real, fakes pip, pytest, the CLI and the magics,
# and records how it was called and with which PYTHONPATH.
STAND_IN = """#!{python}
import json, os, subprocess, sys
from pathlib import Path
args = sys.argv[1:]
with open(os.environ["STAND_IN_CALLS"], "a") as calls:
    calls.write(json.dumps({{"args": args, "pythonpath": os.environ.get("PYTHONPATH", "")}}) + "\\n")
if args[:2] == ["scripts/gpu_support.py", "facts"]:
    Path(args[3]).write_text(json.dumps({{"python": "3.12.3", "torch": "2.11.0+cu130", "cuda_available": False}}))
elif args[:2] == ["scripts/gpu_support.py", "installed"]:  # the image's packages are not this machine's
    Path(args[-1]).write_text(json.dumps({{"ok": True, "problems": [], "distributions": 98}}))
elif args[:1] == ["scripts/gpu_support.py"]:
    sys.exit(subprocess.run([{python!r}, *args]).returncode)
elif args[:2] == ["-m", "pytest"]:
    junit = next(a.split("=", 1)[1] for a in args if a.startswith("--junitxml="))
    module = args[-1].removesuffix(".py").replace("/", ".")
    Path(junit).write_text('<testsuites><testsuite><testcase classname="' + module + '" name="test_a">'
                           '<skipped message="needs a CUDA GPU"/></testcase></testsuite></testsuites>')
elif args[:2] == ["-m", "jupyter_gpu"]:
    print("! PyTorch can use the GPU (stand-in)")
    print("second line")
elif args[:1] == ["scripts/gpu_magics.py"]:
    Path(args[2]).write_text(json.dumps({{"device": "cpu", "magics": [
        {{"magic": "%gpucheck", "status": "ok", "seconds": 0.1, "headline": "stand-in headline"}}]}}))
elif args[:1] == ["scripts/gpu_trials.py"]:
    Path(args[2]).write_text(json.dumps({{"device": "cpu", "magics": [
        {{"magic": "resnet %%gpuprofile", "status": "ok", "seconds": 0.1, "headline": "stand-in profile"}}]}}))
"""


def run_check(tmp_path: Path, budget: int) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    python = tmp_path / "python3"
    python.write_text(STAND_IN.format(python=sys.executable))
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "any-1.0-py3-none-any.whl").write_bytes(b"")
    calls = tmp_path / "calls.jsonl"
    env = {**os.environ, "PYTHON": str(python), "OUT": str(tmp_path / "out"), "TMPDIR": str(tmp_path),
           "GPU_CHECK_WHEELS": str(wheels), "GPU_CHECK_BUDGET": str(budget), "STAND_IN_CALLS": str(calls),
           "PATH": "/usr/bin:/bin"}  # no nvidia-smi: the step says so and goes on
    env.pop("PYTHONPATH", None)
    done = subprocess.run(["bash", str(SCRIPTS / "gpu-check.sh")], capture_output=True, text=True, env=env,
                          timeout=60)
    return done, [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def test_the_check_runs_every_step_and_summarises_it(tmp_path: Path) -> None:
    done, calls = run_check(tmp_path, budget=480)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "gpu-check-summary.json").read_text())
    assert (tmp_path / "out" / "gpu-check.log").read_text().count("=== ") >= 10

    # The wheelhouse goes into a temporary folder on PYTHONPATH, ahead of the working tree, with the image's python.
    (install,) = [c for c in calls if c["args"][:3] == ["-m", "pip", "install"]]
    site = install["args"][install["args"].index("--target") + 1]
    pytest_calls = [c for c in calls if c["args"][:2] == ["-m", "pytest"]]
    assert pytest_calls and all(c["pythonpath"].split(":")[:2] == [site, str(ROOT)] for c in pytest_calls)
    # One pytest process per file holding a gpu-marked test, the project's addopts dropped, a timeout per test.
    files = {c["args"][-1] for c in pytest_calls}
    assert len(files) == len(pytest_calls)
    assert {str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "e2e" / "gpu").glob("test_*.py")} <= files
    assert {"tests/metrics/test_nvml_backend.py", "tests/dataprobe/test_dataprobe_gpu.py"} <= files
    assert "tests/test_gpu_check_script.py" not in files  # names the marker in strings only
    assert all({"-m", "gpu", "-o", "addopts=", "--timeout=180"} <= set(c["args"]) for c in pytest_calls)
    assert pytest_calls[0]["args"][-1] == "tests/e2e/gpu/test_real_gpu.py"
    assert pytest_calls[-1]["args"][-1] == "tests/e2e/gpu/test_speedprobe_gpu.py"

    assert summary["machine"]["torch"] == "2.11.0+cu130"
    assert summary["tests"]["totals"] == {"passed": 0, "failed": 0, "error": 0, "skipped": len(files)}
    assert [f["file"] for f in summary["tests"]["files"]] == [c["args"][-1] for c in pytest_calls]
    assert summary["magics"]["magics"][0]["headline"] == "stand-in headline"
    assert summary["trials"]["magics"][0]["headline"] == "stand-in profile"
    steps = [step["name"] for step in summary["steps"]]
    # The loops run after the cheap test files, before those that compile or start servers.
    assert steps.index("bench:gpucells") < steps.index("trials") < steps.index(f"pytest:{pytest_calls[-1]['args'][-1]}")
    assert "resnet %%gpuprofile: ok (0.1 s) stand-in profile" in done.stdout
    assert [c["command"] for c in summary["cli"]] == ["check -v", "check --distributed",
                                                      "allreduce --sizes 1M,64M --iterations 5"]
    assert summary["cli"][0]["first_lines"] == ["! PyTorch can use the GPU (stand-in)", "second line"]
    assert all(step["status"] == "ok" for step in summary["steps"]), summary["steps"]


def test_a_spent_budget_skips_the_steps_and_still_writes_the_summary(tmp_path: Path) -> None:
    done, calls = run_check(tmp_path, budget=20)  # 15 s are kept for the summary: nothing else may start
    summary = json.loads((tmp_path / "out" / "gpu-check-summary.json").read_text())
    assert not [c for c in calls if c["args"][:2] in (["-m", "pytest"], ["-m", "pip"])]
    assert {step["status"] for step in summary["steps"]} == {"skipped"}
    assert "not run, the 20 s budget is spent" in done.stdout
