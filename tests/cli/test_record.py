"""`jupyter-gpu record FILE --seconds S`, in-process and as a real process, and replaying what it wrote."""

from __future__ import annotations

import ctypes.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_gpu.cli import main
from jupyter_gpu.metrics.backends.base import BACKEND_ENV
from jupyter_gpu.metrics.backends.replay import ReplayBackend
from jupyter_gpu.metrics.backends.select import select_backend
from jupyter_gpu.metrics.recording import load_recording

FAST = ["--seconds", "0.5", "--interval", "0.1"]
SIMULATED_NOTICE = "a simulated backend chosen by JUPYTER_GPU_BACKEND, not a real GPU"


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def run(args: list[str], env: dict[str, str | None]) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **env}
    full_env = {key: value for key, value in full_env.items() if value is not None}
    return subprocess.run([sys.executable, "-m", "jupyter_gpu", *args], env=full_env, capture_output=True,
                          text=True, timeout=60)


def test_record_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    monkeypatch.setenv(BACKEND_ENV, "simulated:h200")
    path = tmp_path / "idle.json"
    assert main(["record", str(path), *FAST]) == 0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == ""
    assert lines[0] == f"jupyter-gpu: recording simulated:h200, {SIMULATED_NOTICE}."
    progress, summary = lines[1:-1], lines[-1]
    assert progress[0] == "recording 0/0.5 s, 1 GPU…"
    assert 4 <= len(progress) <= 6 and all(line.endswith("/0.5 s, 1 GPU…") for line in progress)
    recording = load_recording(path)
    count = len(recording.samples)
    assert count == len(progress)
    assert summary.startswith(f"Recorded {count} samples of 1 GPU over ") and summary.endswith(f" s to {path}")
    assert (recording.interval, recording.backend) == (0.1, "simulated:h200")
    assert all(s.simulated and s.devices[0].name == "NVIDIA H200" for s in recording.samples)


def test_record_as_a_real_process_then_replay_it(tmp_path: Path):
    path = tmp_path / "hot.json"
    done = run(["record", str(path), *FAST], env={BACKEND_ENV: "simulated:h200-hot"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert SIMULATED_NOTICE in done.stderr and f" s to {path}\n" in done.stderr
    recorded = load_recording(path).samples
    assert all(s.devices[0].throttled and s.devices[0].temperature_c >= 87 for s in recorded)

    # Replayed through the spec, at the recorded pace, then holding the last sample.
    clock = FakeClock()
    assert isinstance(select_backend(f"replay:{path}"), ReplayBackend)
    backend = ReplayBackend(path, clock=clock)
    played = []
    for sample in recorded:
        clock.now = 1000.0 + (sample.timestamp - recorded[0].timestamp)
        played.append(backend.read())
    clock.now += 3600
    played.append(backend.read())
    expected = [s.devices for s in recorded] + [recorded[-1].devices]
    assert [s.devices for s in played] == expected
    assert all(s.simulated and s.backend == f"replay:{path}" for s in played)


def test_a_replay_can_be_chosen_by_the_environment_and_recorded_again(tmp_path: Path):
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    assert run(["record", str(first), *FAST], env={BACKEND_ENV: "simulated:h200-busy"}).returncode == 0
    done = run(["record", str(second), "--seconds", "0.3", "--interval", "0.1", "-q"],
               env={BACKEND_ENV: f"replay:{first}"})
    assert done.returncode == 0, done.stderr
    # -q keeps only the notice that this is not a real GPU: no progress, no summary.
    assert done.stderr == f"jupyter-gpu: recording replay:{first}, {SIMULATED_NOTICE}.\n"
    again = load_recording(second)
    assert again.backend == f"replay:{first}"
    original = {s.devices for s in load_recording(first).samples}
    assert all(s.devices in original for s in again.samples)


NVML_LIBRARY = ctypes.util.find_library("nvidia-ml")


@pytest.mark.skipif(NVML_LIBRARY is not None, reason="this machine has an NVIDIA driver")
def test_no_driver_fails_with_nvmls_message_and_writes_nothing(tmp_path: Path):
    path = tmp_path / "real.json"
    done = run(["record", str(path), "--seconds", "5"], env={BACKEND_ENV: None})
    assert done.returncode == 1
    assert done.stderr.startswith("jupyter-gpu: NVML could not start: ")
    assert done.stderr.strip().endswith("Nothing was recorded.") and "Traceback" not in done.stderr
    assert SIMULATED_NOTICE not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_simulated_no_driver_scenario_is_refused_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]):
    monkeypatch.setenv(BACKEND_ENV, "simulated:nodriver")
    assert main(["record", str(tmp_path / "none.json"), *FAST]) == 1
    assert "jupyter-gpu: NVML could not start: NVML Shared Library Not Found" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# Starts `python -m jupyter_gpu ARGS` with Ctrl-C at its default, as a terminal does. A process started with SIGINT
# ignored (a shell's background job, and every process under it) passes that on, and Python then never turns
# Ctrl-C into KeyboardInterrupt: the recorder would run its full time (seen in a backgrounded clean-clone run).
AS_FROM_A_TERMINAL = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                      "os.execv(sys.executable, [sys.executable, '-m', 'jupyter_gpu', *sys.argv[1:]])")


def test_ctrl_c_writes_what_was_recorded(tmp_path: Path):
    path = tmp_path / "cut.json"
    env = {**os.environ, BACKEND_ENV: "simulated:h200"}
    with subprocess.Popen([sys.executable, "-c", AS_FROM_A_TERMINAL, "record", str(path), "--seconds", "60",
                           "--interval", "0.1"], env=env, stderr=subprocess.PIPE, text=True) as process:
        assert process.stderr is not None
        progress = 0
        for line in process.stderr:
            progress += line.startswith("recording ")
            if progress == 3:
                process.send_signal(signal.SIGINT)  # the user's Ctrl-C
                break
        rest = process.stderr.read()
        assert process.wait(timeout=30) == 0, rest
    summary = rest.splitlines()[-1]
    assert summary.startswith("Stopped early (Ctrl-C). Recorded ") and summary.endswith(f" s to {path}")
    assert len(load_recording(path).samples) >= 3
    assert [p.name for p in tmp_path.iterdir()] == ["cut.json"]


@pytest.mark.parametrize(("args", "says"), [
    (["--seconds", "0"], "Argument --seconds: --seconds must be a positive number of seconds, not 0."),
    (["--seconds", "-2"], "Argument --seconds: --seconds must be a positive number of seconds, not -2."),
    (["--seconds", "ten"], "Argument --seconds: --seconds needs a number of seconds, not 'ten'."),
    (["--seconds", "inf"], "Argument --seconds: --seconds must be a finite number of seconds, not inf."),
    ([], "The following arguments are required: --seconds."),
    (["--seconds", "5", "--interval", "0.05"],
     "Argument --interval: --interval must be a number of seconds, at least 0.1, not 0.05."),
])
def test_bad_durations_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], args, says):
    assert main(["record", str(tmp_path / "x.json"), *args]) == 2
    assert capsys.readouterr().err == f"jupyter-gpu: {says}\n"
    assert list(tmp_path.iterdir()) == []


def test_a_missing_folder_is_refused_before_recording(tmp_path: Path):
    path = tmp_path / "nope" / "x.json"
    done = run(["record", str(path), "--seconds", "30"], env={BACKEND_ENV: "simulated:h200"})
    assert done.returncode == 2
    assert done.stderr == f"jupyter-gpu: Cannot write {path}: the folder {path.parent} does not exist.\n"


def test_a_bad_backend_spec_is_a_usage_error(tmp_path: Path):
    done = run(["record", str(tmp_path / "x.json"), *FAST], env={BACKEND_ENV: "replay:" + str(tmp_path / "no.json")})
    assert done.returncode == 2
    assert done.stderr.startswith(f"jupyter-gpu: There is no GPU recording at {tmp_path / 'no.json'}")
    assert done.stderr.count("\n") == 1


def test_help_lists_record_and_stays_light():
    done = run(["record", "--help"], env={})
    assert done.returncode == 0 and "--seconds S" in done.stdout and "replay:FILE" in done.stdout
    assert "record" in run(["--help"], env={}).stdout
    probe = ("import sys; from jupyter_gpu.cli import main; main(['record', '--help']); "
             "print(sorted(m for m in ('pynvml', 'torch', 'jupyter_gpu.metrics.sampler', "
             "'jupyter_gpu.metrics.backends') "
             "if m in sys.modules), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stderr.strip() == "[]"


def test_the_recording_is_plain_json_one_sample_per_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(BACKEND_ENV, "simulated:h200")
    path = tmp_path / "plain.json"
    assert main(["record", str(path), "--seconds", "0.2", "--interval", "0.1", "-q"]) == 0
    data = json.loads(path.read_text())
    assert set(data) == {"format", "version", "recorded_at", "interval", "backend", "jupyter_gpu_version", "samples"}
    assert len(path.read_text().splitlines()) == 10 + len(data["samples"])


@pytest.mark.gpu
@pytest.mark.skipif(NVML_LIBRARY is None, reason="no NVIDIA driver here (run by scripts/gpu-check.sh on a GPU machine)")
def test_record_and_replay_a_real_gpu(tmp_path: Path):
    path = tmp_path / "real.json"
    done = run(["record", str(path), "--seconds", "1", "--interval", "0.2"], env={BACKEND_ENV: None})
    print(done.stderr)
    assert done.returncode == 0, done.stderr
    assert SIMULATED_NOTICE not in done.stderr
    recording = load_recording(path)
    assert recording.backend == "nvml" and len(recording.samples) >= 3
    assert all(s.status == "ok" and s.devices and not s.simulated for s in recording.samples)
    replayed = ReplayBackend(path, clock=FakeClock()).read()
    assert replayed.simulated and replayed.devices == recording.samples[0].devices
