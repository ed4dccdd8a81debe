"""Plays back a recording made by `jupyter-gpu record`, so behaviour seen on a real GPU becomes a regression test.

Chosen only explicitly, with `JUPYTER_GPU_BACKEND=replay:FILE` or the spec `replay:FILE`. A replay is not live
hardware, so every Sample it returns is marked `simulated=True` and named `replay:FILE`: each surface labels it
the way it labels simulated output.
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Callable
from dataclasses import replace

from jupyter_gpu.metrics.backends.base import BackendSpecError
from jupyter_gpu.metrics.recording import Recording, RecordingError, load_recording
from jupyter_gpu.metrics.sample import Sample


class ReplayBackend:
    """The recorded samples again, at the pace they were recorded, read from `clock`.

    Each `read()` returns the recorded sample whose offset from the first one is the latest not after the time
    since this backend was created, stamped with the current wall-clock time (so a sampler's history cursor keeps
    moving). After the last recorded sample it keeps returning that one: a recording that ends with a lost GPU
    or a missing driver replays as a GPU that stays lost, as it would on the machine it was recorded on.
    """

    simulated = True

    def __init__(self, path: str | os.PathLike[str], clock: Callable[[], float] = time.monotonic) -> None:
        try:
            self.recording: Recording = load_recording(path)
        except RecordingError as exc:
            # One sentence for %gpupanel and %gputime, which show a BackendSpecError as it is.
            raise BackendSpecError(str(exc)) from None
        self.path = str(path)
        self.name = f"replay:{self.path}"
        self._samples = self.recording.samples
        first = self._samples[0].timestamp
        self._offsets = [sample.timestamp - first for sample in self._samples]
        self._clock = clock
        self._start = clock()

    def read(self) -> Sample:
        elapsed = self._clock() - self._start
        index = max(bisect.bisect_right(self._offsets, elapsed) - 1, 0)
        return replace(self._samples[index], timestamp=time.time(), backend=self.name, simulated=True)

    def close(self) -> None:
        """Nothing to release; present so every backend can be closed the same way."""
