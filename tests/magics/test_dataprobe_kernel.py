"""Ctrl-C during `%dataprobe` in a real ipykernel: what was measured is shown, no worker is left, the state is back."""

from __future__ import annotations

from jupyter_client.manager import start_new_kernel
from kernel_messages import error_names, printed, run, run_interrupted, shown

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
        # Ctrl-C half a second into the sweep's trial with workers: its workers are running.
        seen = run_interrupted(
            manager, client, "%dataprobe loader --step train_step --workers 0,1,2 --seconds 20", pause=0.5,
            when=lambda message: message["msg_type"].endswith("display_data")
            and "worker" in (text := message["content"].get("data", {}).get("text/plain", "")) and "sweep" in text)
        results = shown(seen, "dataprobe loader")
        assert results and "interrupted" in results[0]
        assert "loader alone" in results[0] and "together" in results[0]  # the measurements made before Ctrl-C
        assert error_names(seen) == ["KeyboardInterrupt"]  # "Run all" stops here
        output = printed(run(client, CHECK))
        assert "children []" in output and "unchanged True" in output, output
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
