"""GPU metrics recorded to a JSON file, so behaviour seen on a real GPU can be replayed as a regression test.

`jupyter-gpu record FILE --seconds S` writes one (`jupyter_gpu.metrics.recorder` reads, `write_recording` writes); the
`replay:FILE` backend plays one back (see `jupyter_gpu.metrics.backends.replay`). The file is plain JSON:

    {"format": "jupyter-gpu-recording", "version": 1, "recorded_at": "2025-01-31T12:00:00Z",
     "interval": 1.0, "backend": "nvml", "jupyter_gpu_version": "0.1.0",
     "samples": [Sample.to_dict(), ...]}

with one sample per line, so a recording committed as a test fixture diffs readably. Pure Python: no NVML.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jupyter_gpu.atomic_write import write_text_atomically
from jupyter_gpu.metrics.sample import DeviceSample, Sample

FORMAT = "jupyter-gpu-recording"
VERSION = 1



class RecordingError(ValueError):
    """A recording file that cannot be replayed, as one sentence naming the file."""


@dataclass(frozen=True)
class Recording:
    """A loaded recording: the samples in the order they were read, and where they came from."""

    samples: tuple[Sample, ...]
    interval: float | None  # the polling interval asked for, in seconds; None when the file does not say
    recorded_at: str | None  # ISO-8601 UTC
    backend: str | None  # the name of the backend recorded ("nvml", "simulated:h200", ...)


# -- writing -------------------------------------------------------------------------------------------


def write_recording(path: str | os.PathLike[str], samples: Sequence[Sample], interval: float,
                    backend_name: str) -> Path:
    """Write `samples` to `path` atomically: a temporary file in the same folder, then `os.replace`.

    An interrupted write (Ctrl-C, a full disk) leaves either the old file or none, never half a recording.
    """
    from jupyter_gpu.version import __version__

    target = Path(path)
    header: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "recorded_at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "interval": interval,
        "backend": backend_name,
        "jupyter_gpu_version": __version__,
    }
    lines = [f"  {json.dumps(key)}: {json.dumps(value)}," for key, value in header.items()]
    body = ",\n".join(f"    {json.dumps(sample.to_dict())}" for sample in samples)
    text = "{\n" + "\n".join(lines) + '\n  "samples": [\n' + body + "\n  ]\n}\n"
    write_text_atomically(target, text)
    return target


# -- reading -------------------------------------------------------------------------------------------


def load_recording(path: str | os.PathLike[str]) -> Recording:
    """The recording in `path`; a file that cannot be replayed raises `RecordingError` with one sentence."""
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecordingError(f"There is no GPU recording at {name}; record one with "
                             f"`jupyter-gpu record {name} --seconds 10`.") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise RecordingError(f"Cannot read the GPU recording {name}: {reason}.") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordingError(f"{name} is not a jupyter-gpu recording: it is not JSON ({exc.msg}, line "
                             f"{exc.lineno}).") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise RecordingError(f"{name} is not a jupyter-gpu recording: it lacks \"format\": \"{FORMAT}\".")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise RecordingError(f"The GPU recording {name} has no integer \"version\".")
    if version > VERSION:
        raise RecordingError(f"The GPU recording {name} has format version {version}, newer than this jupyter-gpu "
                             f"reads ({VERSION}); upgrade jupyter-gpu to replay it.")
    interval = data.get("interval")
    if interval is not None and (not isinstance(interval, int | float) or isinstance(interval, bool)
                                 or not math.isfinite(interval) or interval <= 0):
        raise RecordingError(f"The GPU recording {name} has an \"interval\" that is not a positive number of "
                             f"seconds: {interval!r}.")
    raw_samples = data.get("samples")
    if not isinstance(raw_samples, list) or not raw_samples:
        raise RecordingError(f"The GPU recording {name} has no samples.")
    samples = tuple(_sample(name, index, raw) for index, raw in enumerate(raw_samples))
    for index in range(1, len(samples)):
        if samples[index].timestamp < samples[index - 1].timestamp:
            raise RecordingError(f"Sample {index} in the GPU recording {name} is older than sample {index - 1}; "
                                 f"samples must be in the order they were read.")
    return Recording(
        samples=samples,
        interval=float(interval) if interval is not None else None,
        recorded_at=_text_or_none(data.get("recorded_at")),
        backend=_text_or_none(data.get("backend")),
    )


def _sample(name: str, index: int, raw: object) -> Sample:
    def refuse(reason: str) -> RecordingError:
        return RecordingError(f"Sample {index} in the GPU recording {name} is not a valid sample: {reason}.")

    if not isinstance(raw, dict):
        raise refuse(f"it is a JSON {_json_type(raw)}, not an object")
    devices = raw.get("devices", [])
    if not isinstance(devices, list):
        raise refuse(f"its \"devices\" is a JSON {_json_type(devices)}, not an array")
    for position, device in enumerate(devices):  # checked one by one, so the message can say which device
        if not isinstance(device, dict):
            raise refuse(f"device {position} is a JSON {_json_type(device)}, not an object")
        try:
            DeviceSample.from_dict(device)
        except (TypeError, ValueError, AttributeError) as exc:
            raise refuse(f"device {position}: {_reason(exc)}") from None
    try:
        sample = Sample.from_dict(raw)
    except KeyError as exc:
        raise refuse(f"it has no {exc.args[0]!r}") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise refuse(_reason(exc)) from None
    if not math.isfinite(sample.timestamp):
        raise refuse(f"its timestamp is {sample.timestamp}")
    return sample


def _reason(exc: Exception) -> str:
    # "DeviceSample.__init__() missing 1 required positional argument: 'uuid'" -> "missing 1 required ...".
    return str(exc).split("__init__() ", 1)[-1].rstrip(".")


def _json_type(value: object) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None
