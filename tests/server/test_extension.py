"""The extension's lifecycle in a real jupyter_server: loaded as the `jupyter_gpu` app, stopped at shutdown."""

from __future__ import annotations

import os
import subprocess
import sys

# In a fresh process: the server, its extension manager and the shutdown path are jupyter_server's own.
SCRIPT = """
import asyncio, time
from jupyter_server.serverapp import ServerApp
from jupyter_gpu.metrics.sampler import running_sampler_threads as samplers

app = ServerApp()
app.initialize(argv=["--ServerApp.port=0", "--allow-root", "--ServerApp.reraise_server_extension_failures=True",
                     "--ServerApp.jpserver_extensions={'jupyter_gpu': True, 'jupyter_lsp': False, "
                     "'jupyterlab': False, 'notebook_shim': False, 'jupyter_server_terminals': False}"])
(extension,) = app.extension_manager.extension_apps["jupyter_gpu"]
running = extension.running
deadline = time.monotonic() + 30
while samplers() == 0 and time.monotonic() < deadline:
    time.sleep(0.05)
print("before", samplers(), running.refresh.is_running())
asyncio.new_event_loop().run_until_complete(app.cleanup_extensions())  # what ServerApp runs when it stops
print("after", samplers(), running.refresh.is_running(), extension.running)
"""


def test_shutdown_stops_the_sampler_thread_and_the_kernel_refresh() -> None:
    env = {**os.environ, "JUPYTER_GPU_BACKEND": "simulated:h200"}
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "before 1 True" in result.stdout
    assert "after 0 False None" in result.stdout
    assert "stopped the GPU sampler and the kernel refresh (0 sampler threads left)" in result.stderr
