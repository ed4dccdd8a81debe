"""%%gpuprofile tells the optimizer's operators from the model's, on a real loop in a real IPython shell (CPU torch).

A small transformer with AdamW (foreach, torch's default), written as tutorials write it: the update's
`_foreach_*` operators ran inside `optimizer.step()` and are the optimizer's, not fusion candidates of the model.
"""

from __future__ import annotations

from jupyter_gpu.gpuprofile.render import render_text

TRANSFORMER = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.TransformerEncoder(nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128,
                                                         batch_first=True), num_layers=2)
head = nn.Linear(64, 10)
params = list(model.parameters()) + list(head.parameters())
opt = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.01)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)
batches = [(torch.randn(8, 16, 64), torch.randint(0, 10, (8,))) for _ in range(40)]
"""

LOOP = """%%gpuprofile -o -q --steps 6 --warmup 2
for epoch in range(3):
    for step, (x, y) in enumerate(batches):
        logits = head(model(x).mean(dim=1))
        loss = nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        scheduler.step()
        if step % 10 == 0:
            print(f"epoch {epoch} step {step} loss {loss.item():.3f}")
"""


def test_adamws_foreach_operators_are_the_optimizers_and_the_models_are_not(ip) -> None:
    ip.run_cell(TRANSFORMER).raise_error()
    run = ip.run_cell(LOOP)
    run.raise_error()
    result = run.result
    optimizer_ops = [op for op in result.operators if op.optimizer]
    model_ops = [op for op in result.operators if not op.optimizer]
    # AdamW's own update (clip_grad_norm_'s _foreach_norm runs outside optimizer.step(): not the optimizer's).
    adam = ("_foreach_lerp_", "_foreach_addcdiv_", "_foreach_addcmul_", "_foreach_sqrt", "_foreach_div_")
    assert model_ops and all(op.name not in adam for op in model_ops), result.operators
    assert result.optimizer_share is not None and 0 < result.optimizer_share < 1
    assert not result.optimizer_fused
    if optimizer_ops:  # among the top ones on this machine: labelled as the optimizer's
        assert all(op.label.endswith("(optimizer)") for op in optimizer_ops)
        assert "(optimizer)" in render_text(result)
