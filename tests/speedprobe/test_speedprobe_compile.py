"""`torch.compile` as a `%speedprobe` option, for real on the CPU (inductor's C++ backend): compile time apart from
the step time, the compiled step's numbers judged against eager's, and the model uncompiled afterwards.

One test: the first compile in a process costs 10-30 s here, most of it once for all."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from training_steps import Training, assert_same_state, state_of, supervised

from jupyter_gpu.speedprobe.runner import probe_speed


def probe_compiled(training: Training, steps: int):
    """%speedprobe's compile option on a training step; the state is checked to be put back."""
    before = state_of(training)
    result = probe_speed(training.step, options=("compile",), steps=steps, namespace=training.namespace())
    assert_same_state(before, state_of(training))
    return result


def test_compile_is_timed_apart_judged_against_eager_and_undone() -> None:
    torch.manual_seed(0)
    # Dropout: inductor draws its own random numbers, so agreement needs the probe to keep eager's masks.
    # An nn.Sequential: model.compile() would compile nothing for it on torch 2.13, torch.compile(forward) does.
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    result = probe_compiled(supervised(model, opt, lambda: (torch.randn(8, 16), torch.randint(0, 4, (8,)))), steps=4)
    assert "forward" not in model.__dict__ and model._compiled_call_impl is None  # it runs eagerly again
    compiled = result.option("compile")
    assert compiled.error is None, compiled.error
    # Compilation is timed apart: two untimed warm-up calls (inductor's on-disk cache can make them quick).
    assert len(compiled.warmup_seconds) == 2 and compiled.compile_seconds is not None
    assert len(compiled.times) >= 5 and compiled.speedup is not None
    assert compiled.agrees is True, compiled.agreement
    assert compiled.agreement.update_rel_l2 < 1e-3  # float32 reordering, the same dropout masks
    assert any("fallback_random" in note for note in result.notes)  # judged on eager's dropout masks
    assert result.code() == ["model = torch.compile(model)"] or result.best is None


def test_a_forward_that_draws_random_numbers_is_judged_on_eagers_numbers() -> None:
    # A VAE's reparameterisation, `torch.randn_like` in the forward, with no dropout module: compiled, inductor
    # draws other numbers from the same seed, and the compiled step had been called wrong ("the first update is
    # 0.57 times the baseline's").
    torch.manual_seed(0)

    class TinyVAE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder, self.decoder = nn.Linear(16, 8), nn.Linear(4, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mu, log_var = self.encoder(x).chunk(2, dim=1)
            z = mu + torch.randn_like(mu) * torch.exp(0.5 * log_var)
            return self.decoder(z)

    model = TinyVAE()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(8, 16)

    result = probe_compiled(supervised(model, opt, lambda: (x, x), F.mse_loss), steps=3)
    compiled = result.option("compile")
    assert compiled.error is None, compiled.error
    assert compiled.agrees is True, compiled.agreement
    assert any("randn_like" in note and "fallback_random" in note for note in result.notes), result.notes
