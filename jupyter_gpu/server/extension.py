"""The jupyter_server extension behind the JupyterLab side panel (enabled on install)."""

from __future__ import annotations

import os
from typing import Any

from jupyter_gpu.metrics.hub import hub_for_spec
from jupyter_gpu.server.config import JupyterGpu
from jupyter_gpu.server.handlers import setup_handlers
from jupyter_gpu.server.kernels import BusyTracker, snapshot_kernels
from jupyter_gpu.server.monitor import GpuMonitor


def load_server_extension(server_app: Any) -> GpuMonitor:
    from tornado.ioloop import PeriodicCallback

    from jupyter_gpu.metrics.backends import BACKEND_ENV

    config = JupyterGpu(parent=server_app)
    spec = os.environ.get(BACKEND_ENV, "").strip()
    # The server's own hub, not the kernel-side shared one: its history length is the server's setting.
    hub = hub_for_spec(spec, history=config.history)
    monitor = GpuMonitor(hub, interval=config.interval, history=config.history)
    setup_handlers(server_app.web_app, monitor)
    tracker = BusyTracker()

    async def refresh_kernels() -> None:
        try:
            monitor.kernels = await snapshot_kernels(server_app.kernel_manager,
                                                     getattr(server_app, "session_manager", None), tracker)
        except Exception:  # never let a kernel-manager quirk stop the refresh loop
            server_app.log.exception("jupyter-gpu could not list the running kernels.")

    PeriodicCallback(refresh_kernels, config.interval * 1000).start()
    monitor.start_in_background()
    server_app.log.info("jupyter-gpu: GPU panel API at %sjupyter-gpu/api/metrics (backend %s)",
                        server_app.web_app.settings["base_url"], spec or "nvml")
    return monitor
