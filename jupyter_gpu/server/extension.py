"""The wiring of the jupyter_server extension behind the JupyterLab side panel (enabled on install).

`GpuPanelExtension` is registered as the extension's app so that jupyter_server calls its `stop_extension`
at shutdown: module-level extensions get no shutdown hook, and without one the kernel-list callback and the
sampler thread (with NVML initialised) would outlive the server they serve.
"""

from __future__ import annotations

import gc
import os
import threading
from dataclasses import dataclass
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from tornado.ioloop import IOLoop, PeriodicCallback

from jupyter_gpu.metrics.backends.base import BACKEND_ENV
from jupyter_gpu.metrics.hub import hub_for_spec
from jupyter_gpu.metrics.sampler import running_sampler_threads
from jupyter_gpu.server.config import JupyterGpu
from jupyter_gpu.server.handlers import setup_handlers
from jupyter_gpu.server.kernels import BusyTracker, snapshot_kernels
from jupyter_gpu.server.monitor import GpuMonitor
from jupyter_gpu.server.stream import MetricsStream

# How long shutdown waits for a sampler still starting (a first nvmlInit can be slow) before closing it anyway.
_START_JOIN_S = 5.0


@dataclass
class RunningExtension:
    """What one server's extension started, so `stop()` can end all of it."""

    monitor: GpuMonitor
    stream: MetricsStream
    refresh: PeriodicCallback
    starting: threading.Thread

    def stop(self) -> None:
        """Close the push stream's sockets, stop the kernel-list callback, then the monitor's lease: the last one
        stops the thread and NVML."""
        self.stream.shut()
        self.refresh.stop()
        self.starting.join(_START_JOIN_S)
        self.monitor.close()


def load_server_extension(server_app: Any) -> RunningExtension:
    config = JupyterGpu(parent=server_app)
    spec = os.environ.get(BACKEND_ENV, "").strip()
    # The server's own hub, not the kernel-side shared one: its history length is the server's setting.
    hub = hub_for_spec(spec, history=config.history)
    monitor = GpuMonitor(hub, interval=config.interval, history=config.history,
                         series_seconds=config.history_seconds)
    stream = setup_handlers(server_app.web_app, monitor)
    tracker = BusyTracker()

    async def refresh_kernels() -> None:
        try:
            monitor.kernels = await snapshot_kernels(server_app.kernel_manager,
                                                     getattr(server_app, "session_manager", None), tracker)
        except Exception:  # never let a kernel-manager quirk stop the refresh loop
            server_app.log.exception("jupyter-gpu could not list the running kernels.")

    if config.freeze_startup_objects:
        # The loop runs its first callbacks once every extension has loaded: start-up is over then.
        IOLoop.current().add_callback(freeze_startup_objects, server_app.log)
    refresh = PeriodicCallback(refresh_kernels, config.interval * 1000)
    refresh.start()
    running = RunningExtension(monitor, stream, refresh, monitor.start_in_background())
    server_app.log.info("jupyter-gpu: GPU panel API at %sjupyter-gpu/api/metrics (backend %s)",
                        server_app.web_app.settings["base_url"], spec or "nvml")
    return running


def freeze_startup_objects(log: Any) -> int:
    """Collect what start-up left as garbage, then freeze the rest: full collections no longer walk them.

    gc.freeze() is what CPython's documentation advises for long-lived start-up objects. The collection first
    keeps it honest: garbage from start-up is freed, not frozen. Returns how many objects were frozen.
    """
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("jupyter-gpu: froze %d start-up objects out of full garbage collections "
             "(--JupyterGpu.freeze_startup_objects=False to keep them in)", frozen)
    return frozen


class GpuPanelExtension(ExtensionApp):
    """The `jupyter_gpu` server extension: adds the side panel's routes on load, stops its sampler at shutdown."""

    name = "jupyter_gpu"
    running: RunningExtension | None = None

    def initialize_handlers(self) -> None:
        self.running = load_server_extension(self.serverapp)

    async def stop_extension(self) -> None:
        if self.running is None:
            return
        self.running.stop()
        self.running = None
        left = running_sampler_threads()
        self.log.info("jupyter-gpu: stopped the GPU sampler and the kernel refresh (%d sampler threads left)", left)
