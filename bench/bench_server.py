"""Load on the side panel's server API: 50 clients polling one Jupyter server every second for a minute.

Ours (one sampler thread, whatever the number of clients) side by side with nvdashboard's design (one sampling
loop per client), on loopback.

Every server is a real `jupyter_server` (the jupyterlab install's, all its extensions loaded) started in its
own process with `JUPYTER_GPU_BACKEND=simulated:a100x8-mig` (eight simulated A100s, two split with MIG), so
the same work is done on a machine without a GPU. Two server kinds get the same load:

- ours: the jupyter-gpu extension, `GET /jupyter-gpu/api/metrics`. One sampler thread reads the backend once a
  second (`--JupyterGpu.interval=1`) and encodes each sample once; a request only joins strings. A client
  asks once without `since` (the whole history), then every second with `?since=<latest timestamp it has>`,
  as the side panel does.
- per-client: nvdashboard's design, where each websocket has its own 1 s `PeriodicCallback` sweeping NVML on
  the event loop thread. nvdashboard is not installed and needs a GPU, so `bench/per_client_sampling_ext.py`
  does that per-tick work per poll: `GET /bench-per-client/metrics` reads the same simulated backend on the
  loop and returns `json.dumps(sample.to_dict())`; the jupyter-gpu extension is disabled in that server, so
  it pays for no sampler of ours. N clients make N backend reads a second. The emulation flatters the
  baseline (one shared backend, one sample per reply, no bokeh document diffing), and with a real GPU each
  NVML sweep of eight GPUs costs more than the simulated read, whose cost is measured here in-process (the
  mean of 100 reads, and of 100 encodings) so the per-client figures can be checked by arithmetic.

The clients run in this process, a separate one from the server, on one asyncio loop: each holds a keep-alive
HTTP/1.1 connection (as a browser tab does) spoken over raw asyncio streams, far lighter than a full HTTP
client, so the client is not the bottleneck: its CPU, JSON parsing included, is printed to show it (a few % of
a core for 50 polls a second). Latency is from writing the request to having read the whole reply, for every
poll after a client's first (the first, a full-history reply, is reported apart). Two load shapes:

- staggered: each client's start is drawn uniformly over the first second (seeded), then it polls on its own
  1 s grid, as independent browser tabs do;
- burst: all clients fire at the same instant every second, the worst case for a single-threaded server (the
  last request in waits for the 49 before it); the spread of the write times within a tick is printed.

A third run, `push`, is what the side panel does now: each client opens the push stream
(`/jupyter-gpu/api/metrics/stream`, a WebSocket, over tornado's client) once, over the first second, and the server
writes it every reading. A frame's latency is from the reading (the sampler's timestamp; both processes share the
clock) to its arrival here; the spread of a reading's fifty arrivals is printed.

Clients parse a reply `PARSE_AFTER_S` after stamping it, not at once: the fifty share this process's one thread, and
parsing a reply at once would put the parse on the clock of every reply still arriving (a burst's p99 read 29 ms
instead of 23 ms, back to back on the same server; each browser tab parses in its own process). `--parse-at-once`
measures the old way.

Each (shape, server) run gets a fresh server: it idles `--idle-seconds` first (the server's CPU with no client,
the sampler's own cost included), then takes the load for `--seconds`. The server's CPU is read from
`/proc/<pid>/stat` (utime + stime, all threads, over the load window) as % of one core; the event loop's own
thread (the main thread) is read from `/proc/<pid>/task/<pid>/stat`. `sampler_threads` (threads named
`jupyter-gpu-sampler` in the server) is read from the status endpoint before, during and after the load, and
the backend reads actually made in the window are counted (ours: samples in the server's history; per-client:
its read counter). Runs are interleaved server by server, and `--rounds` splits `--seconds` over rounds
whose order rotates, pooled at the end.

Both servers also load `bench/gc_probe_ext.py`, which times the garbage collector's pauses during the load: a
full collection of a JupyterLab server's ~200,000 objects stops its event loop for ~100 ms, so in a burst the
p99 and max mostly say whether one landed on a burst, whichever the server kind; the probe tells them apart.

    .venv/bin/python bench/bench_server.py [--seconds 60] [--clients 50] [--rounds 1] [--idle-seconds 10]
                                           [--no-burst] [--no-push] [--parse-at-once] [--seed 1] [--json FILE]
                                           [--quick]

The defaults take about five minutes on a 2-core machine; `--quick` is a 10 s smoke run of each.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import random
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketError, websocket_connect

from jupyter_gpu.metrics.backends.base import BACKEND_ENV
from jupyter_gpu.metrics.backends.select import select_backend
from jupyter_gpu.server.config import JupyterGpu

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))  # the servers' bench extensions, imported here only for their constants
from gc_probe_ext import PATH as GC_PROBE  # noqa: E402
from per_client_sampling_ext import PREFIX, SPEC  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
INTERVAL_S = 1.0  # the clients' poll period and the server sampler's interval
REQUEST_TIMEOUT_S = 10.0
START_TIMEOUT_S = 60.0
SETTLE_S = 1.0  # after the server answers: the first samples and the extensions' start-up work are one-off
HISTORY: int = JupyterGpu.class_traits()["history"].default_value  # the most samples a first poll of ours gets


@dataclass(frozen=True)
class Kind:
    name: str
    label: str
    metrics: str
    status: str
    incremental: bool  # polls with ?since=
    args: tuple[str, ...]
    stream: str | None = None  # the WebSocket its clients listen on instead of polling


OURS_ARGS = (f"--JupyterGpu.interval={INTERVAL_S:g}", "--ServerApp.jpserver_extensions={'gc_probe_ext': True}")


# Extensions named on the command line are added to those the install's config enables (jupyter_gpu among them).
KINDS: tuple[Kind, ...] = (
    Kind("ours", "jupyter-gpu: one sampler thread, pre-encoded JSON", "/jupyter-gpu/api/metrics",
         "/jupyter-gpu/api/status", True, OURS_ARGS),
    Kind("per-client", "nvdashboard's design: a backend read per client tick, on the event loop",
         f"/{PREFIX}/metrics", f"/{PREFIX}/status", False,
         ("--ServerApp.jpserver_extensions="
          "{'per_client_sampling_ext': True, 'jupyter_gpu': False, 'gc_probe_ext': True}",)),
)
PUSHED = Kind("ours-push", "jupyter-gpu's push stream: each reading sent once to every open WebSocket, as the "
              "side panel listens", "/jupyter-gpu/api/metrics", "/jupyter-gpu/api/status", True, OURS_ARGS,
              stream="/jupyter-gpu/api/metrics/stream")
MODES = ("staggered", "burst")
PUSH = "push"  # the push stream's shape: clients connect over the first second, the server sends every reading
# A client parses a reply this long after stamping it: fifty clients share this process's one thread, and a
# parse on it would delay the stamps of the replies still arriving (each browser tab parses in its own process).
# --parse-at-once sets it to None: each reply parsed as soon as it is read, as this bench did before.
PARSE_AFTER_S: float | None = 0.25


# -- the backend's own cost, in this process -----------------------------------------------------------------


@dataclass(frozen=True)
class BackendCost:
    read_s: float  # one read of the eight simulated GPUs
    encode_s: float  # json.dumps(sample.to_dict()): the baseline pays both per poll, ours once a second
    sample_bytes: int  # one encoded sample, as ours keeps each in its history


def backend_cost(number: int = 100, repeat: int = 5) -> BackendCost:
    """The mean of `number` reads and encodings in this process, the median over `repeat` tries."""
    backend = select_backend(SPEC)
    sample = backend.read()  # the first read fills the backend's caches, as the server's first one does
    read = statistics.median(timeit.repeat(backend.read, number=number, repeat=repeat)) / number
    encode = statistics.median(timeit.repeat(lambda: json.dumps(sample.to_dict()), number=number,
                                             repeat=repeat)) / number
    backend.close()
    return BackendCost(read, encode, len(json.dumps(sample.to_dict())))


# -- the server process --------------------------------------------------------------------------------------


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """utime + stime of a process (all its threads) or of one of its threads, in seconds."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    # The command name, in parentheses, may hold spaces: split after its closing one. Fields 14 and 15 of
    # proc(5) are then at 11 and 12.
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy_seconds() -> float:
    """CPU seconds every process on the machine has used (all cores), from the first line of /proc/stat."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def os_threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no Threads line")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """One jupyter_server process of a kind; `start()` returns once its metrics endpoint answers with data."""

    def __init__(self, kind: Kind, workdir: Path) -> None:
        self.kind = kind
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.workdir = workdir
        self.log_path = workdir / f"server-{kind.name}-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        root = self.workdir / "root"
        root.mkdir(exist_ok=True)
        env = {
            **os.environ,
            BACKEND_ENV: SPEC,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(BENCH_DIR), os.environ.get("PYTHONPATH")])),
            # A user's own jupyter_server_config must not change what is measured; the install's (in the venv,
            # which enables jupyter-gpu) still applies.
            "JUPYTER_CONFIG_DIR": str(self.workdir / "config"),
            "JUPYTER_RUNTIME_DIR": str(self.workdir / "runtime"),
        }
        command = [sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root", "--ip=127.0.0.1",
                   f"--port={self.port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
                   f"--ServerApp.root_dir={root}", *self.kind.args]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"The {self.kind.name} server exited ({self.proc.returncode}):\n{self.log_tail()}")
            if self._has_data():
                return
            time.sleep(0.2)
        raise RuntimeError(f"The {self.kind.name} server did not answer in {START_TIMEOUT_S:g} s:\n{self.log_tail()}")

    def _has_data(self) -> bool:
        try:
            status, body = self.get_sync(self.kind.status)
        except OSError:
            return False
        # Ours answers before its first reading; a status of "ok" means the sampler has run.
        return status == 200 and (not self.kind.incremental or json.loads(body).get("status") == "ok")

    def get_sync(self, path: str) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT_S)
        try:
            connection.request("GET", path, headers={"Authorization": f"token {self.token}"})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextmanager
def running(kind: Kind, workdir: Path) -> Iterator[Server]:
    server = Server(kind, workdir)
    try:
        server.start()
        yield server
    finally:
        server.stop()  # always, even when start() failed half-way


# -- the clients ---------------------------------------------------------------------------------------------


class HttpError(Exception):
    pass


class Connection:
    """One keep-alive HTTP/1.1 connection over asyncio streams: just enough HTTP for tornado's replies."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.headers = f"Host: 127.0.0.1:{port}\r\nAuthorization: token {token}\r\n\r\n".encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def get(self, path: str) -> tuple[int, bytes]:
        try:
            return await asyncio.wait_for(self._get(path), REQUEST_TIMEOUT_S)
        except BaseException:
            self.close()  # a half-read reply would poison the next request on this connection
            raise

    async def _get(self, path: str) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        self.writer.write(b"GET " + path.encode() + b" HTTP/1.1\r\n" + self.headers)
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split()[1])
        fields = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in head[1:])}
        if "content-length" not in fields:
            raise HttpError(f"no Content-Length in the reply to {path}")  # tornado always sends one here
        body = await self.reader.readexactly(int(fields["content-length"]))
        if fields.get("connection", "").lower() == "close":
            self.close()
        return status, body

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


@dataclass
class Load:
    """What the clients saw in one or more runs of one (shape, server) pair."""

    latencies: list[float] = field(default_factory=list)  # seconds, every poll after a client's first
    first_latencies: list[float] = field(default_factory=list)
    reply_bytes: list[int] = field(default_factory=list)
    first_bytes: list[int] = field(default_factory=list)
    history_samples: list[int] = field(default_factory=list)  # samples in each incremental reply's history
    errors: Counter[str] = field(default_factory=Counter)
    skipped: int = 0  # ticks a client let pass because its previous poll was still out
    issued: dict[int, list[float]] = field(default_factory=dict)  # tick -> write times, for the burst spread

    @property
    def polls(self) -> int:
        return len(self.latencies) + len(self.first_latencies) + sum(self.errors.values())


async def client(conn: Connection, kind: Kind, start: float, ticks: int, load: Load) -> None:
    """One panel: a full first request, then one poll a second on its own grid, starting at `start`."""
    loop = asyncio.get_running_loop()
    since: float | None = None
    try:
        for tick in range(ticks):
            due = start + tick * INTERVAL_S
            delay = due - loop.time()
            if delay < -INTERVAL_S:
                load.skipped += 1  # the last reply came more than a period late; as a panel, do not pile up
                continue
            if delay > 0:
                await asyncio.sleep(delay)
            path = kind.metrics if since is None or not kind.incremental else f"{kind.metrics}?since={since!r}"
            since = await poll(conn, path, kind, tick, since is None, load) or since
    finally:
        conn.close()


async def poll(conn: Connection, path: str, kind: Kind, tick: int, first: bool, load: Load) -> float | None:
    """One request, recorded; returns the latest sample's timestamp, which the next poll asks after."""
    started = time.perf_counter()
    load.issued.setdefault(tick, []).append(started)
    try:
        status, body = await conn.get(path)
    except (TimeoutError, OSError, asyncio.IncompleteReadError, HttpError, ValueError) as exc:
        load.errors[type(exc).__name__] += 1
        return None
    elapsed = time.perf_counter() - started
    if status != 200:
        load.errors[f"HTTP {status}"] += 1
        return None
    # Parsed as the panel would, but later: not on the clock of the replies still arriving.
    if PARSE_AFTER_S is not None:
        await asyncio.sleep(PARSE_AFTER_S)
    try:
        data = json.loads(body)
        latest = data if not kind.incremental else data["latest"]
        stamp = float(latest["timestamp"]) if latest else None
        history = len(data["history"]) if kind.incremental else 0
    except (ValueError, KeyError, TypeError):
        load.errors["bad reply"] += 1
        return None
    (load.first_latencies if first else load.latencies).append(elapsed)
    (load.first_bytes if first else load.reply_bytes).append(len(body))
    if kind.incremental and not first:
        load.history_samples.append(history)
    return stamp


async def listener(server: Server, start: float, ticks: int, load: Load) -> None:
    """One panel on the push stream: connects at `start`, then takes every frame the server sends for `ticks`
    periods. A frame's latency is from the reading (the sampler's timestamp) to its arrival here, wall clock: the
    two processes share the machine's clock."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start - loop.time()))
    assert server.kind.stream is not None
    request = HTTPRequest(f"ws://127.0.0.1:{server.port}{server.kind.stream}",
                          headers={"Authorization": f"token {server.token}"}, connect_timeout=REQUEST_TIMEOUT_S,
                          request_timeout=REQUEST_TIMEOUT_S)
    opened = time.perf_counter()
    try:
        conn = await websocket_connect(request)
    except (OSError, HTTPClientError, WebSocketError) as exc:
        load.errors[type(exc).__name__] += 1
        return
    stop = loop.call_at(start + ticks * INTERVAL_S, conn.close)  # read_message() then returns None
    parses: list[asyncio.Task[None]] = []
    try:
        while (message := await conn.read_message()) is not None:
            arrived, arrived_perf = time.time(), time.perf_counter()
            parses.append(asyncio.create_task(frame(message, arrived, arrived_perf, opened, not parses, load)))
    finally:
        stop.cancel()
        conn.close()
    await asyncio.gather(*parses)
    if conn.close_code not in (None, 1000, 1005):  # 1005: closed by this client, no status
        load.errors[f"closed {conn.close_code}"] += 1


async def frame(message: str | bytes, arrived: float, arrived_perf: float, opened: float, first: bool,
                load: Load) -> None:
    """One pushed frame, recorded later (see PARSE_AFTER_S)."""
    if PARSE_AFTER_S is not None:
        await asyncio.sleep(PARSE_AFTER_S)
    try:
        data = json.loads(message)
        stamp = float(data["latest"]["timestamp"])
        history = len(data["history"])
    except (ValueError, KeyError, TypeError):
        load.errors["bad reply"] += 1
        return
    if first:  # everything kept so far, from connecting to having it
        load.first_latencies.append(arrived_perf - opened)
        load.first_bytes.append(len(message))
        return
    load.latencies.append(arrived - stamp)
    load.reply_bytes.append(len(message))
    load.history_samples.append(history)
    load.issued.setdefault(round(stamp * 1e3), []).append(arrived_perf)  # one reading's arrivals, for its spread


# -- one run: a fresh server, an idle window, then the load --------------------------------------------------


@dataclass
class Run:
    """One (shape, server) pair; with several rounds, the load windows' figures are summed."""

    mode: str
    kind: Kind
    load: Load = field(default_factory=Load)
    wall: float = 0.0
    server_cpu: float = 0.0
    loop_cpu: float = 0.0
    client_cpu: float = 0.0
    machine_cpu: float = 0.0  # every process on the machine, these two included
    idle_wall: float = 0.0
    idle_cpu: float = 0.0
    reads: int = 0
    sampler_threads: dict[str, list[int]] = field(default_factory=lambda: {"before": [], "during": [], "after": []})
    os_threads: dict[str, list[int]] = field(default_factory=lambda: {"before": [], "during": [], "after": []})
    # The server's garbage collections during the load, per generation (see gc_probe_ext).
    gc_collections: list[int] = field(default_factory=lambda: [0, 0, 0])
    gc_pause_ms: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    gc_longest_ms: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    tracked_objects: int = 0

    def percent(self, cpu: float, wall: float | None = None) -> float:
        return 100 * cpu / (wall if wall is not None else self.wall)


async def get_json(server: Server, path: str) -> Any:
    """A one-off request on its own connection, outside the clients' figures."""
    conn = Connection(server.port, server.token)
    try:
        code, body = await conn.get(path)
    finally:
        conn.close()
    if code != 200:
        raise RuntimeError(f"{path} answered {code}")
    return json.loads(body)


async def status(server: Server, run: Run, when: str) -> dict[str, Any]:
    data = await get_json(server, server.kind.status)
    run.sampler_threads[when].append(data["sampler_threads"])
    run.os_threads[when].append(os_threads(server.pid))
    return data


async def samples_since(server: Server, since: float, until: float) -> int:
    """Readings ours made in a window: its history holds every one, stamped by the sampler."""
    data = await get_json(server, f"{server.kind.metrics}?since={since!r}")
    return sum(1 for sample in data["history"] if sample["timestamp"] <= until)


def add_gc(run: Run, probe: dict[str, Any]) -> None:
    for generation, count in enumerate(probe["collections"]):
        run.gc_collections[generation] += count
        run.gc_pause_ms[generation] += probe["pause_ms"][generation]
        run.gc_longest_ms[generation] = max(run.gc_longest_ms[generation], probe["longest_ms"][generation])


async def idle_window(server: Server, run: Run, idle_s: float) -> None:
    """The server's CPU with no client: the event loop's housekeeping and, for ours, the sampler's 1 Hz work."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(SETTLE_S)
    cpu, started = cpu_seconds(server.pid), loop.time()
    await asyncio.sleep(idle_s)
    run.idle_cpu += cpu_seconds(server.pid) - cpu
    run.idle_wall += loop.time() - started


async def measure(server: Server, run: Run, clients: int, seconds: float, idle_s: float, rng: random.Random) -> None:
    loop = asyncio.get_running_loop()
    pid = server.pid
    await idle_window(server, run, idle_s)
    before = await status(server, run, "before")
    run.tracked_objects = max(run.tracked_objects, (await get_json(server, f"/{GC_PROBE}?reset=1"))["tracked_objects"])

    ticks = max(2, round(seconds / INTERVAL_S))
    t0 = loop.time() + 0.05  # every client is created before the first is due
    offsets = [rng.random() * INTERVAL_S if run.mode in ("staggered", PUSH) else 0.0 for _ in range(clients)]
    load = Load()
    tasks = [asyncio.create_task(listener(server, t0 + offset, ticks, load) if server.kind.stream else
                                 client(Connection(server.port, server.token), server.kind, t0 + offset, ticks, load))
             for offset in offsets]
    wall0, cpu0, loop0, client0 = time.time(), cpu_seconds(pid), cpu_seconds(pid, pid), time.process_time()
    busy0 = machine_busy_seconds()
    started = loop.time()

    async def midway() -> None:
        await asyncio.sleep(t0 + ticks * INTERVAL_S / 2 - loop.time())
        await status(server, run, "during")

    await asyncio.gather(midway(), *tasks)
    # The window is whole periods: every client polls once in each, whatever the shape (a burst's last replies
    # are in long before its period ends), so CPU and requests/s are per second of the load as offered.
    await asyncio.sleep(t0 + ticks * INTERVAL_S - loop.time())
    run.wall += loop.time() - started
    run.server_cpu += cpu_seconds(pid) - cpu0
    run.loop_cpu += cpu_seconds(pid, pid) - loop0
    run.client_cpu += time.process_time() - client0
    # Whatever else ran meanwhile (another test run, a browser) competes for the same cores: it is printed, as
    # it is what makes a tail noisy on a small machine.
    run.machine_cpu += machine_busy_seconds() - busy0
    wall1 = time.time()
    add_gc(run, await get_json(server, f"/{GC_PROBE}"))

    await asyncio.sleep(SETTLE_S)
    after = await status(server, run, "after")
    if server.kind.incremental:
        run.reads += await samples_since(server, wall0, wall1)
    else:
        run.reads += after["reads"] - before["reads"]
    merge(run.load, load, offset=len(run.load.issued))


def merge(into: Load, new: Load, offset: int) -> None:
    into.latencies += new.latencies
    into.first_latencies += new.first_latencies
    into.reply_bytes += new.reply_bytes
    into.first_bytes += new.first_bytes
    into.history_samples += new.history_samples
    into.errors.update(new.errors)
    into.skipped += new.skipped
    into.issued.update({offset + tick: times for tick, times in new.issued.items()})


def run_all(args: argparse.Namespace) -> dict[tuple[str, str], Run]:
    modes = [mode for mode in MODES if mode != "burst" or not args.no_burst]
    pairs = [(mode, kind) for mode in modes for kind in KINDS] + ([] if args.no_push else [(PUSH, PUSHED)])
    runs = {(mode, kind.name): Run(mode, kind) for mode, kind in pairs}
    rng = random.Random(args.seed)
    seconds = args.seconds / args.rounds
    with tempfile.TemporaryDirectory(prefix="bench-server-") as tmp:
        for index in range(args.rounds):
            shift = index % len(pairs)
            for mode, kind in pairs[shift:] + pairs[:shift]:
                run = runs[(mode, kind.name)]
                print(f"  round {index + 1}/{args.rounds}: {mode:9s} {kind.name:10s} ", end="", flush=True)
                with running(kind, Path(tmp)) as server:
                    asyncio.run(measure(server, run, args.clients, seconds, args.idle_seconds, rng))
                print(progress(run))
    return runs


# -- report --------------------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def figures(run: Run) -> dict[str, Any]:
    load = run.load
    ms = [1e3 * value for value in load.latencies]
    spreads = [max(times) - min(times) for times in load.issued.values() if len(times) > 1]
    return {
        "mode": run.mode,
        "server": run.kind.name,
        "polls": load.polls,
        "errors": sum(load.errors.values()),
        "error_kinds": dict(load.errors),
        "skipped_ticks": load.skipped,
        "p50_ms": percentile(ms, 0.50),
        "p90_ms": percentile(ms, 0.90),
        "p99_ms": percentile(ms, 0.99),
        "max_ms": max(ms, default=float("nan")),
        "first_poll_p50_ms": 1e3 * percentile(load.first_latencies, 0.5),
        "first_poll_max_ms": 1e3 * max(load.first_latencies, default=float("nan")),
        "requests_per_s": load.polls / run.wall,
        "server_cpu_pct": run.percent(run.server_cpu),
        "event_loop_cpu_pct": run.percent(run.loop_cpu),
        "idle_cpu_pct": run.percent(run.idle_cpu, run.idle_wall),
        # What the load adds, per poll: the server's CPU above its idle rate.
        "cpu_ms_per_poll": 1e3 * (run.server_cpu - run.idle_cpu / run.idle_wall * run.wall) / max(1, load.polls),
        "client_cpu_pct": run.percent(run.client_cpu),
        # /proc/stat and the per-process figures are sampled apart, so an idle machine can come out a hair below 0.
        "other_processes_cpu_pct": max(0.0, run.percent(run.machine_cpu - run.server_cpu - run.client_cpu)),
        "reply_bytes": statistics.mean(load.reply_bytes) if load.reply_bytes else float("nan"),
        "first_reply_bytes": statistics.mean(load.first_bytes) if load.first_bytes else float("nan"),
        "history_samples_per_poll": statistics.mean(load.history_samples) if load.history_samples else None,
        "backend_reads_per_s": run.reads / run.wall,
        "sampler_threads": {when: values for when, values in run.sampler_threads.items()},
        "os_threads": {when: values for when, values in run.os_threads.items()},
        # burst: the spread of a tick's request writes; push: of a reading's arrivals at the clients
        "burst_spread_ms_median": 1e3 * statistics.median(spreads) if spreads and run.mode != "staggered" else None,
        "burst_spread_ms_max": 1e3 * max(spreads) if spreads and run.mode != "staggered" else None,
        "load_seconds": run.wall,
        "gc_collections": run.gc_collections,
        "gc_pause_ms": run.gc_pause_ms,
        "gc_longest_ms": run.gc_longest_ms,
        "gc_tracked_objects": run.tracked_objects,
    }


def progress(run: Run) -> str:
    f = figures(run)
    return (f"{f['polls']} polls, {f['errors']} errors, p50 {f['p50_ms']:.2f} ms, p99 {f['p99_ms']:.2f} ms, "
            f"server {f['server_cpu_pct']:.1f}% (idle {f['idle_cpu_pct']:.2f}%), client {f['client_cpu_pct']:.1f}%, "
            f"other processes {f['other_processes_cpu_pct']:.1f}%")


def threads_text(values: dict[str, list[int]]) -> str:
    return "/".join(",".join(str(v) for v in sorted(set(values[when]))) for when in ("before", "during", "after"))


def report(runs: dict[tuple[str, str], Run], args: argparse.Namespace, cost: BackendCost,
           elapsed: float) -> dict[str, Any]:
    rows = {key: figures(run) for key, run in runs.items()}
    print(f"\n{args.clients} clients polling every {INTERVAL_S:g} s against one jupyter_server on loopback, "
          f"{SPEC}, {args.seconds:g} s of load per run over {args.rounds} round(s), {os.cpu_count()} CPUs, "
          f"{elapsed:.0f} s in all")
    print(f"in-process, mean of 100: one backend read of 8 simulated GPUs {cost.read_s * 1e6:.0f} µs, "
          f"json.dumps(sample.to_dict()) {cost.encode_s * 1e6:.0f} µs (the per-client baseline pays both per poll)")
    # The first poll here carries only the samples since the server started; after ten minutes it is the whole
    # history, which is worth knowing when fifty panels open at once.
    full = HISTORY * cost.sample_bytes
    print(f"one encoded sample: {cost.sample_bytes} B; a first poll once ours' history is full ({HISTORY} samples) "
          f"carries about {full / 1e6:.1f} MB, {args.clients} of them {args.clients * full / 1e6:.0f} MB")
    print("staggered: each client's first poll drawn uniformly over the first second "
          f"(seed {args.seed}), then its own 1 s grid; burst: all fire at the same instant each second")
    print("latency: every poll after a client's first, from writing the request to having the reply (the "
          "full-history first poll is reported apart); push: every frame after a client's first, from the reading "
          "(the sampler's timestamp) to having it, which is at least what a poll's figure is; "
          "CPU: % of one core over the load window; others' CPU: the rest of the machine meanwhile")
    for kind in KINDS:
        print(f"{kind.name}: {kind.label}, GET {kind.metrics}")
    if not args.no_push:
        print(f"{PUSHED.name}: {PUSHED.label}, WebSocket {PUSHED.stream}, clients connecting over the first second")
    print()
    print("| shape | server | polls | errors | p50 ms | p90 ms | p99 ms | max ms | req/s | server CPU | event loop "
          "| idle CPU | CPU/poll | reply B | first reply B | reads/s | sampler threads before/during/after "
          "| OS threads | client CPU | others' CPU |")
    print("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|:-:|--:|--:|--:|")
    for (mode, name), f in rows.items():
        print(f"| {mode} | {name} | {f['polls']} | {f['errors']} | {f['p50_ms']:.2f} | {f['p90_ms']:.2f} "
              f"| {f['p99_ms']:.2f} | {f['max_ms']:.2f} | {f['requests_per_s']:.1f} | {f['server_cpu_pct']:.1f}% "
              f"| {f['event_loop_cpu_pct']:.1f}% | {f['idle_cpu_pct']:.2f}% | {f['cpu_ms_per_poll']:.2f} ms "
              f"| {f['reply_bytes']:.0f} | {f['first_reply_bytes']:.0f} | {f['backend_reads_per_s']:.2f} "
              f"| {threads_text(runs[(mode, name)].sampler_threads)} "
              f"| {threads_text(runs[(mode, name)].os_threads)} | {f['client_cpu_pct']:.1f}% "
              f"| {f['other_processes_cpu_pct']:.1f}% |")
    print()
    for (mode, name), f in rows.items():
        extra = []
        if f["history_samples_per_poll"] is not None:
            extra.append(f"{f['history_samples_per_poll']:.2f} history samples per poll")
        if f["burst_spread_ms_median"] is not None and mode == PUSH:
            extra.append(f"the {args.clients} frames of a reading arrived over {f['burst_spread_ms_median']:.2f} ms "
                         f"(median reading), {f['burst_spread_ms_max']:.2f} ms at most")
        elif f["burst_spread_ms_median"] is not None:
            extra.append(f"the {args.clients} writes of a tick spread over {f['burst_spread_ms_median']:.2f} ms "
                         f"(median tick), {f['burst_spread_ms_max']:.2f} ms at most")
        extra.append(f"server GC during the load: {'/'.join(map(str, f['gc_collections']))} collections of "
                     f"generations 0/1/2, {sum(f['gc_pause_ms']):.0f} ms paused, the longest full one "
                     f"{f['gc_longest_ms'][2]:.0f} ms ({f['gc_tracked_objects']} objects tracked)")
        if f["errors"] or f["skipped_ticks"]:
            extra.append(f"errors {f['error_kinds']}, skipped ticks {f['skipped_ticks']}")
        print(f"{mode} {name}: first poll p50 {f['first_poll_p50_ms']:.2f} ms, max {f['first_poll_max_ms']:.2f} ms"
              + "".join(f"; {text}" for text in extra))
    ratios = ratio_table(rows)
    push_note(rows)
    gc_note(rows, args.clients)
    return {
        "config": {"clients": args.clients, "seconds": args.seconds, "rounds": args.rounds,
                   "idle_seconds": args.idle_seconds, "seed": args.seed, "backend": SPEC,
                   "interval_s": INTERVAL_S, "cpus": os.cpu_count()},
        "backend_read_us": cost.read_s * 1e6,
        "sample_encode_us": cost.encode_s * 1e6,
        "sample_bytes": cost.sample_bytes,
        "full_history_first_reply_bytes_estimate": full,
        "runs": [rows[key] for key in rows],
        "ratios": ratios,
    }


def ratio_table(rows: dict[tuple[str, str], dict[str, Any]]) -> dict[str, dict[str, float]]:
    print("\n| shape | p50 ours/per-client | p99 ours/per-client | server CPU ours/per-client "
          "| backend reads/s ours vs per-client |")
    print("|---|--:|--:|--:|--:|")
    ratios = {}
    for mode in dict.fromkeys(mode for mode, _ in rows if mode != PUSH):
        ours, base = rows[(mode, "ours")], rows[(mode, "per-client")]
        ratios[mode] = {key: ours[key] / base[key] for key in ("p50_ms", "p99_ms", "server_cpu_pct")}
        print(f"| {mode} | {ratios[mode]['p50_ms']:.2f} | {ratios[mode]['p99_ms']:.2f} "
              f"| {ratios[mode]['server_cpu_pct']:.2f} "
              f"| {ours['backend_reads_per_s']:.2f} vs {base['backend_reads_per_s']:.2f} |")
    return ratios


def push_note(rows: dict[tuple[str, str], dict[str, Any]]) -> None:
    """The panel's own transport against polling the same server in a burst (all fifty at the same instant)."""
    push, burst = rows.get((PUSH, PUSHED.name)), rows.get(("burst", "ours"))
    if push is None or burst is None:
        return
    print(f"\npush against a burst of polls, ours: p99 {push['p99_ms']:.2f} ms from the reading to every client "
          f"against {burst['p99_ms']:.2f} ms from request to reply ({push['p99_ms'] / burst['p99_ms']:.2f}x), "
          f"server CPU {push['server_cpu_pct']:.1f}% against {burst['server_cpu_pct']:.1f}% "
          f"({push['server_cpu_pct'] / burst['server_cpu_pct']:.2f}x)")


def gc_note(rows: dict[tuple[str, str], dict[str, Any]], clients: int) -> None:
    """Say when the tails are the garbage collector's: a full collection stops either server kind alike."""
    full = [f["gc_longest_ms"][2] for f in rows.values() if f["gc_collections"][2]]
    if not full:
        return
    print(f"\nnote: {len(full)} of {len(rows)} load windows had a full GC in the server, "
          f"{min(full):.0f}-{max(full):.0f} ms each (the GC lines above). In a burst one delays up to all "
          f"{clients} replies of that second, more than 1% of a minute's polls, so a burst's p99 and max say mostly "
          "whether and where one fell; p50 and CPU do not hang on it. Several rounds (--rounds, each a fresh server) "
          "show the spread.")


def check(runs: dict[tuple[str, str], Run]) -> list[str]:
    """What must hold whatever the figures: ours runs one sampler thread reading once a second; no errors."""
    problems = []
    for (mode, name), run in runs.items():
        if name.startswith("ours") and any(v != 1 for values in run.sampler_threads.values() for v in values):
            problems.append(f"{mode}/ours: sampler_threads {run.sampler_threads}, not 1")
        rate = run.reads / run.wall
        if name.startswith("ours") and not 0.9 <= rate * INTERVAL_S <= 1.1:
            problems.append(f"{mode}/ours: {rate:.2f} backend reads/s, not one per interval")
        if run.load.errors:
            problems.append(f"{mode}/{name}: errors {dict(run.load.errors)}")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="load per (shape, server) pair, over the rounds")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds the seconds are split over")
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="idle window before each load")
    parser.add_argument("--no-burst", action="store_true", help="only the staggered shape")
    parser.add_argument("--no-push", action="store_true", help="leave out the push stream's run")
    parser.add_argument("--parse-at-once", action="store_true",
                        help="clients parse each reply as soon as it is read (on the clock of the replies behind it)")
    parser.add_argument("--seed", type=int, default=1, help="for the staggered start times")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 10 s of load, 3 s idle")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.idle_seconds = 10.0, 3.0
    if args.parse_at_once:
        global PARSE_AFTER_S
        PARSE_AFTER_S = None
    if args.clients < 1 or args.rounds < 1 or args.seconds / args.rounds < 2 * INTERVAL_S:
        parser.error("need at least one client, one round and two polls per round")
    started = time.perf_counter()

    cost = backend_cost()
    runs = run_all(args)
    data = report(runs, args, cost, time.perf_counter() - started)
    problems = check(runs)
    if args.json:
        args.json.write_text(json.dumps({**data, "problems": problems}, indent=2) + "\n")
    if problems:
        print("\nPROBLEMS:\n  " + "\n  ".join(problems))
        sys.exit(1)


if __name__ == "__main__":
    main()
