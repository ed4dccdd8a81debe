"""Recording files, the `replay:FILE` backend and `record()`: written, loaded, replayed and refused for real."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from jupyter_gpu.metrics.backends.base import BACKEND_ENV, BackendSpecError
from jupyter_gpu.metrics.backends.replay import ReplayBackend
from jupyter_gpu.metrics.backends.select import select_backend
from jupyter_gpu.metrics.backends.simulated import SimulatedBackend
from jupyter_gpu.metrics.recorder import NoDriverError, record
from jupyter_gpu.metrics.recording import FORMAT, VERSION, RecordingError, load_recording, write_recording
from jupyter_gpu.metrics.sample import DeviceSample, Sample
from jupyter_gpu.metrics.sampler import THREAD_NAME, Sampler


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


T0 = 1_700_000_000.0


def h200(utilization: float, **fields: object) -> DeviceSample:
    values: dict[str, object] = {"utilization_gpu": utilization, "memory_used": 600 * 1024**2,
                                 "memory_total": 141 * 1024**3, "temperature_c": 33.0, **fields}
    return DeviceSample(0, "NVIDIA H200", "GPU-0", **values)  # type: ignore[arg-type]


def samples_at(*offsets_and_utilization: tuple[float, float]) -> list[Sample]:
    return [Sample(T0 + offset, "nvml", False, devices=(h200(util),)) for offset, util in offsets_and_utilization]


@pytest.fixture
def three(tmp_path: Path) -> Path:
    """A recording of 10 %, 50 % and 90 % utilisation at 0, 1 and 2 s."""
    path = tmp_path / "three.json"
    write_recording(path, samples_at((0, 10), (1, 50), (2, 90)), 1.0, "nvml")
    return path


# -- the file ------------------------------------------------------------------------------------------


def test_write_then_load_round_trips(three: Path):
    data = json.loads(three.read_text())
    assert (data["format"], data["version"], data["interval"], data["backend"]) == (FORMAT, VERSION, 1.0, "nvml")
    assert data["recorded_at"].endswith("Z") and data["jupyter_gpu_version"]
    recording = load_recording(three)
    assert recording.samples == tuple(samples_at((0, 10), (1, 50), (2, 90)))
    assert (recording.interval, recording.backend) == (1.0, "nvml")
    assert recording.recorded_at == data["recorded_at"]
    assert len(three.read_text().splitlines()) == 7 + 3 + 3  # header, one line per sample, closing brackets
    assert [p.name for p in three.parent.iterdir()] == ["three.json"]  # no temporary file left behind


def test_a_write_interrupted_by_ctrl_c_leaves_the_old_file(three: Path):
    before = three.read_text()

    class Interrupted(Sequence[Sample]):
        """Samples whose third one never comes: the user pressed Ctrl-C while the file was being written."""

        def __init__(self) -> None:
            self.samples = samples_at((0, 1), (1, 2), (2, 3))

        def __len__(self) -> int:
            return 3

        def __getitem__(self, index):  # type: ignore[no-untyped-def]
            return self.samples[index]

        def __iter__(self) -> Iterator[Sample]:
            yield from self.samples[:2]
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_recording(three, Interrupted(), 1.0, "nvml")
    assert three.read_text() == before
    assert [p.name for p in three.parent.iterdir()] == ["three.json"]


def test_a_hand_written_recording_keeps_lost_devices_and_missing_values(tmp_path: Path):
    lost = "NVML reports GPU 1 is lost (GPU is lost): it fell off the bus and needs a reset or a reboot."
    path = tmp_path / "lost.json"
    path.write_text(json.dumps({
        "format": FORMAT, "version": 1, "samples": [
            {"timestamp": 10.0, "backend": "nvml", "simulated": False, "devices": [
                {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-0", "utilization_gpu": 40.0, "power_w": None},
                {"index": 1, "name": "NVIDIA H200", "uuid": "GPU-1", "utilization_gpu": 99.0}]},
            {"timestamp": 11.0, "backend": "nvml", "simulated": False, "devices": [
                {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-0", "utilization_gpu": 41.0, "power_w": None},
                {"index": 1, "name": "NVIDIA H200", "uuid": "GPU-1", "status": "lost", "error": lost}]},
        ]}))
    recording = load_recording(path)
    assert (recording.interval, recording.recorded_at, recording.backend) == (None, None, None)
    clock = FakeClock()
    backend = ReplayBackend(path, clock=clock)
    clock.now += 5  # long after the end: the lost GPU stays lost
    sample = backend.read()
    healthy, gone = sample.devices
    assert healthy.utilization_gpu == 41.0 and healthy.power_w is None and healthy.temperature_c is None
    assert (gone.status, gone.error, gone.utilization_gpu, gone.name) == ("lost", lost, None, "NVIDIA H200")
    # Written out again (as a re-recording would), None is still None, not 0.
    again = tmp_path / "again.json"
    write_recording(again, [sample], 1.0, backend.name)
    device = json.loads(again.read_text())["samples"][0]["devices"][0]
    assert device["power_w"] is None and device["temperature_c"] is None
    assert load_recording(again).samples[0].devices == sample.devices


def _recording(**changes: object) -> dict[str, object]:
    data: dict[str, object] = {"format": FORMAT, "version": VERSION, "interval": 1.0, "backend": "nvml",
                               "samples": [{"timestamp": 1.0, "backend": "nvml", "simulated": False}]}
    data.update(changes)
    return data


@pytest.mark.parametrize(("content", "says"), [
    (None, "There is no GPU recording at"),
    ("{not json", "is not a jupyter-gpu recording: it is not JSON"),
    ([1, 2], "is not a jupyter-gpu recording: it lacks"),
    (_recording(format="jupyter-gpu/facts"), "is not a jupyter-gpu recording: it lacks"),
    (_recording(version="1"), "has no integer \"version\""),
    (_recording(version=VERSION + 1), f"has format version {VERSION + 1}, newer than this jupyter-gpu reads"),
    (_recording(samples=[]), "has no samples"),
    (_recording(samples=None), "has no samples"),
    (_recording(interval=0), "has an \"interval\" that is not a positive number"),
    (_recording(samples=[{"timestamp": 1.0, "backend": "nvml", "simulated": False}, {"backend": "nvml"}]),
     "Sample 1 in the GPU recording"),
    (_recording(samples=[{"timestamp": 1.0, "backend": "nvml", "simulated": False, "status": "fine"}]),
     "Sample 0 in the GPU recording"),
    (_recording(samples=[{"timestamp": 1.0, "backend": "nvml", "simulated": False, "devices": [{"index": 0}]}]),
     "Sample 0 in the GPU recording"),
    (_recording(samples=[{"timestamp": 1.0, "backend": "nvml", "simulated": False}, "x"]),
     "Sample 1 in the GPU recording"),
    (_recording(samples=[{"timestamp": 2.0, "backend": "nvml", "simulated": False},
                         {"timestamp": 1.0, "backend": "nvml", "simulated": False}]),
     "Sample 1 in the GPU recording"),
])
def test_unreplayable_files_are_refused_with_one_sentence_naming_the_file(tmp_path: Path, content, says):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(RecordingError) as caught:
        load_recording(path)
    message = str(caught.value)
    assert says in message and str(path) in message
    assert message.endswith(".") and message.count(". ") == 0 and "\n" not in message
    assert isinstance(caught.value, ValueError)
    # The backend turns it into the BackendSpecError that %gpupanel and %gputime show as it is.
    with pytest.raises(BackendSpecError) as spec_error:
        select_backend(f"replay:{path}")
    assert str(spec_error.value) == message


def test_a_bad_sample_says_what_is_wrong(tmp_path: Path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_recording(samples=[{"timestamp": 1.0, "backend": "nvml", "simulated": False},
                                                   {"backend": "nvml"}])))
    with pytest.raises(RecordingError, match=r"Sample 1 in the GPU recording .* has no 'timestamp'\."):
        load_recording(path)


# -- the backend ---------------------------------------------------------------------------------------


def test_replay_plays_the_samples_at_their_pace_and_holds_the_last(three: Path):
    clock = FakeClock()
    backend = select_backend(f"replay:{three}")
    assert isinstance(backend, ReplayBackend)
    backend = ReplayBackend(three, clock=clock)
    assert (backend.name, backend.simulated) == (f"replay:{three}", True)
    seen = []
    for elapsed in (0.0, 0.5, 0.999, 1.0, 1.7, 2.0, 2.5, 60.0):
        clock.now = 1000.0 + elapsed
        before = time.time()
        sample = backend.read()
        assert before <= sample.timestamp <= time.time()  # stamped now, not when it was recorded
        assert (sample.backend, sample.simulated, sample.status) == (backend.name, True, "ok")
        seen.append(sample.devices[0].utilization_gpu)
    assert seen == [10, 10, 10, 50, 50, 90, 90, 90]


def test_replay_is_chosen_by_the_environment(three: Path):
    backend = select_backend(env={BACKEND_ENV: f" replay:{three} "})
    assert isinstance(backend, ReplayBackend) and backend.name == f"replay:{three}"
    assert backend.read().devices[0].utilization_gpu == 10
    backend.close()


@pytest.mark.parametrize("spec", ["replay", "replay:", "replay:  "])
def test_replay_without_a_file_names_the_choices(spec: str):
    with pytest.raises(BackendSpecError) as caught:
        select_backend(env={BACKEND_ENV: spec})
    message = str(caught.value)
    assert message.startswith("The replay backend needs the recording to play, as replay:FILE")
    assert BACKEND_ENV in message and "simulated:h200" in message and message.count(". ") == 0


def test_bad_specs_mention_replay():
    with pytest.raises(BackendSpecError, match=r"replay:FILE"):
        select_backend("cuda")


def test_a_sampler_over_a_replay_moves_its_cursor(three: Path):
    backend = ReplayBackend(three)
    with Sampler(backend, interval=0.1) as sampler:
        time.sleep(0.45)
    history = sampler.history()
    assert len(history) >= 3
    stamps = [s.timestamp for s in history]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    assert sampler.history(since=stamps[0]) == history[1:]
    assert all(s.simulated and s.backend == backend.name for s in history)


# -- record() ------------------------------------------------------------------------------------------


def _sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


@pytest.mark.timing
def test_record_reads_now_then_every_interval():
    seen: list[Sample] = []
    started = time.time()
    recorded = record(SimulatedBackend("h200-hot"), seconds=0.5, interval=0.1, on_sample=seen.append)
    assert not recorded.interrupted and list(recorded.samples) == seen
    assert 4 <= len(recorded.samples) <= 6  # 0, 0.1, ..., 0.5 s; a loaded machine may skip a late tick
    assert recorded.samples[0].timestamp - started < 0.1  # the first reading is taken at once
    assert 0.3 <= recorded.span <= 0.7 and recorded.gpu_count == 1
    stamps = [s.timestamp for s in recorded.samples]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    assert all(s.backend == "simulated:h200-hot" and s.devices[0].throttled for s in recorded.samples)
    assert not _sampler_threads()


def test_ctrl_c_keeps_what_was_recorded(tmp_path: Path):
    def press_ctrl_c_on_the_third(sample: Sample) -> None:
        if len(seen) == 2:
            raise KeyboardInterrupt  # what the user's Ctrl-C does on the main thread
        seen.append(sample)

    seen: list[Sample] = []
    recorded = record(SimulatedBackend("h200"), seconds=30, interval=0.1, on_sample=press_ctrl_c_on_the_third)
    assert recorded.interrupted and len(recorded.samples) == 3 and list(recorded.samples[:2]) == seen
    assert not _sampler_threads()
    path = tmp_path / "short.json"
    write_recording(path, recorded.samples, 0.1, "simulated:h200")
    assert load_recording(path).samples == recorded.samples


def test_no_driver_is_not_recorded():
    with pytest.raises(NoDriverError, match=r"^NVML could not start: NVML Shared Library Not Found"):
        record(SimulatedBackend("nodriver"), seconds=10, interval=0.1)
    assert not _sampler_threads()


@pytest.mark.parametrize(("seconds", "interval"), [(0, 1.0), (-1, 1.0), (float("inf"), 1.0), (1, 0.05)])
def test_record_refuses_bad_durations(seconds: float, interval: float):
    with pytest.raises(ValueError):
        record(SimulatedBackend("h200"), seconds=seconds, interval=interval)
