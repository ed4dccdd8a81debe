"""The server extension's HTTP endpoints and its push stream; every one requires Jupyter's authentication (403
without it).

They only read what the monitor has already computed, so they never wait on NVML.
"""

from __future__ import annotations

import gzip
from typing import Any

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from jupyter_gpu.server.arguments import number_argument
from jupyter_gpu.server.monitor import GpuMonitor
from jupyter_gpu.server.prometheus import CONTENT_TYPE
from jupyter_gpu.server.series import MAX_POINTS
from jupyter_gpu.server.stream import STREAM_SETTING, MetricsStream, MetricsStreamHandler

MONITOR_SETTING = "jupyter_gpu_monitor"
GZIP_FROM_BYTES = 64 * 1024


class _MonitorHandler(APIHandler):
    # A panel polling all day must not count as user activity, or JupyterHub's idle culler never stops
    # the server.
    _track_activity = False

    @property
    def monitor(self) -> GpuMonitor:
        return self.settings[MONITOR_SETTING]

    def compute_etag(self) -> None:
        # Every reply is fresh (no-store, a new server_time): hashing megabytes of history for an ETag that
        # can never match is wasted work on the event loop.
        return None


class MetricsHandler(_MonitorHandler):
    @tornado.web.authenticated
    def get(self) -> None:
        since = number_argument(self, "since", "a Unix time in seconds")
        self.set_header("Cache-Control", "no-store")
        self.finish(self.compressed(self.monitor.metrics_json(since)))

    def compressed(self, body: str) -> bytes:
        """gzip a large reply when the client accepts it: the full history of eight GPUs is about 4 MB of JSON
        (600 readings), which a panel fetches each time it opens. Polls after that stay small and plain.
        """
        data = body.encode()
        if len(data) < GZIP_FROM_BYTES or "gzip" not in self.request.headers.get("Accept-Encoding", ""):
            return data
        self.set_header("Content-Encoding", "gzip")
        self.set_header("Vary", "Accept-Encoding")
        return gzip.compress(data, compresslevel=1)  # level 1: ~10x smaller at a fraction of level 6's cost


class SeriesHandler(_MonitorHandler):
    """`?window=S&points=N`: the long charts' downsampled series (S from 10 s to the kept history, N 2-1000)."""

    @tornado.web.authenticated
    def get(self) -> None:
        window = number_argument(self, "window", "a number of seconds")
        points = number_argument(self, "points", "a number")
        window = self.monitor.series_seconds if window is None else window
        points = 300.0 if points is None else points
        if not 10 <= window <= self.monitor.series_seconds:
            raise tornado.web.HTTPError(400, f"'window' must be 10 to {self.monitor.series_seconds:g} seconds "
                                             f"(c.JupyterGpu.history_seconds), got {window:g}.")
        if not 2 <= points <= MAX_POINTS or points != int(points):
            raise tornado.web.HTTPError(400, f"'points' must be a whole number from 2 to {MAX_POINTS}, got {points:g}.")
        self.set_header("Cache-Control", "no-store")
        self.finish(self.monitor.series_json(window, int(points)))


class StatusHandler(_MonitorHandler):
    @tornado.web.authenticated
    async def get(self) -> None:
        self.set_header("Cache-Control", "no-store")
        self.finish(await self.monitor.status())


class PrometheusHandler(_MonitorHandler):
    """Scrape with `Authorization: token <server token>` (Prometheus' `authorization` credentials)."""

    @tornado.web.authenticated
    def get(self) -> None:
        self.finish(self.monitor.prometheus_text(), set_content_type=CONTENT_TYPE)


ROUTES: tuple[tuple[tuple[str, ...], type[_MonitorHandler | MetricsStreamHandler]], ...] = (
    (("jupyter-gpu", "api", "metrics"), MetricsHandler),
    (("jupyter-gpu", "api", "metrics", "stream"), MetricsStreamHandler),
    (("jupyter-gpu", "api", "status"), StatusHandler),
    (("jupyter-gpu", "api", "series"), SeriesHandler),
    (("jupyter-gpu", "metrics"), PrometheusHandler),
)


def setup_handlers(web_app: Any, monitor: GpuMonitor) -> MetricsStream:
    """Add the routes; returns the push stream, which the extension shuts at server stop."""
    stream = MetricsStream(monitor)
    web_app.settings[MONITOR_SETTING] = monitor
    web_app.settings[STREAM_SETTING] = stream
    base_url = web_app.settings["base_url"]
    web_app.add_handlers(".*$", [(url_path_join(base_url, *parts), handler) for parts, handler in ROUTES])
    return stream
