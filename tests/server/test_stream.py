"""The push stream in a real JupyterLab: a WebSocket at jupyter-gpu/api/metrics/stream sends each reading once.

The client is tornado's real WebSocket client, as a browser would talk to the server: the HTTP upgrade with the
server's token, then one JSON frame per reading (or per `every` seconds).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest
from lab_server import TOKEN, LabServer, start_lab_server
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

STREAM = "jupyter-gpu/api/metrics/stream"
NEWEST_ONLY = "since=1e300"  # no reading is that recent: the first frame carries only `latest`, as a reconnect's does
FRAME_WAIT_S = 15.0  # a frame is due every 0.5 s; this only bounds a test that would otherwise hang


async def connect(server: LabServer, query: str = "", token: str | None = TOKEN) -> WebSocketClientConnection:
    url = server.base.replace("http://", "ws://", 1) + STREAM + (f"?{query}" if query else "")
    headers = {"Authorization": f"token {token}"} if token is not None else {}
    # The whole history of eight GPUs is ~4 MB of JSON: well under tornado's default 10 MiB, but a failure here
    # should be about the stream, not about the test client's limit.
    return await websocket_connect(HTTPRequest(url, headers=headers, connect_timeout=30, request_timeout=30),
                                   max_message_size=64 * 2**20)


async def next_frame(conn: WebSocketClientConnection, timeout: float = FRAME_WAIT_S) -> dict[str, Any]:
    message = await asyncio.wait_for(conn.read_message(), timeout)
    assert message is not None, f"the server closed the socket (code {conn.close_code}, {conn.close_reason!r})"
    return json.loads(message)


def readings(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """A metrics reply's readings, oldest first: `history + [latest]`."""
    return payload["history"] + ([payload["latest"]] if payload["latest"] is not None else [])


def stamps(payload: dict[str, Any]) -> list[float]:
    return [reading["timestamp"] for reading in readings(payload)]


async def get(server: LabServer, path: str) -> dict[str, Any]:
    """A plain HTTP request, off the event loop so the open sockets keep reading meanwhile."""
    reply = await asyncio.to_thread(server.request, path)
    assert reply.status == 200, (path, reply.status, reply.body[:500])
    return reply.json()


async def get_with_readings(server: LabServer, count: int) -> dict[str, Any]:
    """`GET jupyter-gpu/api/metrics` once the server keeps at least `count` readings (a fresh server has one)."""
    deadline = time.monotonic() + 30
    while len(stamps(polled := await get(server, "jupyter-gpu/api/metrics"))) < count:
        assert time.monotonic() < deadline, f"the server kept fewer than {count} readings"
        await asyncio.sleep(0.5)
    return polled


def log_since(server: LabServer, offset: int) -> str:
    with server.log.open("rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")


def assert_no_reading_lost(server_stamps: list[float], after: float, sent: list[float]) -> None:
    """`sent` (what the frames carried after the reading `after`) is exactly what the server kept up to the last."""
    assert sent, "no reading was sent"
    kept = [stamp for stamp in server_stamps if after < stamp <= sent[-1]]
    assert sent == kept, f"sent {sent}, the server kept {kept}"


def test_the_first_frame_is_what_the_polling_route_says(lab_a100) -> None:
    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        polled = await get_with_readings(lab_a100, 4)
        conn = await connect(lab_a100)
        try:
            return polled, await next_frame(conn)
        finally:
            conn.close()

    polled, frame = asyncio.run(scenario())
    assert set(frame) == set(polled)
    assert frame["api_version"] == 1 and frame["backend"] == "simulated:a100x8-mig" and frame["simulated"] is True
    assert frame["interval"] == polled["interval"] == 0.5 and frame["error"] is None
    assert [d["name"] for d in frame["latest"]["devices"]] == ["NVIDIA A100-SXM4-80GB"] * 8
    polled_stamps, frame_stamps = stamps(polled), stamps(frame)
    assert len(polled_stamps) >= 4 and frame_stamps == sorted(set(frame_stamps))
    # Every reading the poll had is in the frame, in order, and the same reading: only the oldest may have left the
    # server's ring (600 readings) in the moment between the two requests.
    still_kept = [stamp for stamp in polled_stamps if stamp >= frame_stamps[0]]
    assert len(still_kept) >= len(polled_stamps) - 2
    assert frame_stamps[: len(still_kept)] == still_kept
    by_stamp = {reading["timestamp"]: reading for reading in readings(frame)}
    assert all(by_stamp[r["timestamp"]] == r for r in readings(polled) if r["timestamp"] in by_stamp)
    # Anything after the poll's newest reading is newer still: the frame is the server's history up to now.
    assert frame["latest"]["timestamp"] >= polled["latest"]["timestamp"]
    assert frame["server_time"] >= polled["server_time"]


def test_each_new_reading_arrives_once_in_order_with_no_gap(lab_a100) -> None:
    async def scenario() -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
        conn = await connect(lab_a100, NEWEST_ONLY)
        try:
            first = await next_frame(conn)
            frames = [await next_frame(conn) for _ in range(6)]
        finally:
            conn.close()
        return first, frames, await get(lab_a100, f"jupyter-gpu/api/metrics?since={first['latest']['timestamp']!r}")

    first, frames, polled = asyncio.run(scenario())
    assert first["history"] == [] and first["latest"] is not None
    start = first["latest"]["timestamp"]
    sent = [stamp for frame in frames for stamp in stamps(frame)]
    assert len(sent) >= 6 and all(frame["latest"] is not None for frame in frames)
    assert sent == sorted(set(sent)) and sent[0] > start  # in order, none twice, none the socket already had
    # Compared with what the server kept after the first frame's reading: not one reading lost.
    assert_no_reading_lost(stamps(polled), start, sent)
    # Each frame is the whole reply, not a diff: holders and alerts come with every reading.
    assert all({"holders", "alerts", "server_time", "backend"} <= set(frame) for frame in frames)


def test_since_sends_at_once_only_the_readings_after_it(lab_a100) -> None:
    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        polled = await get_with_readings(lab_a100, 6)
        since = stamps(polled)[-4]  # three readings ago, then whatever came since the poll
        conn = await connect(lab_a100, f"since={since!r}")
        try:
            started = time.monotonic()
            frame = await next_frame(conn)
            assert time.monotonic() - started < 5  # at once, not at the next reading's push
        finally:
            conn.close()
        return polled, frame

    polled, frame = asyncio.run(scenario())
    since = stamps(polled)[-4]
    got = stamps(frame)
    assert got[:3] == stamps(polled)[-3:]  # the three readings after `since`, and nothing older
    assert all(stamp > since for stamp in got) and len(got) < 10
    assert got == sorted(set(got))


def test_every_two_seconds_sends_a_frame_about_every_two_seconds_with_the_readings_between(lab_a100) -> None:
    async def scenario() -> tuple[list[float], list[dict[str, Any]], dict[str, Any]]:
        conn = await connect(lab_a100, f"{NEWEST_ONLY}&every=2")
        times, frames = [], []
        try:
            for _ in range(5):
                frames.append(await next_frame(conn))
                times.append(time.monotonic())
        finally:
            conn.close()
        since = frames[0]["latest"]["timestamp"]
        return times, frames, await get(lab_a100, f"jupyter-gpu/api/metrics?since={since!r}")

    times, frames, polled = asyncio.run(scenario())
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert len(gaps) == 4 and all(1.4 <= gap <= 3.5 for gap in gaps), gaps
    pushed = frames[1:]
    # The server samples every 0.5 s: each frame carries the readings of the last ~2 s, usually 4 (or 5) in all.
    assert all(len(frame["history"]) >= 2 for frame in pushed), [len(frame["history"]) for frame in pushed]
    sent = [stamp for frame in pushed for stamp in stamps(frame)]
    assert sent == sorted(set(sent))
    assert_no_reading_lost(stamps(polled), frames[0]["latest"]["timestamp"], sent)


@pytest.mark.parametrize("token", [None, "wrong"])
def test_the_stream_is_refused_without_or_with_a_wrong_token(lab_a100, token: str | None) -> None:
    async def scenario() -> tuple[int, dict[str, Any]]:
        with pytest.raises(HTTPClientError) as refused:
            await connect(lab_a100, token=token)
        conn = await connect(lab_a100, NEWEST_ONLY)  # the same socket with the server's token opens
        try:
            return refused.value.code, await next_frame(conn)
        finally:
            conn.close()

    code, frame = asyncio.run(scenario())
    assert code == 403
    assert frame["latest"] is not None


def test_a_page_of_another_origin_cannot_open_the_stream_with_the_users_login_cookie(lab_a100) -> None:
    # A browser sends the login cookie with any page's WebSocket: the server's origin check is what stops another
    # site from reading the user's GPUs (token-authenticated clients are not browsers, so they are not checked).
    login = lab_a100.request("jupyter-gpu/api/status")
    cookie = login.headers["Set-Cookie"].split(";", 1)[0]
    url = lab_a100.base.replace("http://", "ws://", 1) + STREAM + "?" + NEWEST_ONLY
    own_origin = lab_a100.base.split("/user/")[0]

    async def scenario() -> tuple[int, dict[str, Any]]:
        with pytest.raises(HTTPClientError) as refused:
            await websocket_connect(HTTPRequest(url, headers={"Cookie": cookie, "Origin": "http://evil.example"}))
        conn = await websocket_connect(HTTPRequest(url, headers={"Cookie": cookie, "Origin": own_origin}))
        try:
            return refused.value.code, await next_frame(conn)
        finally:
            conn.close()

    code, frame = asyncio.run(scenario())
    assert code == 403 and frame["latest"] is not None


@pytest.mark.parametrize(("query", "words"), [("since=yesterday", "'since' must be a Unix time in seconds"),
                                               ("since=nan", "'since' must be a Unix time in seconds"),
                                               ("every=soon", "'every' must be a number of seconds"),
                                               ("every=inf", "'every' must be a number of seconds")])
def test_a_bad_since_or_every_is_a_400_with_a_sentence_in_the_log(lab_a100, query: str, words: str) -> None:
    offset = lab_a100.log.stat().st_size

    async def scenario() -> HTTPClientError:
        with pytest.raises(HTTPClientError) as refused:
            await connect(lab_a100, query)
        return refused.value

    error = asyncio.run(scenario())
    assert error.code == 400
    deadline = time.monotonic() + 10
    while words not in (logged := log_since(lab_a100, offset)):
        assert time.monotonic() < deadline, f"the server's log never said {words!r}:\n{logged[-3000:]}"
        time.sleep(0.1)
    line = next(line for line in logged.splitlines() if words in line)
    assert "400" in line and STREAM in line, line


def test_twenty_sockets_each_get_the_next_reading_from_one_sampler_thread(lab_a100) -> None:
    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
        conns = await asyncio.gather(*(connect(lab_a100, NEWEST_ONLY) for _ in range(20)))
        try:
            firsts = await asyncio.gather(*(next_frame(conn) for conn in conns))
            seconds = await asyncio.gather(*(next_frame(conn) for conn in conns))
            status = await get(lab_a100, "jupyter-gpu/api/status")  # while all twenty are open
        finally:
            for conn in conns:
                conn.close()
        oldest = min(first["latest"]["timestamp"] for first in firsts)
        return firsts, seconds, status, await get(lab_a100, f"jupyter-gpu/api/metrics?since={oldest!r}")

    firsts, seconds, status, polled = asyncio.run(scenario())
    assert len(firsts) == len(seconds) == 20
    assert status["sampler_threads"] == 1
    for first, second in zip(firsts, seconds, strict=True):
        # Each socket's second frame is the reading after the one its first frame had (or the few since, if the
        # event loop was slow): nothing skipped, nothing sent twice.
        assert_no_reading_lost(stamps(polled), first["latest"]["timestamp"], stamps(second))


def test_a_socket_closed_by_its_client_leaves_the_others_streaming_and_no_traceback(lab_a100) -> None:
    offset = lab_a100.log.stat().st_size

    async def scenario() -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
        stays, closes, drops = [await connect(lab_a100, NEWEST_ONLY) for _ in range(3)]
        try:
            first = await next_frame(stays)
            await next_frame(closes)
            await next_frame(drops)
            closes.close(1000, "tab closed")  # with the close handshake, as a closed tab's socket
            drops.protocol.stream.close()  # without it, as a tab whose network went away
            frames = [await next_frame(stays) for _ in range(4)]
        finally:
            stays.close()
        since = first["latest"]["timestamp"]
        return first, frames, await get(lab_a100, f"jupyter-gpu/api/metrics?since={since!r}")

    first, frames, polled = asyncio.run(scenario())
    assert_no_reading_lost(stamps(polled), first["latest"]["timestamp"], [s for f in frames for s in stamps(f)])
    time.sleep(1.0)  # a reading or two more after the last socket closed, pushed to nobody
    logged = log_since(lab_a100, offset)
    for word in ("Traceback", "WebSocketClosedError", "StreamClosedError"):
        assert word not in logged, logged[-3000:]


def test_an_open_stream_does_not_keep_the_server_from_being_culled(lab_a100) -> None:
    before = lab_a100.request("api/status").json()["last_activity"]

    async def scenario() -> list[dict[str, Any]]:
        conn = await connect(lab_a100, NEWEST_ONLY)
        try:
            return [await next_frame(conn) for _ in range(6)]  # ~2.5 s of readings at the server's 0.5 s
        finally:
            conn.close()

    frames = asyncio.run(scenario())
    assert len({frame["latest"]["timestamp"] for frame in frames}) == 6
    assert lab_a100.request("api/status").json()["last_activity"] == before


def test_every_socket_is_closed_with_going_away_when_the_server_stops(tmp_path: Path) -> None:
    server = start_lab_server(tmp_path, "a100x8-mig")
    try:
        async def scenario() -> tuple[dict[str, Any], list[str], int | None, str | None]:
            conn = await connect(server, NEWEST_ONLY)
            first = await next_frame(conn)
            stopping = asyncio.ensure_future(asyncio.to_thread(server.stop))
            after: list[str] = []
            while (message := await asyncio.wait_for(conn.read_message(), 30)) is not None:
                after.append(message)
            await stopping
            return first, after, conn.close_code, conn.close_reason

        first, after, code, reason = asyncio.run(scenario())
    finally:
        server.stop()
    assert first["latest"] is not None
    assert code == 1001, (code, reason, server.log.read_text()[-3000:])
    assert reason == "The Jupyter server is stopping."
    assert all(json.loads(message)["latest"] is not None for message in after)  # readings until then, nothing else


class Peer:
    """A socket as the stream sees it. tornado's `write_message` returns a future that is done once the frame is
    handed to the kernel's socket buffer; for a tab that stopped reading (the buffer full) it stays pending. A real
    stalled peer takes megabytes of unread frames to reach that state, so it is stood in for here."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.stalled = False
        self.pending: list[asyncio.Future[None]] = []
        self.close_code: int | None = None

    def close(self, code: int, reason: str) -> None:
        self.close_code = code

    def write_message(self, body: str) -> asyncio.Future[None]:
        self.frames.append(json.loads(body))
        written = asyncio.get_running_loop().create_future()
        if self.stalled:
            self.pending.append(written)
        else:
            written.set_result(None)
        return written


def test_a_stalled_socket_is_skipped_and_its_next_frame_carries_what_it_missed() -> None:
    from jupyter_gpu.metrics.backends.simulated import SimulatedBackend
    from jupyter_gpu.metrics.hub import SamplerHub
    from jupyter_gpu.server.monitor import GpuMonitor
    from jupyter_gpu.server.stream import MetricsStream

    async def scenario() -> None:
        clock = itertools.count(1_000)
        backend = SimulatedBackend("h200", clock=lambda: float(next(clock)))
        monitor = GpuMonitor(SamplerHub(lambda: backend))  # type: ignore[arg-type]
        monitor.start(thread=False)
        stream = MetricsStream(monitor)

        async def reading() -> float:
            stamp = monitor.read_now().timestamp
            await asyncio.sleep(0)  # the sampler's listener hands the push to this loop
            return stamp

        first = await reading()
        quick, slow = Peer(), Peer()
        stream.open(quick, None, 0.0)  # type: ignore[arg-type]
        stream.open(slow, None, 0.0)  # type: ignore[arg-type]
        slow.stalled = True
        r2, r3, r4 = [await reading() for _ in range(3)]
        assert [stamps(f) for f in quick.frames] == [[first], [r2], [r3], [r4]]
        # The stalled one got r2 (still being written), then nothing while that write was pending.
        assert [stamps(f) for f in slow.frames] == [[first], [r2]] and stream.skipped_stalled == 2
        slow.pending.pop().set_result(None)  # the tab reads again
        r5 = await reading()
        assert stamps(slow.frames[-1]) == [r3, r4, r5]  # nothing lost, in one frame
        assert stream.subscribers == 2
        stream.shut()
        assert quick.close_code == slow.close_code == 1001 and stream.subscribers == 0
        monitor.close()

    asyncio.run(scenario())
