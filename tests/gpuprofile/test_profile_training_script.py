"""`jupyter_gpu.profile_training` from a real script run by `python`: no IPython, so no magics to type."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import jupyter_gpu

torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(512, 16), torch.randint(0, 4, (512,))), batch_size=16)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)

def train_one_epoch(model, loader, opt):
    total = 0.0
    for x, y in loader:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        total += loss.item()
    return total

result = jupyter_gpu.profile_training(train_one_epoch, model, loader, opt, steps=4, warmup=1)
print(result)
speed = next(ready for ready in result.ready_steps if ready.name == "profile_train_step")
# What the report tells the script to run, run as printed but for one option (every option compiles for seconds).
probed = eval(speed.command.replace("namespace=", "options=('fused-optimizer',), namespace="))
print("PROBED", type(probed).__name__, probed.option("fused-optimizer").agrees)
"""


def test_a_script_is_told_the_probe_calls_it_can_make_and_they_run(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "  jupyter_gpu.probe_speed(profile_train_step, namespace=globals())   (profile_train_step is defined in " \
           "this script's globals)" in out
    assert "jupyter_gpu.probe_loader(loader, profile_step, namespace=globals())" in out
    assert "jupyter_gpu.probe_batch_size(profile_sized_step, namespace=globals())" in out
    assert "%speedprobe profile_train_step" not in out and "%dataprobe loader" not in out
    assert "PROBED SpeedProbeResult True" in out
