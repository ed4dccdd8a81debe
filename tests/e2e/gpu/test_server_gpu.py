"""The side panel's server against the real NVML: a notebook that allocates CUDA memory is named as its holder.

Not part of the default run; scripts/gpu-check.sh runs it on a GPU machine.
"""

from __future__ import annotations

import pytest
from jupyter_client import BlockingKernelClient
from lab_server import start_lab_server

pytestmark = pytest.mark.gpu


def test_a_notebook_allocating_cuda_memory_is_attributed_by_the_real_nvml(tmp_path, nvml_lists_our_pids) -> None:
    # nvml_lists_our_pids: the server finds the notebook from NVML's process list by the kernel's PID; where the
    # runtime hides them (a container's PID namespace, gVisor) the test skips with that reason instead of waiting.
    server = start_lab_server(tmp_path, None, interval=1.0)
    try:
        status = server.request("jupyter-gpu/api/status").json()
        print("status:", status["available"], status["backend"], [d["name"] for d in status["devices"]])
        assert status["available"] is True and status["simulated"] is False and status["sampler_threads"] == 1
        session = server.new_notebook("cuda-holder.ipynb")
        client = BlockingKernelClient(connection_file=str(server.connection_file(session["kernel"]["id"])))
        client.load_connection_file()
        client.start_channels()
        reply = client.execute_interactive("import torch; x = torch.ones(2**28, device='cuda')", timeout=120)
        assert reply["content"]["status"] == "ok"
        payload = server.wait_for_metrics(
            lambda p: any(h["paths"] == ["cuda-holder.ipynb"] for h in p["holders"]), timeout=30)
        row = next(h for h in payload["holders"] if h["paths"] == ["cuda-holder.ipynb"])
        print("holder:", row["summary"])
        assert row["kind"] == "kernel" and row["memory"] >= 2**30  # 1 GiB of floats plus the CUDA context
        text = server.request("jupyter-gpu/metrics").body.decode()
        assert 'notebook="cuda-holder.ipynb"' in text
        client.stop_channels()
    finally:
        server.stop()
