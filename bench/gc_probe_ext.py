"""A probe for bench/bench_server.py, loaded in every server it starts: the Python garbage collector's pauses.

A Jupyter server with JupyterLab loaded holds some 200,000 objects, so a full (generation 2) collection stops
its event loop for about 100 ms; one that lands during a burst of polls is most of that burst's tail. The bench
resets the probe as the load starts and reads it as it ends, to tell such pauses from the endpoints' own cost.
The callback costs two clock reads per collection.

`GET /bench-gc-probe` (authenticated): per generation, the collections since the last `?reset=1`, their total
and longest pause in ms, and the objects the collector tracks.
"""

from __future__ import annotations

import gc
import time
from typing import Any

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

PATH = "bench-gc-probe"
GENERATIONS = 3


class _Pauses:
    def __init__(self) -> None:
        self.started = 0.0
        self.reset()

    def reset(self) -> None:
        self.count = [0] * GENERATIONS
        self.total = [0.0] * GENERATIONS
        self.longest = [0.0] * GENERATIONS

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
            return
        pause = time.perf_counter() - self.started
        generation = info["generation"]
        self.count[generation] += 1
        self.total[generation] += pause
        self.longest[generation] = max(self.longest[generation], pause)


PAUSES = _Pauses()


class ProbeHandler(APIHandler):
    _track_activity = False

    @tornado.web.authenticated
    def get(self) -> None:
        reply = {
            "collections": PAUSES.count,
            "pause_ms": [1e3 * value for value in PAUSES.total],
            "longest_ms": [1e3 * value for value in PAUSES.longest],
            "tracked_objects": len(gc.get_objects()),
        }
        if self.get_argument("reset", None):
            PAUSES.reset()
        self.finish(reply)


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": __name__}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    if PAUSES not in gc.callbacks:
        gc.callbacks.append(PAUSES)
    web_app = server_app.web_app
    web_app.add_handlers(".*$", [(url_path_join(web_app.settings["base_url"], PATH), ProbeHandler)])
