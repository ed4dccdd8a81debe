"""The baseline for bench/bench_server.py: nvdashboard's design, one sampling loop per client, without nvdashboard.

nvdashboard gives every open websocket its own tornado `PeriodicCallback` (1 s) that sweeps NVML over every
GPU on the server's event loop thread, then serialises and pushes the result. Per client and per tick that is
one synchronous read of all GPUs plus one encoding, on the loop. This extension does exactly that work per
poll: an authenticated `GET /bench-per-client/metrics` reads the same simulated backend the jupyter-gpu
server extension uses (`simulated:a100x8-mig`), on the event loop, and returns `json.dumps(sample.to_dict())`.
The client's 1 s poll stands in for the callback's 1 s tick, so N clients make N reads a second.

It is kind to the baseline: one backend is shared by every client (nvdashboard's pynvml handles are shared
too, and a per-client backend would only add cost), the reply is one sample with no history, holders or
alerts, and bokeh's document diffing and websocket framing are left out. With a real GPU each NVML sweep of
eight GPUs costs more than the simulated read, so the real baseline costs more than this one.

`GET /bench-per-client/status` says how many reads were made, so the bench can check N reads per second.

Loaded by the bench with `PYTHONPATH=bench` and
`--ServerApp.jpserver_extensions="{'per_client_sampling_ext': True, 'jupyter_gpu': False}"`.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from jupyter_gpu.metrics.backends.base import Backend
from jupyter_gpu.metrics.backends.select import select_backend
from jupyter_gpu.metrics.sampler import running_sampler_threads

SPEC = "simulated:a100x8-mig"
PREFIX = "bench-per-client"
STATE_SETTING = "bench_per_client_state"


class _State:
    def __init__(self) -> None:
        self.backend: Backend = select_backend(SPEC)
        self.reads = 0


class _Handler(APIHandler):
    # As jupyter-gpu's handlers: polling is not user activity. Leaving it on would add a cost ours does not pay.
    _track_activity = False

    @property
    def state(self) -> _State:
        return self.settings[STATE_SETTING]


class MetricsHandler(_Handler):
    @tornado.web.authenticated
    def get(self) -> None:
        # Synchronous, on the event loop thread, as a per-socket PeriodicCallback's NVML sweep is.
        sample = self.state.backend.read()
        self.state.reads += 1
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(sample.to_dict()))


class StatusHandler(_Handler):
    @tornado.web.authenticated
    def get(self) -> None:
        self.finish({
            "reads": self.state.reads,
            "sampler_threads": running_sampler_threads(),
            "python_threads": threading.active_count(),
        })


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": __name__}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    web_app = server_app.web_app
    web_app.settings[STATE_SETTING] = _State()
    base_url = web_app.settings["base_url"]
    web_app.add_handlers(".*$", [
        (url_path_join(base_url, PREFIX, "metrics"), MetricsHandler),
        (url_path_join(base_url, PREFIX, "status"), StatusHandler),
    ])
