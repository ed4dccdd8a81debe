"""%%gpuprofile checks what it says of the training state (issue 50): put back, it is verified equal before the report
says so; with --keep, what the steps changed is named the same way the probes name it. Real IPython shell, CPU."""

from __future__ import annotations

LOOP = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
data = [(torch.randn(16, 8), torch.randint(0, 2, (16,))) for _ in range(40)]
"""
CELL = ("for x, y in data:\n    opt.zero_grad()\n    nn.functional.cross_entropy(model(x), y).backward()\n"
        "    opt.step()\n    sched.step()\n")


def test_put_back_state_is_verified_and_nothing_is_said_to_have_moved(ip) -> None:
    ip.run_cell(LOOP).raise_error()
    result = ip.run_cell("%%gpuprofile -o -q --steps 4 --warmup 1\n" + CELL).result
    text = str(result)
    assert "not restored" not in text
    first = result.notes[0]  # what the profile did to the cell, with what compared equal after it
    assert "checked after the run: exactly as before the cell" in first and "model" in first and "opt" in first, first


def test_keep_names_what_the_steps_changed(ip) -> None:
    ip.run_cell(LOOP).raise_error()
    result = ip.run_cell("%%gpuprofile -o -q --keep --steps 4 --warmup 1\n" + CELL).result
    kept = next((note for note in result.notes if note.startswith("--keep:")), None)
    assert kept is not None, result.notes
    assert "model (Linear)" in kept and "opt (SGD)" in kept and "sched (StepLR): last_epoch" in kept, kept
    assert "not restored" not in kept
