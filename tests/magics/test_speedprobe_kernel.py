"""Ctrl-C during `%speedprobe` in a real ipykernel: what was measured is shown, the model, optimizer and global
flags are back, and the kernel goes on."""

from __future__ import annotations

from jupyter_client.manager import start_new_kernel
from kernel_messages import error_names, printed, run, run_interrupted, shown

SETUP = """
%load_ext jupyter_gpu
import time, torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)

def train_step():
    time.sleep(0.05)  # a known cost: the probe is still inside a trial when Ctrl-C comes
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss

train_step()
before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
moments = [state["exp_avg"].clone() for state in opt.state.values()]
"""
CHECK = """
print("unchanged", all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items()))
print("moments", all(torch.equal(a, s["exp_avg"]) for a, s in zip(moments, opt.state.values())))
print("autocast", torch.is_autocast_enabled("cpu"), "backward", torch.Tensor.backward.__qualname__)
print("step", "step" in opt.__dict__)
"""


def test_ctrl_c_shows_what_was_measured_and_puts_everything_back() -> None:
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        run(client, SETUP)
        # Ctrl-C as the fp16 trial starts: GradScaler wrapper, patched backward and autocast are all in place.
        seen = run_interrupted(
            manager, client, "%speedprobe train_step --try amp-bf16,amp-fp16,fused-optimizer --steps 6",
            when=lambda message: "amp-fp16" in message["content"].get("data", {}).get("text/plain", ""))
        results = shown(seen, "speedprobe train_step")
        assert results and "interrupted" in results[-1]
        assert "bf16 autocast" in results[-1]  # measured before Ctrl-C
        assert error_names(seen) == ["KeyboardInterrupt"]  # "Run all" stops here
        output = printed(run(client, CHECK))
        assert "unchanged True" in output and "moments True" in output, output
        assert "autocast False backward Tensor.backward" in output and "step False" in output, output
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
