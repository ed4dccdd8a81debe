"""The server extension in a real JupyterLab: authentication, metrics since T, status, Prometheus, attribution."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from jupyter_gpu.server.handlers import ROUTES

ROUTE_PATHS = ["/".join(parts) for parts, _ in ROUTES]


# What a plain GET with the server's token gets: the push stream is a WebSocket, so a request that is not an upgrade is
# a 400 (tests/server/test_stream.py opens it as one).
AUTHENTICATED_GET_STATUS = {"jupyter-gpu/api/metrics/stream": 400}


def test_there_are_the_five_documented_routes() -> None:
    assert ROUTE_PATHS == ["jupyter-gpu/api/metrics", "jupyter-gpu/api/metrics/stream", "jupyter-gpu/api/status",
                           "jupyter-gpu/api/series", "jupyter-gpu/metrics"]


@pytest.mark.parametrize("path", ROUTE_PATHS)
def test_every_route_refuses_a_request_without_or_with_a_wrong_token(lab_a100, path: str) -> None:
    assert lab_a100.request(path, token=None).status == 403
    assert lab_a100.request(path, token="wrong").status == 403
    assert lab_a100.request(path).status == AUTHENTICATED_GET_STATUS.get(path, 200)


def test_every_handler_method_is_decorated_for_authentication() -> None:
    # Jupyter's own gate: with unauthenticated access off, an extension endpoint lacking @web.authenticated
    # raises JupyterServerAuthWarning when it is added. Turned into an error here, in a fresh server process.
    script = """
import warnings
from jupyter_server.serverapp import ServerApp
from jupyter_server.utils import JupyterServerAuthWarning
warnings.simplefilter("error", JupyterServerAuthWarning)
app = ServerApp()
app.initialize(argv=["--ServerApp.allow_unauthenticated_access=False", "--ServerApp.port=0",
                     # only ours: other installed extensions are not this test's business
                     "--ServerApp.jpserver_extensions={'jupyter_gpu': True, 'jupyter_lsp': False, "
                     "'jupyterlab': False, 'notebook_shim': False, 'jupyter_server_terminals': False}",
                     "--ServerApp.reraise_server_extension_failures=True", "--allow-root"])
assert "jupyter_gpu_monitor" in app.web_app.settings  # our handlers were added, under the error filter
print("checked")
"""
    env = {**os.environ, "JUPYTER_GPU_BACKEND": "simulated:h200"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("checked")


def test_metrics_return_the_latest_sample_and_the_history_since_a_time(lab_a100) -> None:
    full = lab_a100.request("jupyter-gpu/api/metrics").json()
    assert full["api_version"] == 1 and full["backend"] == "simulated:a100x8-mig" and full["simulated"] is True
    stamps = [s["timestamp"] for s in full["history"]] + [full["latest"]["timestamp"]]
    assert stamps == sorted(set(stamps))
    assert [d["name"] for d in full["latest"]["devices"]] == ["NVIDIA A100-SXM4-80GB"] * 8
    time.sleep(1.2)
    newer = lab_a100.request(f"jupyter-gpu/api/metrics?since={stamps[-1]!r}").json()
    assert newer["history"] and all(s["timestamp"] > stamps[-1] for s in newer["history"])
    assert newer["latest"]["timestamp"] > newer["history"][-1]["timestamp"]
    # The history is the server's: a client that comes back later (a reopened panel) gets all of it. It is a ring
    # of the last 600 readings, so on a server up for longer than that the oldest may have gone in between: every
    # reading from the first request that the server still keeps comes back, in order.
    again = [s["timestamp"] for s in lab_a100.request("jupyter-gpu/api/metrics").json()["history"]]
    kept = [stamp for stamp in stamps if stamp >= again[0]]
    assert len(kept) >= len(stamps) - 5 and again[: len(kept)] == kept


def test_a_large_history_is_gzipped_for_clients_that_accept_it_and_polls_stay_plain(lab_a100) -> None:
    deadline = time.monotonic() + 30
    while len((plain := lab_a100.request("jupyter-gpu/api/metrics")).body) <= 64 * 1024:
        assert time.monotonic() < deadline, "the history never grew past 64 KiB"  # ~10 readings of 8 GPUs
        time.sleep(0.5)
    zipped = lab_a100.request("jupyter-gpu/api/metrics", headers={"Accept-Encoding": "gzip"})
    assert "Content-Encoding" not in plain.headers
    assert zipped.headers["Content-Encoding"] == "gzip" and len(zipped.body) * 5 < len(plain.body)
    history = json.loads(gzip.decompress(zipped.body))["history"]
    assert len(history) >= len(plain.json()["history"]) - 2
    poll = lab_a100.request(f"jupyter-gpu/api/metrics?since={plain.json()['latest']['timestamp']!r}",
                            headers={"Accept-Encoding": "gzip"})
    assert "Content-Encoding" not in poll.headers and poll.json()["latest"]
    assert "Etag" not in plain.headers and "ETag" not in plain.headers


def test_the_long_chart_series_is_downsampled_with_min_mean_and_max_per_bucket(lab_a100) -> None:
    deadline = time.monotonic() + 20
    while len(lab_a100.request("jupyter-gpu/api/metrics").json()["history"]) < 8:  # 4 s at the server's 0.5 s
        assert time.monotonic() < deadline, "the server kept no readings"
        time.sleep(0.2)
    reply = lab_a100.request("jupyter-gpu/api/series?window=60&points=30")
    assert reply.status == 200
    series = reply.json()
    assert series["points"] == 30 and len(series["t"]) == 30 and series["history_seconds"] == 3600
    assert series["end"] - series["start"] == 60 and series["readings"] >= 8
    by_gpu = {device["index"]: device for device in series["devices"]}
    assert sorted(by_gpu) == list(range(8))
    # The MIG boards (0, 1) report no utilisation: gaps, never 0; the others have every figure in each bucket.
    assert set(by_gpu[0]["utilization"]["mean"]) == {None}
    filled = [b for b, mean in enumerate(by_gpu[2]["utilization"]["mean"]) if mean is not None]
    assert filled and all(by_gpu[2]["utilization"]["min"][b] <= by_gpu[2]["utilization"]["mean"][b]
                          <= by_gpu[2]["utilization"]["max"][b] for b in filled)
    assert all(0 <= value <= 100 for value in by_gpu[5]["memory"]["mean"] if value is not None)
    # Asked again before the next reading: the same reply, made once.
    assert lab_a100.request("jupyter-gpu/api/series?window=60&points=30").json()["end"] >= series["end"]


@pytest.mark.parametrize(("query", "words"), [("window=5", "'window' must be 10 to 3600 seconds"),
                                               ("window=7200", "'window' must be 10 to 3600 seconds"),
                                               ("points=1", "'points' must be a whole number from 2 to 1000"),
                                               ("points=2.5", "'points' must be a whole number"),
                                               ("window=nan", "'window' must be a number")])
def test_a_bad_series_request_is_a_400_with_a_sentence(lab_a100, query: str, words: str) -> None:
    reply = lab_a100.request(f"jupyter-gpu/api/series?{query}")
    assert reply.status == 400 and words in reply.body.decode(), reply.body


def test_a_bad_since_is_a_400_with_a_sentence(lab_a100) -> None:
    for bad in ("yesterday", "nan", "inf"):
        reply = lab_a100.request(f"jupyter-gpu/api/metrics?since={bad}")
        assert reply.status == 400
        assert "'since' must be a Unix time in seconds" in reply.json()["message"]


def test_fifty_clients_share_one_sampler_thread(lab_a100) -> None:
    with ThreadPoolExecutor(max_workers=50) as pool:
        replies = list(pool.map(lambda _: lab_a100.request("jupyter-gpu/api/metrics?since=0"), range(50)))
    assert {r.status for r in replies} == {200}
    status = lab_a100.request("jupyter-gpu/api/status").json()
    assert status["sampler_threads"] == 1
    assert status["available"] is True and len(status["devices"]) == 8 and status["check"] is None


def test_the_polling_panel_does_not_keep_the_server_from_being_culled(lab_a100) -> None:
    before = lab_a100.request("api/status").json()["last_activity"]
    time.sleep(0.05)
    for path in ROUTE_PATHS:
        lab_a100.request(path)
    assert lab_a100.request("api/status").json()["last_activity"] == before


def test_once_started_the_servers_start_up_objects_are_frozen_out_of_full_collections(lab_a100) -> None:
    # What keeps a full garbage collection (~100 ms over JupyterLab's objects) off a burst of polls: the bench's
    # burst p99 is in docs/benchmarks.md. The server says how many it froze, once.
    lab_a100.wait_for_metrics(lambda payload: payload["latest"] is not None)
    lines = [line for line in lab_a100.log.read_text().splitlines() if "start-up objects out of full" in line]
    assert len(lines) == 1, lines
    frozen = int(lines[0].split("froze ")[1].split()[0])
    assert frozen > 50_000, lines[0]


def test_prometheus_exposes_the_same_figures_as_text(lab_a100) -> None:
    reply = lab_a100.request("jupyter-gpu/metrics")
    assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    text = reply.body.decode()
    assert 'jupyter_gpu_up{backend="simulated:a100x8-mig",simulated="true"} 1' in text
    assert text.count("jupyter_gpu_memory_total_bytes{") == 8
    # MIG boards report no utilisation: left out, not 0.
    assert 'jupyter_gpu_utilization_percent{gpu="0"' not in text
    assert 'jupyter_gpu_utilization_percent{gpu="4"' in text


def test_a_notebook_holding_gpu_memory_is_named_with_its_memory_and_idle_time(lab_a100) -> None:
    session = lab_a100.new_notebook("Untitled3.ipynb")
    pid = lab_a100.kernel_pid(session["kernel"]["id"])
    lab_a100.hold_memory(pid, "22GB", device=4)

    def named(payload: dict) -> bool:
        return any(h["paths"] == ["Untitled3.ipynb"] and h["execution_state"] == "idle" for h in payload["holders"])

    payload = lab_a100.wait_for_metrics(named)
    row = next(h for h in payload["holders"] if h["paths"] == ["Untitled3.ipynb"])
    assert row["kind"] == "kernel" and row["kernel_id"] == session["kernel"]["id"]
    assert row["devices"] == [{"index": 4, "memory": 22 * 10**9}]
    assert row["summary"].startswith("Untitled3.ipynb holds 20.5 GiB on GPU 4, idle for ")
    assert row["state"].startswith("idle ")
    text = lab_a100.request("jupyter-gpu/metrics").body.decode()
    assert f'kernel_id="{session["kernel"]["id"]}",notebook="Untitled3.ipynb"}} 22000000000' in text


@pytest.mark.skipif(os.geteuid() != 0, reason="starting another user's process needs root (CI runs as root)")
def test_another_users_process_shows_only_its_memory(lab_a100) -> None:
    def gpu7_others(payload: dict) -> dict:
        return next(h for h in payload["holders"] if h["kind"] == "other" and h["devices"][0]["index"] == 7)

    before = gpu7_others(lab_a100.request("jupyter-gpu/api/metrics?since=1e300").json())
    count = int(before["label"].split()[0]) if before["label"][0].isdigit() else 1
    other = lab_a100.spawn([sys.executable, "-c", "import os, time; os.setuid(65534); time.sleep(300)"])
    time.sleep(0.3)
    lab_a100.hold_memory(other.pid, "3GiB", device=7)
    payload = lab_a100.wait_for_metrics(lambda p: gpu7_others(p)["label"] == f"{count + 1} other processes")
    row = gpu7_others(payload)
    assert row["pid"] is None and row["kernel_id"] is None and row["paths"] == []
    assert str(other.pid) not in str(row) and "python" not in str(row)
    assert row["summary"].startswith(f"{count + 1} other processes hold ")


def test_no_driver_status_gives_reason_verdict_and_fix(lab_nodriver) -> None:
    status = lab_nodriver.request("jupyter-gpu/api/status").json()
    assert status["available"] is False and status["status"] == "no_driver"
    assert "NVML Shared Library Not Found" in status["reason"]
    assert status["check"]["verdict"] and status["check"]["fix"]
    metrics = lab_nodriver.request("jupyter-gpu/api/metrics").json()
    assert metrics["latest"]["status"] == "no_driver" and metrics["latest"]["devices"] == []
    assert "jupyter_gpu_up{" in lab_nodriver.request("jupyter-gpu/metrics").body.decode()
