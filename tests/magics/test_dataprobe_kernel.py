"""Ctrl-C during `%dataprobe` in a real ipykernel: what was measured is shown, no worker is left, the state is back."""

from __future__ import annotations

import time

from jupyter_client.manager import start_new_kernel
from kernel_messages import run

SETUP = """
%load_ext jupyter_gpu
import os, time, torch
from pathlib import Path
from torch import nn
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 100_000
    def __getitem__(self, index):
        time.sleep(0.002)
        return torch.zeros(8), index % 10

model = nn.Linear(8, 10)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
before = [p.detach().clone() for p in model.parameters()]
loader = DataLoader(Slow(), batch_size=8)

def train_step(batch):
    x, y = batch
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()

def children():
    return sorted(int(pid) for task in Path(f"/proc/{os.getpid()}/task").iterdir()
                  for pid in (task / "children").read_text().split())
"""
CHECK = """
print("children", children())
print("unchanged", all(torch.equal(a, b) for a, b in zip(model.parameters(), before)))
"""


def test_ctrl_c_shows_what_was_measured_and_leaves_no_worker_behind() -> None:
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        run(client, SETUP)
        interrupted = {"sent": False}

        def interrupt_once_workers_run(message: dict) -> None:
            text = message["content"].get("data", {}).get("text/plain", "")
            if not interrupted["sent"] and message["msg_type"].endswith("display_data") and "worker" in text \
                    and "sweep" in text:
                time.sleep(0.5)  # inside the trial: its workers are running
                manager.interrupt_kernel()
                interrupted["sent"] = True

        seen = run(client, "%dataprobe loader --step train_step --workers 0,1,2 --seconds 20",
                   on_message=interrupt_once_workers_run)
        assert interrupted["sent"]
        shown = [m["content"]["data"]["text/plain"] for m in seen if m["msg_type"] == "display_data"
                 and m["content"]["data"].get("text/plain", "").startswith("dataprobe loader")]
        assert shown and "interrupted" in shown[0]
        assert "loader alone" in shown[0] and "together" in shown[0]  # the measurements made before Ctrl-C
        errors = [m["content"]["ename"] for m in seen if m["msg_type"] == "error"]
        assert errors == ["KeyboardInterrupt"]  # "Run all" stops here
        output = "".join(m["content"].get("text", "") for m in run(client, CHECK) if m["msg_type"] == "stream")
        assert "children []" in output and "unchanged True" in output, output
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
