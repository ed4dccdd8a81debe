"""%speedprobe's AMP options on steps notebooks really write (issue 29, points 4 and 6), in a real IPython shell, run
for real on the CPU: a classic AMP step with gradient clipping, and a step that already runs under autocast."""

from __future__ import annotations

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from jupyter_gpu.speedprobe.catalog import adopt_lines

MODEL = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""

# The real gradient norm is about 0.7, so clipping at 1 never clips; clipping the scaled gradients always does.
CLIPPED_STEP = MODEL + """
def train_step():
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    {clip}
    opt.step()
    return loss
"""

OWN_AUTOCAST_STEP = MODEL + """
def train_step():
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    opt.zero_grad()
    with torch.autocast("{device}", dtype=torch.{dtype}):
        loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss
"""


def speedprobe(ip: InteractiveShell, line: str):
    with capture_output() as captured:
        result = ip.run_line_magic("speedprobe", line)
    return result, "\n".join(output.data.get("text/plain", "") for output in captured.outputs)


@pytest.mark.parametrize("clip", [
    "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)",
    "torch.nn.utils.clip_grad_norm_(parameters=model.parameters(), max_norm=1.0)",
    "nn.utils.clip_grad_value_(model.parameters(), clip_value=1.0)",
    # Imported by name before the probe ran: the probe cannot swap that name, only what the function calls.
    "clip_grad_norm_(model.parameters(), 1.0)",
])
def test_fp16_with_gradient_clipping_unscales_before_the_clip_and_agrees(ip: InteractiveShell, clip: str) -> None:
    ip.run_cell("from torch.nn.utils import clip_grad_norm_\n" + CLIPPED_STEP.format(clip=clip))
    result, text = speedprobe(ip, "train_step --try amp-fp16 --steps 4 -o")
    fp16 = result.option("amp-fp16")
    assert fp16.agrees is True, fp16.agreement
    assert "wrong" not in text
    lines = adopt_lines(("amp-fp16",), result.code_context)
    unscale = lines.index("scaler.unscale_(opt)  # before clipping: clip the real gradients, not the scaled ones")
    assert lines.index("scaler.scale(loss).backward()") < unscale < lines.index("scaler.step(opt)")
    assert not torch.is_autocast_enabled("cpu")


def test_a_step_without_clipping_is_not_told_to_unscale(ip: InteractiveShell) -> None:
    ip.run_cell(CLIPPED_STEP.format(clip="pass"))
    result, _ = speedprobe(ip, "train_step --try amp-fp16 --steps 3 -o")
    assert result.option("amp-fp16").agrees is True
    assert not any("unscale_" in line for line in adopt_lines(("amp-fp16",), result.code_context))


def test_clipping_the_probe_cannot_reach_is_not_blamed_on_fp16(ip: InteractiveShell) -> None:
    # The step clips by hand: the probe cannot know where unscale_ goes, so it says so instead of calling fp16 wrong.
    own_clip = ("norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()\n"
                "    for p in model.parameters():\n"
                "        p.grad.mul_(torch.clamp(1.0 / (norm + 1e-6), max=1.0))")
    ip.run_cell(CLIPPED_STEP.format(clip=own_clip))
    result, text = speedprobe(ip, "train_step --try amp-fp16,amp-bf16 --steps 3 -o")
    fp16 = result.option("amp-fp16")
    assert fp16.agrees is None, fp16.agreement
    assert "scaler.unscale_(opt)" in fp16.agreement.note and "changes the gradients" in fp16.agreement.note
    assert "wrong" not in text
    assert result.option("amp-bf16").agrees is True  # bf16 needs no scaler: nothing to place


@pytest.mark.parametrize(("dtype", "short"), [("bfloat16", "bf16"), ("float16", "fp16")])
def test_a_step_under_its_own_autocast_skips_the_amp_options(ip: InteractiveShell, dtype: str, short: str) -> None:
    ip.run_cell(OWN_AUTOCAST_STEP.format(device="cpu", dtype=dtype))
    result, text = speedprobe(ip, "train_step --try amp-bf16,amp-fp16,fused-optimizer --steps 3 -o")
    for name in ("amp-bf16", "amp-fp16"):
        trial = result.option(name)
        assert trial.skipped is not None and f"the step already uses {short} autocast" in trial.skipped, trial
        assert not trial.times
    assert result.option("fused-optimizer").measured
    assert "recommended" not in text or "autocast" not in text.split("recommended")[0].splitlines()[-1]
    assert not any("autocast" in line for line in result.code())


def test_an_autocast_that_does_not_reach_the_model_does_not_count(ip: InteractiveShell) -> None:
    # autocast("cuda") around a CPU model changes nothing: the operators still run in float32, so AMP is tried.
    ip.run_cell(OWN_AUTOCAST_STEP.format(device="cuda", dtype="bfloat16"))
    result, _ = speedprobe(ip, "train_step --try amp-bf16 --steps 3 -o")
    assert result.option("amp-bf16").skipped is None and result.option("amp-bf16").measured
    # CUDA autocast on a machine without CUDA warns that it is disabled: named once in the notes, as what the
    # step warned while the probe called it, not printed above the report call after call.
    assert any(note.startswith("warned while the probe ran") and "UserWarning" in note and "autocast" in note.lower()
               for note in result.notes), result.notes
