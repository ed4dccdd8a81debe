"""%speedprobe in a real IPython shell, on a training step defined in the notebook, run for real on the CPU."""

from __future__ import annotations

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from jupyter_gpu.speedprobe.result import SpeedProbeResult

# An MLP trained by Adam, as a notebook would define it; the step makes its own batch and returns the loss.
SETUP = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)

def train_step():
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss

train_step()

def needs_batch(batch):
    return train_step()
"""


def test_probe_a_notebook_step_shows_the_table_and_returns_the_result(ip: InteractiveShell) -> None:
    ip.run_cell(SETUP)
    before = {name: tensor.clone() for name, tensor in ip.user_ns["model"].state_dict().items()}
    with capture_output() as captured:
        result = ip.run_line_magic("speedprobe", "train_step --try amp-bf16,fused-optimizer,tf32 --steps 3 -o")
    assert isinstance(result, SpeedProbeResult)
    text = "\n".join(output.data.get("text/plain", "") for output in captured.outputs)
    assert text.startswith("speedprobe train_step: ")
    assert "bf16 autocast" in text and "fused optimizer" in text and "TF32" in text
    assert "NVIDIA GPUs" in text  # tf32 skipped with its reason
    assert "restored" in text and "model, opt" in text
    html = captured.outputs[-1].data["text/html"]
    assert "bf16 autocast" in html
    after = ip.user_ns["model"].state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert [trial.name for trial in result.options] == ["amp-bf16", "tf32", "fused-optimizer"]


def test_options_take_torchs_own_spelling(ip: InteractiveShell) -> None:
    ip.run_cell(SETUP)
    result = ip.run_line_magic("speedprobe", "train_step --try channels_last,cudnn.benchmark --steps 2 -q -o")
    assert [trial.name for trial in result.options] == ["cudnn-benchmark", "channels-last"]


def test_quiet_prints_nothing(ip: InteractiveShell) -> None:
    ip.run_cell(SETUP)
    with capture_output() as captured:
        assert ip.run_line_magic("speedprobe", "train_step --try fused-optimizer --steps 2 -q") is None
    assert captured.outputs == [] and captured.stdout == ""


@pytest.mark.parametrize(("line", "message"), [
    ("", "needs the name of a training step"),
    ("nothing_here", "there is no step function 'nothing_here'"),
    ("model", "is a Sequential, not a function that runs a training step"),
    ("needs_batch", r"takes batch, and %speedprobe calls it with no arguments; wrap it"),
    ("train_step --try amp", "'amp' is not one of amp-bf16"),
    ("train_step --steps 0", "--steps must be at least 1"),
    ("train_step --steps many", "--steps needs a whole number"),
    ("train_step other_step", "takes one step name"),
])
def test_bad_input_is_one_sentence(ip: InteractiveShell, line: str, message: str) -> None:
    ip.run_cell(SETUP)
    with pytest.raises(UsageError, match=message):
        ip.run_line_magic("speedprobe", line)


def test_a_step_without_a_model_in_reach_is_one_sentence(ip: InteractiveShell) -> None:
    ip.run_cell("def lonely():\n    return 1.0")
    with pytest.raises(UsageError, match="no model or optimizer was found"):
        ip.run_line_magic("speedprobe", "lonely")
