"""%batchprobe on real training code in a real IPython shell, as a new user writes it (issue 14).

Each case is a notebook habit that used to give a wrong answer: gradients left by an earlier cell, a step that
keeps its outputs, a BatchNorm model whose --start does not fit, a hook that keeps the last output, a step that
ignores batch_size, a dataset held in the notebook; and the three real models of the bench, whose answers must
be exact in at most six search trials. Truth is brute force: the same step on a freshly built copy of the
training state, run under an independent CPU budget.
"""

from __future__ import annotations

import gc
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

from jupyter_gpu.batchprobe.budget import TensorBudget
from jupyter_gpu.batchprobe.result import BatchProbeResult
from jupyter_gpu.rendering.units import format_bytes

MiB = 2**20

IMPORTS = "import torch\nfrom torch import nn\nF = nn.functional\n"


def probe(ip: InteractiveShell, line: str) -> BatchProbeResult:
    result = ip.run_line_magic("batchprobe", f"{line} -o -q")
    assert isinstance(result, BatchProbeResult)
    return result


def fits_fresh(make: Callable[[], Any], size: int, budget: int, steps: int = 2) -> bool:
    """Brute force: a fresh (model, optimizer, step) from `make`, `steps` calls at `size` under a fresh budget."""
    gc.collect()
    training = make()
    step = training[-1]
    try:
        with TensorBudget(torch, "cpu", budget).trial():
            for _ in range(steps):
                step(size)
        return True
    except torch.OutOfMemoryError:
        return False
    finally:
        del training, step  # the next brute force (or probe) starts with a full collection


def forget(ip: InteractiveShell, *names: str) -> None:
    """Drop the probed objects from the notebook, so the brute force sees the same baseline as the probe."""
    for name in names:
        ip.user_ns.pop(name, None)
    gc.collect()


def assert_exact(result: BatchProbeResult, make: Callable[[], Any], budget: int) -> None:
    answer = result.max_batch_size
    assert answer > 0, result
    assert fits_fresh(make, answer, budget), (answer, result.trials)
    assert not fits_fresh(make, answer + 1, budget), (answer, result.trials)


# -- 1. gradients from an earlier step --------------------------------------------------------------------

MLP_ADAM = IMPORTS + """
def make_mlp(warm=True):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    opt = torch.optim.Adam(model.parameters())
    def step(batch_size):
        opt.zero_grad()
        x = torch.randn(batch_size, 256)
        F.cross_entropy(model(x), torch.randint(0, 10, (batch_size,))).backward()
        opt.step()
    if warm:
        step(8)  # an earlier cell trained once: gradients and Adam moments exist
    return model, opt, step
model, opt, step = make_mlp()
"""


def test_gradients_left_by_an_earlier_step_do_not_lower_the_answer(ip: InteractiveShell) -> None:
    ip.run_cell(MLP_ADAM).raise_error()
    assert all(p.grad is not None for p in ip.user_ns["model"].parameters())
    with_old_gradients = probe(ip, "step --max-memory 48MiB")
    ip.run_cell("opt.zero_grad()").raise_error()
    without = probe(ip, "step --max-memory 48MiB")
    assert with_old_gradients.max_batch_size == without.max_batch_size
    make = ip.user_ns["make_mlp"]
    forget(ip, "model", "opt", "step")
    assert_exact(with_old_gradients, make, 48 * MiB)


def test_gradients_a_step_keeps_are_counted(ip: InteractiveShell) -> None:
    # No zero_grad: the gradients accumulate, so they are live through every step and must be counted.
    ip.run_cell(MLP_ADAM.replace("        opt.zero_grad()\n", "")).raise_error()
    result = probe(ip, "step --max-memory 48MiB")
    make = ip.user_ns["make_mlp"]
    forget(ip, "model", "opt", "step")
    assert_exact(result, make, 48 * MiB)


# -- 2. a step that leaks -------------------------------------------------------------------------------

LEAK = IMPORTS + """
model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
opt = torch.optim.Adam(model.parameters())
losses = []
def step(batch_size):
    opt.zero_grad()
    out = model(torch.randn(batch_size, 128))
    out.square().mean().backward()
    opt.step()
    losses.append(out)  # the classic notebook leak: every call's output stays alive
"""


def test_a_step_that_keeps_its_outputs_is_called_a_leak_not_a_budget(ip: InteractiveShell) -> None:
    ip.run_cell(LEAK).raise_error()
    result = probe(ip, "step --max-memory 64MiB")
    assert result.limited_by == "leak"
    assert result.max_batch_size == 0 and result.recommended == 0
    assert len(result.trials) <= 3, [(t.batch_size, t.how) for t in result.trials]
    leak = result.leak
    assert leak is not None and leak["bytes_per_call"] == leak["batch_size"] * 10 * 4  # one float32 output
    assert [h["name"] for h in leak["holders"]] == ["losses"]
    text = str(result)
    assert "the step leaks memory" in text and f"after every call at batch {leak['batch_size']}" in text
    assert "losses.append(loss.item())" in text and ".detach()" in text
    assert "runs out of" not in text and "no batch size fits" not in text


# -- 3. never below --start -------------------------------------------------------------------------------

BATCHNORM = IMPORTS + """
bn_model = nn.Sequential(nn.Linear(64, 4096), nn.BatchNorm1d(4096), nn.ReLU(), nn.Linear(4096, 10))
sgd = torch.optim.SGD(bn_model.parameters(), lr=0.1, momentum=0.9)
def step(batch_size):
    sgd.zero_grad()
    F.cross_entropy(bn_model(torch.randn(batch_size, 64)), torch.randint(0, 10, (batch_size,))).backward()
    sgd.step()
"""


def test_a_start_that_does_not_fit_is_reported_and_batch_size_one_is_never_run(ip: InteractiveShell) -> None:
    # Batch size 1 would raise "Expected more than 1 value per channel when training" inside BatchNorm.
    ip.run_cell(BATCHNORM).raise_error()
    result = probe(ip, "step --max-memory 2MiB")
    assert [t.batch_size for t in result.trials] == [2]
    assert result.limited_by == "nothing fits" and result.max_batch_size == 0
    text = str(result)
    assert text.startswith("batchprobe: nothing fits at --start 2: batch 2 needs more than ")
    assert "the budget is 2.0 MiB" in text and "lower --start" in text


# -- 4. a hook that keeps the last output -----------------------------------------------------------------

HOOK = IMPORTS + """
def make_hooked():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))
    sgd = torch.optim.SGD(net.parameters(), lr=0.1)
    kept = {}
    net[1].register_forward_hook(lambda module, inputs, output: kept.__setitem__("last", output))
    def step(batch_size):
        sgd.zero_grad()
        F.cross_entropy(net(torch.randn(batch_size, 256)), torch.randint(0, 10, (batch_size,))).backward()
        sgd.step()
    return net, sgd, kept, step
net, sgd, kept, step = make_hooked()
"""


def test_a_hook_that_keeps_the_last_output_does_not_carry_one_trial_into_the_next(ip: InteractiveShell) -> None:
    ip.run_cell(HOOK).raise_error()
    result = probe(ip, "step --max-memory 32MiB")
    make = ip.user_ns["make_hooked"]
    forget(ip, "net", "sgd", "kept", "step")
    assert_exact(result, make, 32 * MiB)
    assert result.leftovers, "the hook's tensor outlives every trial"
    assert {h["name"] for h in result.leftovers[-1]["holders"]} == {"kept"}
    assert "something outside the step holds tensors between calls: kept" in str(result)


# -- 5. a step that does not use batch_size ---------------------------------------------------------------

IGNORES = IMPORTS + """
small = nn.Linear(32, 2)
sgd = torch.optim.SGD(small.parameters(), lr=0.1)
data = torch.randn(64, 32)  # a 64-sample dataset: data[:batch_size] is never more than 64 rows
def step(batch_size):
    sgd.zero_grad()
    small(data[:batch_size]).sum().backward()
    sgd.step()
"""


def test_a_step_that_ignores_batch_size_is_named_and_the_cap_is_not_a_capacity(ip: InteractiveShell) -> None:
    ip.run_cell(IGNORES).raise_error()
    result = probe(ip, "step --max-memory 64MiB")
    assert result.limited_by == "ignores batch_size"
    assert result.max_batch_size == 0 and result.recommended == 0
    text = str(result)
    assert "the step apparently ignores batch_size" in text and "is not a capacity" in text
    assert "max batch size 65536" not in text


# -- 6. the starting memory, explained ------------------------------------------------------------------

CNN = IMPORTS + """
from torch.utils.data import TensorDataset

class Block(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
    def forward(self, x):
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))

def make_cnn():
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                        Block(16), Block(16), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    sgd = torch.optim.SGD(cnn.parameters(), lr=0.1, momentum=0.9)
    def step(batch_size):
        sgd.zero_grad()
        x = torch.randn(batch_size, 3, 32, 32)
        F.cross_entropy(cnn(x), torch.randint(0, 10, (batch_size,))).backward()
        sgd.step()
    return cnn, sgd, step
cnn, sgd, step = make_cnn()
"""


def test_the_starting_memory_is_explained_and_the_advice_to_leave_data_out_works(ip: InteractiveShell) -> None:
    ip.run_cell(CNN + "ds = TensorDataset(torch.randn(2048, 3, 32, 32), torch.randint(0, 10, (2048,)))\n"
                ).raise_error()
    data_bytes = 2048 * 3 * 32 * 32 * 4 + 2048 * 8
    with_data = probe(ip, "step --max-memory 48MiB")
    largest = with_data.baseline[0]
    assert (largest["name"], largest["bytes"]) == ("ds", data_bytes)
    assert "cnn" in [h["name"] for h in with_data.baseline]
    advice = f"--max-memory {format_bytes(48 * MiB + data_bytes)}"
    assert advice in str(with_data) and "to leave it out" in str(with_data)
    following = probe(ip, f"step --max-memory {48 * MiB + data_bytes}")
    forget(ip, "ds")
    without_data = probe(ip, "step --max-memory 48MiB")
    assert following.max_batch_size == without_data.max_batch_size > with_data.max_batch_size


# -- 7. the bench's real models: exact, in at most six search trials ---------------------------------------

TRANSFORMER = IMPORTS + """
def make_transformer():
    torch.manual_seed(0)
    embed = nn.Embedding(256, 64)
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 256, batch_first=True, dropout=0.1), 2)
    head = nn.Linear(64, 256)
    lm = nn.ModuleDict({"embed": embed, "encoder": encoder, "head": head})
    adamw = torch.optim.AdamW(lm.parameters(), lr=1e-3)
    def step(batch_size):
        adamw.zero_grad()
        tokens = torch.randint(0, 256, (batch_size, 32))
        logits = lm["head"](lm["encoder"](lm["embed"](tokens)))
        F.cross_entropy(logits.reshape(-1, 256), tokens.reshape(-1)).backward()
        adamw.step()
    return lm, adamw, step
lm, adamw, step = make_transformer()
"""

MODELS = {
    "mlp-adam": (MLP_ADAM, "make_mlp", ("model", "opt", "step"), 48 * MiB),
    "resnet-style-cnn": (CNN, "make_cnn", ("cnn", "sgd", "step"), 96 * MiB),
    "transformer": (TRANSFORMER, "make_transformer", ("lm", "adamw", "step"), 96 * MiB),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_real_models_get_the_exact_answer_in_at_most_six_search_trials(ip: InteractiveShell, name: str) -> None:
    source, maker, names, budget = MODELS[name]
    ip.run_cell(source).raise_error()
    result = probe(ip, f"step --max-memory {budget}")
    path = [(t.batch_size, t.fitted, t.how) for t in result.trials]
    assert result.limited_by == "memory", path
    assert result.search_trials <= 6, path
    assert len(result.trials) <= 7, path
    make = ip.user_ns[maker]
    forget(ip, *names)
    assert_exact(result, make, budget)


# -- the peers' cases -------------------------------------------------------------------------------------


def test_schedulers_and_learning_rates_are_put_back_and_nothing_is_written_to_disk(
        ip: InteractiveShell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Lightning's finder saves and restores a checkpoint file; the probe keeps its copies in memory.
    work, temporary = tmp_path / "cwd", tmp_path / "tmp"
    work.mkdir()
    temporary.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    ip.run_cell(MLP_ADAM + """
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
def step_with_schedule(batch_size):
    step(batch_size)
    sched.step()
lrs_before = (sched.get_last_lr(), [g["lr"] for g in opt.param_groups], sched.last_epoch)
""").raise_error()
    probe(ip, "step_with_schedule --max-memory 48MiB")
    ns = ip.user_ns
    assert (ns["sched"].get_last_lr(), [g["lr"] for g in ns["opt"].param_groups],
            ns["sched"].last_epoch) == ns["lrs_before"]
    assert list(work.iterdir()) == [] and list(temporary.iterdir()) == []
    assert not any(name.endswith(".ckpt") for name in os.listdir(work))


KEEPS_A_SCALAR = IMPORTS + """
torch.manual_seed(0)
net = nn.Linear(64, 10)
sgd = torch.optim.SGD(net.parameters(), lr=0.1)
last = {}
def step(batch_size):
    sgd.zero_grad()
    loss = F.cross_entropy(net(torch.randn(batch_size, 64)), torch.randint(0, 10, (batch_size,)))
    loss.backward()
    sgd.step()
    last["loss"] = loss.detach()  # the last loss for logging: a 4-byte scalar outlives each trial
"""


def test_a_scalar_kept_between_calls_is_not_reported(ip: InteractiveShell) -> None:
    ip.run_cell(KEEPS_A_SCALAR).raise_error()
    result = probe(ip, "step --max-memory 8MiB")
    forget(ip, "net", "sgd", "last", "step")
    assert result.max_batch_size > 0
    assert result.leftovers == [] and "between calls" not in str(result)


ACCUMULATES = IMPORTS + """
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
sgd = torch.optim.SGD(net.parameters(), lr=0.1)
def step(batch_size):  # gradient accumulation: 4 micro-batches of batch_size, one optimizer step
    sgd.zero_grad()
    for _ in range(4):
        loss = F.cross_entropy(net(torch.randn(batch_size, 64)), torch.randint(0, 10, (batch_size,))) / 4
        loss.backward()
    sgd.step()
"""


def test_an_accumulating_step_counts_every_micro_batch_in_samples_per_second(ip: InteractiveShell) -> None:
    ip.run_cell(ACCUMULATES).raise_error()
    result = probe(ip, "step --max-memory 8MiB")
    forget(ip, "net", "sgd", "step")
    fitted = [t for t in result.trials if t.fitted]
    assert fitted and all(t.batches == 4 for t in fitted)
    assert all(t.samples_per_second == pytest.approx(4 * t.batch_size / t.step_seconds) for t in fitted)
    assert "Each call of the step trains 4 batches of the size tried" in str(result)
