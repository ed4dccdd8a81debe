"""%batchprobe's progress line in a real ipykernel: it keeps counting while a long trial runs, in the cell's output."""

from __future__ import annotations

from jupyter_client.manager import start_new_kernel

CELL = """
%load_ext jupyter_gpu
import time, torch
def step(batch_size):
    time.sleep(1.5)
%batchprobe step --max 2 --max-memory 8MiB --steps 2
"""


def test_the_progress_line_ticks_from_its_thread_into_the_running_cell() -> None:
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        request = client.execute(CELL)
        progress: list[tuple[str, bool, str]] = []
        while True:
            message = client.get_iopub_msg(timeout=120)
            ours = message["parent_header"].get("msg_id") == request
            kind = message["msg_type"]
            if kind in ("display_data", "update_display_data"):
                text = message["content"]["data"].get("text/plain", "")
                if text.startswith("%batchprobe") or kind == "update_display_data":
                    progress.append((kind, ours, text))
            if kind == "status" and ours and message["content"]["execution_state"] == "idle":
                break
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    during = [entry for entry in progress if "trial 1: batch 2 (start) …" in entry[2]]
    # Shown once as the trial starts, then updated about once a second for the 3 s it takes.
    assert len(during) >= 3, progress
    assert during[0][0] == "display_data" and all(kind == "update_display_data" for kind, _, _ in during[1:])
    assert all(ours for _, ours, _ in progress), "every update is routed to the cell that runs the probe"
    assert progress[-1][2] == ""
