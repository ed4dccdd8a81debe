"""One sampler per process, shared by every panel and `%%gputime`: leases, not threads.

Each consumer takes a `Lease` with the interval it wants and a callback. The shared `Sampler` polls at the
fastest interval any open lease asks for, on one daemon thread, and stops (closing the backend) when the
last lease is closed. Consumers that want a slower rate skip samples themselves (see `RateLimiter`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping

from jupyter_gpu.metrics.backends.base import BACKEND_ENV, Backend
from jupyter_gpu.metrics.backends.select import select_backend
from jupyter_gpu.metrics.sample import Sample
from jupyter_gpu.metrics.sampler import Sampler, Subscriber, check_interval

# What the shared sampler keeps for a late joiner (a panel opened later fills its sparkline from here).
SHARED_HISTORY = 600


class Lease:
    """A consumer's claim on the shared sampler; `close()` (or `with`) gives it back. Safe to close twice."""

    def __init__(self, hub: SamplerHub, interval: float, callback: Subscriber | None) -> None:
        self.hub = hub
        self.interval = interval
        self.callback = callback
        self.closed = False
        self._unsubscribe: Callable[[], None] | None = None

    @property
    def sampler(self) -> Sampler:
        sampler = self.hub.sampler
        if sampler is None or self.closed:
            raise RuntimeError("This lease on the GPU metrics sampler is closed.")
        return sampler

    def close(self) -> None:
        self.hub._release(self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SamplerHub:
    """Hands out leases on one Sampler over one backend; the thread runs only while a lease is open."""

    def __init__(self, backend_factory: Callable[[], Backend], history: int = SHARED_HISTORY) -> None:
        self._backend_factory = backend_factory
        self._history = history
        self._lock = threading.RLock()
        self._leases: list[Lease] = []
        self._sampler: Sampler | None = None

    @property
    def sampler(self) -> Sampler | None:
        with self._lock:
            return self._sampler

    @property
    def leases(self) -> int:
        with self._lock:
            return len(self._leases)

    def acquire(self, interval: float = 1.0, callback: Subscriber | None = None, *, start: bool = True) -> Lease:
        """A lease polling at least every `interval` seconds; `callback(sample)` runs on the sampler thread.

        With `start=False` the caller takes a first reading itself (`lease.sampler.read_now()`) before the
        thread starts, e.g. to decide whether there is anything to watch.
        """
        check_interval(interval)
        with self._lock:
            if self._sampler is None:
                # The backend is made here, not at import, so a bad JUPYTER_GPU_BACKEND fails the magic
                # that asked, with its message, and an unused hub costs nothing.
                self._sampler = Sampler(self._backend_factory(), interval=interval, history=self._history)
            lease = Lease(self, float(interval), callback)
            self._leases.append(lease)
            if callback is not None:
                lease._unsubscribe = self._sampler.subscribe(callback)
            self._retune()
            if start:
                self._sampler.start()
            return lease

    def start(self) -> None:
        with self._lock:
            if self._sampler is not None and self._leases:
                self._sampler.start()

    def close_all(self) -> None:
        """Close every lease (extension unload); the thread stops and the backend closes."""
        with self._lock:
            leases = list(self._leases)
        for lease in leases:
            lease.close()

    def _release(self, lease: Lease) -> None:
        with self._lock:
            if lease.closed:
                return
            lease.closed = True
            if lease._unsubscribe is not None:
                lease._unsubscribe()
            self._leases.remove(lease)
            sampler = self._sampler
            if self._leases:
                self._retune()
                return
            self._sampler = None
        if sampler is not None:
            # Outside the lock: stop() joins the thread, whose callbacks may be waiting to take a lease.
            sampler.stop()
            sampler.backend.close()

    def _retune(self) -> None:
        assert self._sampler is not None
        fastest = min(lease.interval for lease in self._leases)
        if fastest != self._sampler.interval:
            self._sampler.set_interval(fastest)


class RateLimiter:
    """Lets through one sample per `interval` seconds of sample time (a slow panel on a fast hub).

    Due times follow a grid, so a sample that arrives a little late does not push every later update back;
    10% slack lets through a sample that arrives a hair early (thread wake-up jitter).
    """

    SLACK = 0.1

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._next: float | None = None

    def due(self, sample: Sample) -> bool:
        stamp = sample.timestamp
        if self._next is not None and stamp < self._next - self.SLACK * self.interval:
            return False
        if self._next is None or stamp - self._next > self.interval:
            self._next = stamp  # first sample, or a gap: restart the grid here
        self._next += self.interval
        return True


def hub_for_spec(spec: str, history: int = SHARED_HISTORY) -> SamplerHub:
    """A hub over the backend a `JUPYTER_GPU_BACKEND` value names; errors name that variable."""
    return SamplerHub(lambda: select_backend(None, env={BACKEND_ENV: spec}), history=history)


_hubs: dict[str, SamplerHub] = {}
_hubs_lock = threading.Lock()


def shared_hub(env: Mapping[str, str] | None = None) -> SamplerHub:
    """This process's hub for the backend `JUPYTER_GPU_BACKEND` names (NVML when unset).

    One hub per backend spec, so changing the variable mid-session switches backends rather than mixing
    simulated and real readings in one history.
    """
    spec = (os.environ if env is None else env).get(BACKEND_ENV, "").strip()
    with _hubs_lock:
        hub = _hubs.get(spec)
        if hub is None:
            hub = _hubs[spec] = hub_for_spec(spec)
        return hub


def close_shared_hubs() -> None:
    with _hubs_lock:
        hubs = list(_hubs.values())
    for hub in hubs:
        hub.close_all()
