"""The server's monitor: one sampler, history since a time, status with the %gpucheck verdict, alerts."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from threads import sampler_threads, wait_for
from traitlets import TraitError

from jupyter_gpu.metrics.backends.simulated import SimulatedBackend
from jupyter_gpu.metrics.hub import SamplerHub
from jupyter_gpu.metrics.sample import DeviceSample, GpuProcess, Sample
from jupyter_gpu.server.config import JupyterGpu
from jupyter_gpu.server.kernels import KernelInfo
from jupyter_gpu.server.monitor import GpuMonitor, server_alerts
from jupyter_gpu.server.processes import ProcessInfo


def monitor_for(scenario: str, **kwargs: object) -> GpuMonitor:
    clock = iter(range(10_000))
    backend = SimulatedBackend(scenario, clock=lambda: float(next(clock)))
    return GpuMonitor(SamplerHub(lambda: backend), **kwargs)  # type: ignore[arg-type]


def test_history_since_a_time_returns_only_newer_samples_and_always_the_latest() -> None:
    monitor = monitor_for("h200")
    monitor.start(thread=False)
    stamps = [monitor.read_now().timestamp for _ in range(5)]
    everything = json.loads(monitor.metrics_json())
    # Each sample once: the history runs up to the latest, which comes on its own.
    assert [s["timestamp"] for s in everything["history"]] == stamps[:-1]
    assert everything["latest"]["timestamp"] == stamps[-1]
    newer = json.loads(monitor.metrics_json(since=stamps[2]))
    assert [s["timestamp"] for s in newer["history"]] == stamps[3:-1]
    caught_up = json.loads(monitor.metrics_json(since=stamps[-1]))
    assert caught_up["history"] == [] and caught_up["latest"]["timestamp"] == stamps[-1]
    assert everything["backend"] == "simulated:h200" and everything["simulated"] is True
    monitor.close()


def test_the_history_keeps_the_configured_number_of_samples() -> None:
    monitor = monitor_for("h200", history=3)
    monitor.start(thread=False)
    for _ in range(5):
        monitor.read_now()
    assert len(json.loads(monitor.metrics_json())["history"]) == 2  # 3 kept: 2 before the latest
    monitor.close()


def test_before_the_first_reading_the_reply_is_valid_and_status_says_starting() -> None:
    monitor = monitor_for("h200")
    payload = json.loads(monitor.metrics_json())
    assert payload["latest"] is None and payload["history"] == [] and payload["holders"] == []
    status = asyncio.run(monitor.status())
    assert status["available"] is False and status["status"] == "starting"


def test_no_driver_status_gives_the_reason_and_the_gpucheck_fix_computed_once() -> None:
    calls: list[str] = []

    def check() -> dict:
        calls.append(threading.current_thread().name)
        return {"status": "fail", "verdict": "No NVIDIA driver", "headline": "h", "fix": ["install it"]}

    monitor = monitor_for("nodriver", check=check)
    monitor.start(thread=False)
    monitor.read_now()

    async def two_requests() -> list[dict]:
        return list(await asyncio.gather(monitor.status(), monitor.status()))

    first, second = asyncio.run(two_requests())
    assert first == second
    assert first["available"] is False and first["status"] == "no_driver"
    assert "NVML Shared Library Not Found" in first["reason"]
    assert first["check"]["fix"] == ["install it"]
    assert len(calls) == 1 and calls[0] != threading.current_thread().name  # off the event loop's thread
    asyncio.run(monitor.status())
    assert len(calls) == 1  # cached
    monitor.close()


def test_a_gpu_status_lists_devices_and_skips_the_check() -> None:
    monitor = monitor_for("h200", check=lambda: pytest.fail("no check when a GPU is there"))
    monitor.start(thread=False)
    monitor.read_now()
    status = asyncio.run(monitor.status())
    assert status["available"] is True and status["check"] is None
    assert status["devices"] == [{"index": 0, "name": "NVIDIA H200", "uuid": status["devices"][0]["uuid"],
                                  "status": "ok"}]
    monitor.close()


def test_a_backend_that_cannot_start_is_reported_not_raised() -> None:
    def broken() -> SimulatedBackend:
        raise ValueError("Unknown simulated scenario 'nope'")

    monitor = GpuMonitor(SamplerHub(broken))
    monitor.start()
    status = asyncio.run(monitor.status())
    assert status["status"] == "error" and "Unknown simulated scenario 'nope'" in status["reason"]
    assert "Unknown simulated scenario" in json.loads(monitor.metrics_json())["error"]


def test_one_sampler_thread_feeds_the_monitor_and_stops_on_close() -> None:
    before = len(sampler_threads())
    monitor = monitor_for("h200", interval=0.1)
    thread = monitor.start_in_background()
    thread.join(5)
    wait_for(lambda: len(json.loads(monitor.metrics_json())["history"]) >= 3)
    assert len(sampler_threads()) == before + 1
    assert asyncio.run(monitor.status())["sampler_threads"] == before + 1
    monitor.close()
    wait_for(lambda: len(sampler_threads()) == before)


def test_server_alerts_name_the_busy_notebook_whose_gpu_sits_idle() -> None:
    def sample(t: float) -> Sample:
        return Sample(t, "x", True, devices=(DeviceSample(0, "H200", "U", utilization_gpu=2.0, memory_used=1,
                                                         memory_total=100, processes=(GpuProcess(50, 90),)),))

    history = [sample(100.0 + i) for i in range(10)]
    busy = KernelInfo("k", "python3", 50, "busy", 100.0, 100.0, ("train.ipynb",))
    from jupyter_gpu.server.attribution import attribute

    holders = tuple(attribute(history[-1], [busy], lambda pid: ProcessInfo(pid, 1, 0, "python"), 0))
    alerts = server_alerts(history[-1], history, holders)
    assert [(a.code, a.message.split(":")[0]) for a in alerts] == [("GPU_IDLE_DURING_CELL", "train.ipynb")]
    # the same kernel idle: no alert; and another process holding 90% is the table's job, not an alert
    idle = KernelInfo("k", "python3", 50, "idle", 100.0, None, ("train.ipynb",))
    holders = tuple(attribute(history[-1], [idle], lambda pid: ProcessInfo(pid, 1, 0, "python"), 0))
    assert server_alerts(history[-1], history, holders) == []


def test_config_refuses_a_too_fast_interval_and_an_empty_history() -> None:
    with pytest.raises(TraitError, match=r"at least 0\.1"):
        JupyterGpu(interval=0.01)
    with pytest.raises(TraitError, match="at least 1"):
        JupyterGpu(history=0)
    assert JupyterGpu(interval=2.0).interval == 2.0
