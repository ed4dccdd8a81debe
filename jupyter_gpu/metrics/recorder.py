"""The record loop behind `jupyter-gpu record`: poll a backend with the real `Sampler` and keep every reading.

The file it becomes is `jupyter_gpu.metrics.recording`'s format; this module only reads.
"""

from __future__ import annotations

import math
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass

from jupyter_gpu.metrics.backends.base import Backend
from jupyter_gpu.metrics.sample import Sample
from jupyter_gpu.metrics.sampler import Sampler, check_interval

# How long record() waits for the first reading before checking for Ctrl-C again (the wait itself is unbounded:
# NVML's first start can be slow, and the user can always press Ctrl-C).
_POLL_SECONDS = 0.5


class NoDriverError(RuntimeError):
    """The backend's first reading says there is no driver: there is nothing worth recording."""


@dataclass(frozen=True)
class Recorded:
    """What `record` read: the samples, and whether Ctrl-C cut the recording short."""

    samples: tuple[Sample, ...]
    interrupted: bool

    @property
    def gpu_count(self) -> int:
        """The most devices any sample saw (a GPU that falls off the bus stays listed, as `lost`)."""
        return max((len(sample.devices) for sample in self.samples), default=0)

    @property
    def span(self) -> float:
        """Seconds from the first sample to the last."""
        if not self.samples:
            return 0.0
        return self.samples[-1].timestamp - self.samples[0].timestamp


def record(backend: Backend, seconds: float, interval: float = 1.0,
           on_sample: Callable[[Sample], None] | None = None) -> Recorded:
    """Poll `backend` with the real `Sampler`: once now, then every `interval` for `seconds`.

    `on_sample` is called on the calling thread after each sample is kept. Ctrl-C (KeyboardInterrupt, also one
    raised by `on_sample`) stops early and keeps what was read so far. If the first reading says there is no
    driver, `NoDriverError` is raised with its message: recording it would only make an empty fixture.
    """
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"A recording must last a finite, positive number of seconds, got {seconds!r}.")
    check_interval(interval)
    expected = math.floor(seconds / interval + 1e-9) + 1  # the reading at 0 s, then one per interval
    arrived: queue.Queue[Sample] = queue.Queue()
    # The sampler keeps only the last reading (for its strictly increasing timestamps); we keep our own list.
    sampler = Sampler(backend, interval=interval, history=1)
    unsubscribe = sampler.subscribe(arrived.put)
    samples: list[Sample] = []
    interrupted = False
    deadline = math.inf
    sampler.start()
    try:
        while len(samples) < expected:
            # Until the first reading arrives there is no deadline: the first NVML start can be slow.
            wait = _POLL_SECONDS if not samples else deadline - time.monotonic()
            if wait <= 0:
                break  # slow reads made the sampler skip ticks; the time is up all the same
            try:
                sample = arrived.get(timeout=wait)
            except queue.Empty:
                continue
            if not samples:
                if sample.status == "no_driver":
                    raise NoDriverError(sample.message or f"The {backend.name} backend found no GPU driver.")
                # The time counts from the first reading; one interval of grace lets the last one land.
                deadline = time.monotonic() + seconds + interval
            samples.append(sample)
            if on_sample is not None:
                on_sample(sample)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        sampler.stop()
        unsubscribe()
    return Recorded(tuple(samples), interrupted)
