"""Polls one backend on a daemon thread into a bounded history and hands each Sample to subscribers.

Pure Python: it never imports torch or touches CUDA (a CUDA context created in the kernel by a monitor would
break forked DataLoader workers). The backend owns the NVML connection; the sampler only calls `read()`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from types import TracebackType

from jupyter_gpu.metrics.backends.base import Backend
from jupyter_gpu.metrics.sample import Sample

logger = logging.getLogger(__name__)

MIN_INTERVAL = 0.1
THREAD_NAME = "jupyter-gpu-sampler"

Subscriber = Callable[[Sample], None]


class Sampler:
    """`with Sampler(backend, interval=0.5) as s: ... s.history()`; or start()/stop() by hand."""

    def __init__(self, backend: Backend, interval: float = 1.0, history: int = 600) -> None:
        check_interval(interval)
        if history < 1:
            raise ValueError(f"The history must keep at least 1 sample, got {history!r}.")
        self.backend = backend
        self.interval = float(interval)
        self._history: deque[Sample] = deque(maxlen=int(history))
        self._subscribers: dict[object, Subscriber] = {}
        self._lock = threading.Lock()  # guards _history, _subscribers, _thread, _stop
        self._thread: threading.Thread | None = None
        self._stop: threading.Event | None = None
        # Wakes the polling thread early: on stop(), and on set_interval() so a faster rate applies now.
        self._wakeup = threading.Condition(threading.Lock())
        self._regrid = False

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the polling thread; does nothing if it is already running."""
        with self._lock:
            if self._alive():
                return
            # Each thread gets its own Event, so a thread still finishing after stop() cannot be revived.
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, args=(self._stop,), name=THREAD_NAME, daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop and join the thread; safe to call twice, before start(), or from a subscriber callback."""
        with self._lock:
            thread, stop = self._thread, self._stop
            self._thread = None
        if stop is not None:
            stop.set()
            with self._wakeup:
                self._wakeup.notify_all()
        # A subscriber runs on the sampler thread: joining itself would deadlock, and the loop ends anyway.
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def set_interval(self, interval: float) -> None:
        """Change the polling rate; a running thread takes it from the last reading, not the next one."""
        check_interval(interval)
        with self._wakeup:
            self.interval = float(interval)
            self._regrid = True
            self._wakeup.notify_all()

    @property
    def running(self) -> bool:
        with self._lock:
            return self._alive()

    def _alive(self) -> bool:
        # Called with the lock held. A thread told to stop is not "running" even while it finishes a read.
        return (self._thread is not None and self._thread.is_alive()
                and self._stop is not None and not self._stop.is_set())

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- reading -------------------------------------------------------------------------------------

    def read_now(self) -> Sample:
        """Read once on the calling thread, record it and notify subscribers."""
        sample = self._read()
        with self._lock:
            last = self._history[-1] if self._history else None
            # history(since=t) is a cursor: timestamps must strictly increase even if the wall clock
            # steps back (NTP) or two reads land on the same tick.
            if last is not None and sample.timestamp <= last.timestamp:
                sample = replace(sample, timestamp=math.nextafter(last.timestamp, math.inf))
            self._history.append(sample)
            subscribers = list(self._subscribers.values())
        for callback in subscribers:
            try:
                callback(sample)
            except Exception:
                logger.exception("A GPU metrics subscriber failed; the sampler keeps going.")
        return sample

    def latest(self) -> Sample | None:
        with self._lock:
            return self._history[-1] if self._history else None

    def history(self, since: float | None = None) -> list[Sample]:
        """The kept samples, oldest first; with `since`, only those with a later timestamp."""
        with self._lock:
            samples = list(self._history)
        if since is None:
            return samples
        return [s for s in samples if s.timestamp > since]

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call `callback(sample)` for each new sample (on the sampler thread); returns the unsubscribe function."""
        token = object()  # the same callback may be subscribed twice and unsubscribed once per subscription
        with self._lock:
            self._subscribers[token] = callback

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers.pop(token, None)

        return unsubscribe

    # -- internals -----------------------------------------------------------------------------------

    def _read(self) -> Sample:
        try:
            return self.backend.read()
        except Exception as exc:
            # Backends turn driver problems into statuses; an exception here is a bug, but the panel should
            # show it and keep polling rather than go silently stale.
            logger.exception("The %s GPU metrics backend raised.", self.backend.name)
            message = f"Reading GPU metrics from {self.backend.name} failed: {type(exc).__name__}: {exc}."
            return Sample(time.time(), self.backend.name, self.backend.simulated, status="error", message=message)

    def _run(self, stop: threading.Event) -> None:
        # Ticks are grid + n * interval on the monotonic clock, so slow reads do not make the rate drift;
        # ticks missed while a read was slow are skipped, never caught up in a burst. A new interval
        # restarts the grid at the last reading.
        grid = time.monotonic()
        tick = 0
        while not stop.is_set():
            read_started = time.monotonic()
            self.read_now()
            tick += 1
            with self._wakeup:
                while not stop.is_set():
                    if self._regrid:
                        self._regrid = False
                        grid, tick = read_started, 1
                    now = time.monotonic()
                    tick = max(tick, math.floor((now - grid) / self.interval) + 1)
                    remaining = grid + tick * self.interval - now
                    if remaining <= 0:
                        break
                    if not self._wakeup.wait(remaining) and not self._regrid:
                        break


def running_sampler_threads() -> int:
    """How many sampler threads this process runs now: counted, not assumed (the server reports it)."""
    return sum(t.name == THREAD_NAME for t in threading.enumerate())


def check_interval(interval: float) -> None:
    if not math.isfinite(interval) or interval < MIN_INTERVAL:
        raise ValueError(
            f"The sampling interval must be a finite number of seconds, at least {MIN_INTERVAL}, got {interval!r}."
        )
