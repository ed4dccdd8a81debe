"""One GPU monitor per Jupyter server: one sampler thread, shared by every browser tab and scraper.

NVML is only ever called on the sampler thread (started from a helper thread, so even a slow `nvmlInit`
never blocks the event loop). Each new sample is attributed to kernels, checked for alerts and encoded to
JSON once, on that thread; a request only joins strings that are already made, so fifty clients cost about
what one does.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jupyter_gpu.metrics.alerts import Alert, KernelView, idle_during_cell_alerts, sample_alerts
from jupyter_gpu.metrics.hub import Lease, SamplerHub
from jupyter_gpu.metrics.sample import Sample
from jupyter_gpu.metrics.sampler import running_sampler_threads
from jupyter_gpu.server import prometheus
from jupyter_gpu.server.attribution import Holder, attribute
from jupyter_gpu.server.kernels import KernelInfo
from jupyter_gpu.server.processes import PROC_ROOT, ProcessLookup, cached_lookup
from jupyter_gpu.server.series import SeriesStore

logger = logging.getLogger(__name__)

API_VERSION = 1
CHECK_TTL_S = 600.0  # the %gpucheck verdict for "no GPU" is re-run at most this often


@dataclass(frozen=True)
class View:
    """Everything a request needs about the latest sample, already encoded."""

    sample: Sample | None = None
    holders: tuple[Holder, ...] = ()
    holders_json: str = "[]"
    alerts_json: str = "[]"


def server_alerts(sample: Sample, history: list[Sample], holders: tuple[Holder, ...]) -> list[Alert]:
    """The panel's alerts: the device rules, plus "GPU idle" for each busy kernel that holds a GPU.

    "Another process holds most memory" is left to the holder table: on a server every notebook is
    "another process" to every other one.
    """
    alerts = [a for a in sample_alerts(sample, history, KernelView()) if a.code != "OTHER_PROCESS_MEMORY"]
    for holder in holders:
        kernel = holder.kernel
        if kernel is None or kernel.busy_since is None:
            continue
        view = KernelView(pids=frozenset(holder.pids), cell_started=kernel.busy_since)
        alerts.extend(Alert(a.code, a.severity, a.device, f"{holder.label}: {a.message}")
                      for a in idle_during_cell_alerts(sample, history, view))
    return alerts


class GpuMonitor:
    def __init__(self, hub: SamplerHub, *, interval: float = 1.0, history: int = 600,
                 series_seconds: float = 3600.0, server_uid: int | None = None,
                 lookup_factory: Callable[[], ProcessLookup] | None = None,
                 check: Callable[[], dict[str, Any]] | None = None) -> None:
        self.hub = hub
        self.interval = interval
        self.kernels: tuple[KernelInfo, ...] = ()  # replaced whole by the event loop, read by the sampler thread
        self.view = View()
        # (timestamp, the sample's JSON), oldest first; the lock also covers `view`, so a reply never pairs
        # one reading's holders with another reading's samples.
        self._history: deque[tuple[float, str]] = deque(maxlen=history)
        # The long charts' figures, `series_seconds` of them; a downsampled reply is made once per reading and shape.
        self.series_seconds = series_seconds
        self._series = SeriesStore(max(2, math.ceil(series_seconds / interval)))
        self._series_cache: dict[tuple[float, int], tuple[float | None, str]] = {}
        self._lock = threading.Lock()
        self._lookup_factory = lookup_factory or (lambda: cached_lookup(PROC_ROOT))
        self._server_uid = os.getuid() if server_uid is None else server_uid
        self._check = check or _default_check
        self._check_result: tuple[float, dict[str, Any]] | None = None
        self._check_future: asyncio.Future[dict[str, Any]] | None = None
        self._lease: Lease | None = None
        self._start_error: str | None = None
        self._closed = False
        # Called on the sampler thread after each reading is kept (the push stream hands it to the event loop).
        self._listeners: list[Callable[[], None]] = []

    # -- lifecycle -----------------------------------------------------------------------------------

    def start_in_background(self) -> threading.Thread:
        thread = threading.Thread(target=self.start, name="jupyter-gpu-start", daemon=True)
        thread.start()
        return thread

    def start(self, *, thread: bool = True) -> None:
        """Take the lease and start sampling; `thread=False` leaves the reads to `read_now()` (tests)."""
        try:
            lease = self.hub.acquire(self.interval, self._on_sample, start=thread)
        except Exception as exc:  # a bad JUPYTER_GPU_BACKEND: the status endpoint says so instead of crashing
            logger.exception("jupyter-gpu could not start its GPU sampler.")
            self._start_error = f"The GPU sampler could not start: {type(exc).__name__}: {exc}"
        else:
            if self._closed:
                lease.close()
            self._lease = lease

    def read_now(self) -> Sample:
        if self._lease is None:
            raise RuntimeError(self._start_error or "The GPU monitor has not started.")
        return self._lease.sampler.read_now()

    def close(self) -> None:
        self._closed = True
        if self._lease is not None:
            self._lease.close()

    # -- per sample (sampler thread) -----------------------------------------------------------------

    def _on_sample(self, sample: Sample) -> None:
        holders = tuple(attribute(sample, self.kernels, self._lookup_factory(), self._server_uid))
        lease = self._lease
        history = lease.sampler.history() if lease is not None and not lease.closed else [sample]
        alerts = server_alerts(sample, history, holders)
        now = sample.timestamp
        encoded = json.dumps(sample.to_dict())
        view = View(
            sample=sample,
            holders=holders,
            holders_json=json.dumps([h.to_dict(now) for h in holders]),
            alerts_json=json.dumps([{"code": a.code, "severity": a.severity, "device": a.device,
                                     "message": a.message} for a in alerts]),
        )
        with self._lock:
            self._history.append((sample.timestamp, encoded))
            self._series.add(sample)
            self.view = view
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # a listener's bug must not stop the readings
                logger.exception("jupyter-gpu: a reading listener failed.")

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener()` on the sampler thread after every reading (it must only hand the news on, quickly)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    # -- what the handlers send ----------------------------------------------------------------------

    def metrics_json(self, since: float | None = None) -> str:
        """`{"latest": sample, "history": [...], "holders": [...], "alerts": [...]}`.

        `history` holds the samples after `since` (all kept ones without it), oldest first, up to but not
        including `latest`: the full series is `history + [latest]`, and a poll carries each sample once.
        """
        return self.metrics_reply(since)[0]

    def metrics_reply(self, since: float | None = None) -> tuple[str, float | None]:
        """`metrics_json(since)` and the timestamp of the newest reading in it (None before the first), read
        together under the lock: the push stream's next message starts from exactly that reading."""
        with self._lock:
            view = self.view
            kept = self._history
            start = len(kept)
            if since is None:
                start = 0
            else:
                while start > 0 and kept[start - 1][0] > since:  # from the newest: a poll wants one or two
                    start -= 1
            history = [encoded for _, encoded in itertools.islice(kept, start, max(len(kept) - 1, 0))]
            latest = kept[-1][1] if kept else "null"
            newest = kept[-1][0] if kept else None
        sample = view.sample
        head = json.dumps({
            "api_version": API_VERSION,
            "server_time": time.time(),
            "interval": self.interval,
            "backend": sample.backend if sample else None,
            "simulated": sample.simulated if sample else None,
            "error": self._start_error,
        })
        return (f'{head[:-1]}, "latest": {latest}, "history": [{", ".join(history)}], '
                f'"holders": {view.holders_json}, "alerts": {view.alerts_json}}}'), newest

    def series_json(self, window: float, points: int) -> str:
        """The last `window` seconds of every GPU's utilisation and memory (% of total) in `points` buckets, each
        with its min, mean and max (`series.SeriesStore.downsample`), up to the newest reading; the same reply for
        every client until the next reading."""
        with self._lock:
            sample = self.view.sample
            newest = sample.timestamp if sample is not None else None
            key = (float(window), int(points))
            cached = self._series_cache.get(key)
            if cached is not None and cached[0] == newest:
                return cached[1]
            store = self._series.copy()  # bucketed outside the lock: the sampler thread's next reading never waits
        body = store.downsample(window, points, newest if newest is not None else time.time())
        body.update(api_version=API_VERSION, interval=self.interval, kept_seconds=store.span(),
                    history_seconds=self.series_seconds)
        encoded = json.dumps(body)
        with self._lock:
            if len(self._series_cache) > 8:  # a few chart shapes at most; never a client's whim kept forever
                self._series_cache.clear()
            self._series_cache[key] = (newest, encoded)
        return encoded

    def prometheus_text(self) -> str:
        view = self.view
        return prometheus.render(view.sample, view.holders)

    async def status(self) -> dict[str, Any]:
        """Is there a GPU to watch? With no GPU: NVML's reason and `%gpucheck`'s verdict and exact fix."""
        sample = self.view.sample
        base: dict[str, Any] = {
            "api_version": API_VERSION,
            "interval": self.interval,
            # Counted, not assumed: the load bench and the tests check it stays 1 whatever the clients.
            "sampler_threads": running_sampler_threads(),
            "backend": sample.backend if sample else None,
            "simulated": sample.simulated if sample else None,
        }
        if self._start_error is not None:
            return {**base, "available": False, "status": "error", "reason": self._start_error,
                    "devices": [], "check": None}
        if sample is None:
            return {**base, "available": False, "status": "starting", "reason": "The first reading is on its way.",
                    "devices": [], "check": None}
        devices = [{"index": d.index, "name": d.name, "uuid": d.uuid, "status": d.status} for d in sample.devices]
        available = sample.status == "ok" and bool(sample.devices)
        reason = sample.message if sample.status != "ok" else (None if devices else "NVML lists no GPU.")
        check = None if available else await self._cached_check()
        return {**base, "available": available, "status": sample.status, "reason": reason, "devices": devices,
                "check": check}

    async def _cached_check(self) -> dict[str, Any]:
        if self._check_result is not None and time.monotonic() - self._check_result[0] < CHECK_TTL_S:
            return self._check_result[1]
        if self._check_future is None:
            # One check at a time, off the event loop; every request waiting for it shares the answer.
            loop = asyncio.get_running_loop()
            self._check_future = asyncio.ensure_future(loop.run_in_executor(None, self._check))
        future = self._check_future
        try:
            result = await asyncio.shield(future)
        finally:
            if future.done():
                self._check_future = None
        self._check_result = (time.monotonic(), result)
        return result


def _default_check() -> dict[str, Any]:
    from jupyter_gpu.gpucheck.report import CheckBrief
    from jupyter_gpu.gpucheck.run import check_this_environment

    try:
        return check_this_environment().brief().to_dict()
    except (OSError, ValueError) as exc:
        return CheckBrief.could_not_run(exc).to_dict()
