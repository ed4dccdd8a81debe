"""Each new reading pushed to the side panels over one WebSocket each, instead of a poll per panel per second.

A poll pays jupyter_server's whole request path every time (parsing, authentication, headers, the access log):
about 0.4 ms of the event loop's time, so fifty tabs polling in the same millisecond wait up to 20 ms for the
last reply. A socket is authenticated once, when it opens; after that each reading costs one WebSocket frame per
panel, made once and written to every socket that is up to date.

`GET /jupyter-gpu/api/metrics/stream?since=T&every=S` (a WebSocket; Jupyter's authentication as for every route):
- at once, the same JSON as `/jupyter-gpu/api/metrics?since=T` (everything kept when `since` is absent);
- then, after each reading, the same JSON again with `history` holding whatever this socket has not yet been sent
  (usually nothing: `latest` is the new reading), at most once every `every` seconds (default: every reading);
- a socket whose last frame is not yet written out (a stalled tab) is skipped; its next frame carries what it
  missed, so a slow client neither loses readings nor grows the server's buffers.
The panel falls back to polling when the socket cannot open (an old server, a proxy without WebSockets).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from jupyter_server.auth.decorator import ws_authenticated
from jupyter_server.base.handlers import JupyterHandler
from tornado import websocket
from tornado.ioloop import IOLoop

from jupyter_gpu.server.arguments import number_argument
from jupyter_gpu.server.monitor import GpuMonitor

logger = logging.getLogger(__name__)

STREAM_SETTING = "jupyter_gpu_stream"
GOING_AWAY = 1001  # RFC 6455: the server is shutting down; the panel reconnects (or falls back to polling)


@dataclass(eq=False)
class Subscriber:
    """One open socket: what it has been sent, and when."""

    handler: MetricsStreamHandler
    every: float  # seconds between frames, at least the sampling interval
    sent: float | None = None  # timestamp of the newest reading this socket has been sent
    sent_at: float = -math.inf  # time.monotonic() of its last frame
    writing: Awaitable[None] | None = field(default=None, repr=False)  # its last frame, until written out


class MetricsStream:
    """The sockets of one server, fed from the monitor. Everything but `_from_sampler` runs on the event loop."""

    def __init__(self, monitor: GpuMonitor, loop: IOLoop | None = None) -> None:
        self.monitor = monitor
        self._loop = loop or IOLoop.current()
        self._subscribers: dict[MetricsStreamHandler, Subscriber] = {}
        self.frames = 0  # written since start (the tests and the bench count them)
        self.skipped_stalled = 0  # frames held back from a socket still writing its last one
        monitor.add_listener(self._from_sampler)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def _from_sampler(self) -> None:
        # The sampler thread only hands the news to the loop: sockets are the loop's alone. With no socket open the
        # loop is not woken at all (a socket opening meanwhile is sent everything at once by `open`).
        if self._subscribers:
            self._loop.add_callback(self.push)

    def open(self, handler: MetricsStreamHandler, since: float | None, every: float) -> None:
        """A new socket: everything after `since` at once, then each new reading."""
        subscriber = Subscriber(handler, every=max(every, self.monitor.interval))
        self._subscribers[handler] = subscriber
        body, newest = self.monitor.metrics_reply(since)
        self._write(subscriber, body, newest)

    def close(self, handler: MetricsStreamHandler) -> None:
        self._subscribers.pop(handler, None)

    def push(self) -> None:
        """Send the newest reading to every socket that is due; one body per distinct `sent`, usually one in all."""
        now, interval = time.monotonic(), self.monitor.interval
        bodies: dict[float | None, tuple[str, float | None]] = {}
        for subscriber in list(self._subscribers.values()):
            if subscriber.every > interval and now - subscriber.sent_at < subscriber.every - 0.5 * interval:
                continue  # not due yet; a reading up to half an interval early counts as due, so jitter never skips one
            if subscriber.writing is not None and not subscriber.writing.done():  # type: ignore[attr-defined]
                self.skipped_stalled += 1
                continue
            if subscriber.sent not in bodies:
                bodies[subscriber.sent] = self.monitor.metrics_reply(subscriber.sent)
            body, newest = bodies[subscriber.sent]
            if newest is None or newest == subscriber.sent:
                continue  # nothing new for it
            self._write(subscriber, body, newest)

    def _write(self, subscriber: Subscriber, body: str, newest: float | None) -> None:
        try:
            subscriber.writing = subscriber.handler.write_message(body)
        except websocket.WebSocketClosedError:
            # The peer went without a close handshake, so on_close has not run: forget it here.
            self.close(subscriber.handler)
            return
        subscriber.sent = newest
        subscriber.sent_at = time.monotonic()
        self.frames += 1

    def shut(self) -> None:
        """At server stop: no more readings, and every socket told the server is going away."""
        self.monitor.remove_listener(self._from_sampler)
        for handler in list(self._subscribers):
            handler.close(GOING_AWAY, "The Jupyter server is stopping.")
        self._subscribers.clear()


class MetricsStreamHandler(JupyterHandler, websocket.WebSocketHandler):
    """The push stream's WebSocket (see the module's docstring)."""

    async def prepare(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        # A 403 without authentication, as on the other routes: a socket cannot follow a redirect to the login page.
        await super().prepare(*args, _redirect_to_login=False, **kwargs)  # type: ignore[misc]

    @ws_authenticated
    async def get(self, *args: Any, **kwargs: Any) -> None:
        # Checked before the upgrade, so a bad query is an HTTP 400 with a sentence, as on the polling route.
        self._since = number_argument(self, "since", "a Unix time in seconds")
        self._every = number_argument(self, "every", "a number of seconds") or 0.0
        result = super().get(*args, **kwargs)
        if result is not None:
            await result

    @property
    def stream(self) -> MetricsStream:
        return self.settings[STREAM_SETTING]

    def open(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        self.stream.open(self, self._since, self._every)

    def on_message(self, message: str | bytes) -> None:
        pass  # the panel says nothing on this socket; anything it sends is ignored

    def on_close(self) -> None:
        self.stream.close(self)
