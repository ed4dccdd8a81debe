"""Ctrl-C during `%speedprobe` in a real ipykernel: what was measured is shown, the model, optimizer and global
flags are back, and the kernel goes on."""

from __future__ import annotations

from jupyter_client.manager import start_new_kernel
from kernel_messages import run

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
        interrupted = {"sent": False}

        def interrupt_inside_the_fp16_trial(message: dict) -> None:
            data = message["content"].get("data", {}).get("text/plain", "")
            # Shown as the fp16 trial starts (the line updates at once after a pause, then once a second).
            if not interrupted["sent"] and "amp-fp16" in data:
                manager.interrupt_kernel()  # GradScaler wrapper, patched backward and autocast are all in place
                interrupted["sent"] = True

        seen = run(client, "%speedprobe train_step --try amp-bf16,amp-fp16,fused-optimizer --steps 6",
                   on_message=interrupt_inside_the_fp16_trial)
        assert interrupted["sent"]
        shown = [m["content"]["data"]["text/plain"] for m in seen if m["msg_type"] == "display_data"
                 and m["content"]["data"].get("text/plain", "").startswith("speedprobe train_step")]
        assert shown and "interrupted" in shown[-1]
        assert "bf16 autocast" in shown[-1]  # measured before Ctrl-C
        errors = [m["content"]["ename"] for m in seen if m["msg_type"] == "error"]
        assert errors == ["KeyboardInterrupt"]  # "Run all" stops here
        output = "".join(m["content"].get("text", "") for m in run(client, CHECK) if m["msg_type"] == "stream")
        assert "unchanged True" in output and "moments True" in output, output
        assert "autocast False backward Tensor.backward" in output and "step False" in output, output
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
