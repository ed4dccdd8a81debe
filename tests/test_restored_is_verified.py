"""Issue 50, cause 2: a probe's "restored ... exactly as before" is checked, not meant.

Each neighbour below is a notebook pattern from real public code in which the probe's step or loader reaches
something that moves during the probe (a generator on a dataset inside a `random_split`, a collator's generator, a
notebook-global rng the dataset uses, an optimizer or LR scheduler held only by a helper's closure). Whether the
probe manages to put it back or not, the report must be true: what the test itself sees moved is named, with what
moved, as not restored, and never included in "exactly as before". Real IPython shell, real CPU torch, real
DataLoaders (one case with a worker process), real probes through their magics; nothing under test is mocked.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

# A tiny model and a training step on the batches the loader yields; every data neighbour reuses it.
DATA_STEP = """
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, random_split

torch.manual_seed(0)
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

def train_step(batch):
    x, y = batch
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss
"""


def restored_row(text: str) -> str:
    """The report's "restored" line ('' when it has none)."""
    return next((line for line in text.splitlines() if line.strip().startswith("restored")), "")


def assert_truthful(text: str, moved: bool, warning: str, claimed_name: str | None = None) -> None:
    """What moved is named (by `warning`, a regex) and not claimed restored; what did not move is not warned about."""
    named = re.search(warning, text)
    if moved:
        assert named is not None, f"{warning!r} moved during the probe and the report does not say so:\n{text}"
        if claimed_name is not None:
            assert not re.search(rf"(?<![\w.]){re.escape(claimed_name)}(?![\w.])", restored_row(text)), text
    else:
        assert named is None, f"the report warns about something that is back as it was:\n{text}"


def numpy_state(generator: np.random.Generator) -> str:
    return repr(generator.bit_generator.state)


def dataprobe(ip: InteractiveShell, workers: str = "0") -> str:
    result = ip.run_line_magic("dataprobe", f"loader --step train_step --workers {workers} --seconds 2 -o -q")
    return str(result)


# -- %dataprobe --------------------------------------------------------------------------------------------------


def test_a_numpy_generator_on_the_dataset_inside_random_split(ip: InteractiveShell) -> None:
    # A dataset that augments with a Generator it holds, as NumPy's documented usage asks ("call default_rng to
    # get a new instance of a Generator, then call its methods", https://numpy.org/doc/stable/reference/random/
    # index.html), split for validation with torch.utils.data.random_split as PyTorch's docs show
    # (https://pytorch.org/docs/stable/data.html#torch.utils.data.random_split): the loader holds a Subset, whose
    # .dataset holds the generator.
    ip.run_cell(DATA_STEP).raise_error()
    ip.run_cell("""
class NoisyPoints(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 8, generator=g)
        self.y = (self.x.sum(1) > 0).long()
        self.rng = np.random.default_rng(seed)
    def __len__(self):
        return len(self.y)
    def __getitem__(self, i):
        noise = torch.from_numpy(self.rng.normal(0.0, 0.1, 8).astype(np.float32))
        return self.x[i] + noise, self.y[i]

full_ds = NoisyPoints(512, seed=0)
train_ds, val_ds = random_split(full_ds, [448, 64], generator=torch.Generator().manual_seed(42))
loader = DataLoader(train_ds, batch_size=32, shuffle=True)
""").raise_error()
    before = numpy_state(ip.user_ns["full_ds"].rng)
    text = dataprobe(ip)
    moved = numpy_state(ip.user_ns["full_ds"].rng) != before
    assert_truthful(text, moved, r"\brng \(NumPy Generator\): advanced, not restored")


def test_a_torch_generator_on_a_collator_object(ip: InteractiveShell) -> None:
    # Shaped like transformers' DataCollatorForLanguageModeling (huggingface/transformers,
    # src/transformers/data/data_collator.py: `collate_fn=data_collator`, masking with torch.bernoulli on the
    # collator's own `self.generator` when a seed is given); no transformers import, a collator of its shape.
    ip.run_cell("""
import torch
from torch import nn
from torch.utils.data import DataLoader

MASK_ID, VOCAB = 1, 50
torch.manual_seed(0)
sentences = [{"input_ids": torch.randint(2, VOCAB, (12,))} for _ in range(256)]

class MaskingCollator:
    def __init__(self, mlm_probability=0.15, seed=0):
        self.mlm_probability = mlm_probability
        self.generator = torch.Generator().manual_seed(seed)
    def __call__(self, examples):
        input_ids = torch.stack([e["input_ids"] for e in examples])
        labels = input_ids.clone()
        masked = torch.bernoulli(torch.full(labels.shape, self.mlm_probability), generator=self.generator).bool()
        labels[~masked] = -100
        input_ids = input_ids.masked_fill(masked, MASK_ID)
        return {"input_ids": input_ids, "labels": labels}

collator = MaskingCollator(seed=0)
loader = DataLoader(sentences, batch_size=16, shuffle=True, collate_fn=collator)
model = nn.Sequential(nn.Embedding(VOCAB, 16), nn.Linear(16, VOCAB))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

def train_step(batch):
    opt.zero_grad()
    logits = model(batch["input_ids"])
    loss = nn.functional.cross_entropy(logits.view(-1, VOCAB), batch["labels"].view(-1), ignore_index=-100)
    loss.backward()
    opt.step()
    return loss
""").raise_error()
    before = ip.user_ns["collator"].generator.get_state()
    text = dataprobe(ip)
    moved = not torch.equal(ip.user_ns["collator"].generator.get_state(), before)
    assert_truthful(text, moved, r"\bgenerator \(torch Generator\): advanced, not restored")


def test_a_notebook_global_rng_the_datasets_getitem_uses(ip: InteractiveShell) -> None:
    # One process-wide `rng = np.random.default_rng()` that the data code draws from (tomcur/intervention,
    # intervention/process.py: "Holds some per-process state, such as Random Number Generators"); here the
    # notebook's own, used in __getitem__ for a random horizontal flip. One worker too: its copy moves in the
    # worker, the kernel's in the num_workers=0 trials.
    ip.run_cell(DATA_STEP).raise_error()
    ip.run_cell("""
rng = np.random.default_rng(1234)

class FlippedImages(Dataset):
    def __init__(self, n):
        self.x = torch.randn(n, 8)
        self.y = torch.randint(0, 2, (n,))
    def __len__(self):
        return len(self.y)
    def __getitem__(self, i):
        x = self.x[i]
        if rng.random() < 0.5:
            x = x.flip(0)
        return x, self.y[i]

loader = DataLoader(FlippedImages(512), batch_size=32, shuffle=True)
""").raise_error()
    before = numpy_state(ip.user_ns["rng"])
    text = dataprobe(ip, workers="0,1")
    moved = numpy_state(ip.user_ns["rng"]) != before
    assert_truthful(text, moved, r"(?<![\w.])rng \(NumPy Generator\): advanced, not restored")


# -- %speedprobe and %batchprobe: what a helper's closure holds ---------------------------------------------------

# dvgodoy/PyTorchStepByStep, helpers.py: `make_train_step(model, loss_fn, optimizer)` returns
# `perform_train_step`, a closure over the three; the book's notebooks (and e.g. liuxin85/notebooks,
# model_configuration/v1.py) then call `train_step_fn(x, y)` in the loop.
GODOY = """
import torch
import torch.optim as optim
from torch import nn

def make_train_step_fn(model, loss_fn, optimizer, scheduler=None):
    def perform_train_step_fn(x, y):
        model.train()
        yhat = model(x)
        loss = loss_fn(yhat, y)
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        optimizer.zero_grad()
        return loss.item()
    return perform_train_step_fn

torch.manual_seed(42)
x_train = torch.rand(80, 1)
y_train = 1 + 2 * x_train + 0.1 * torch.randn(80, 1)
model = nn.Sequential(nn.Linear(1, 1))
loss_fn = nn.MSELoss(reduction="mean")
"""


def closure_value(function: Callable[..., Any], kind: type) -> Any:
    return next(cell.cell_contents for cell in function.__closure__ if isinstance(cell.cell_contents, kind))


def adam_state(optimizer: torch.optim.Optimizer) -> list[tuple[str, float]]:
    return [(key, float(value.sum()) if torch.is_tensor(value) else value)
            for entry in optimizer.state.values() for key, value in sorted(entry.items())]


def test_an_optimizer_only_the_helpers_closure_holds_speedprobe(ip: InteractiveShell) -> None:
    # The optimizer is made inline in the call, so no notebook variable names it.
    ip.run_cell(GODOY).raise_error()
    ip.run_cell("""
train_step_fn = make_train_step_fn(model, loss_fn, optim.Adam(model.parameters(), lr=0.1))

def whole_step():
    return train_step_fn(x_train, y_train)
""").raise_error()
    optimizer = closure_value(ip.user_ns["train_step_fn"], torch.optim.Optimizer)
    before = adam_state(optimizer)
    result = ip.run_line_magic("speedprobe", "whole_step --try fused-optimizer --steps 2 -o -q")
    moved = adam_state(optimizer) != before
    assert_truthful(str(result), moved, r"\boptimizer \(Adam\): [^\n]*not restored")


def test_an_lr_scheduler_stepped_inside_the_helper_speedprobe(ip: InteractiveShell) -> None:
    # The same helper stepping an LR scheduler after the optimizer, as PyTorch's docs order it
    # (https://pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate); the scheduler exists only in the
    # closure, the optimizer is a notebook variable.
    ip.run_cell(GODOY).raise_error()
    ip.run_cell("""
optimizer = optim.SGD(model.parameters(), lr=0.1)
train_step_fn = make_train_step_fn(model, loss_fn, optimizer,
                                   optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5))

def whole_step():
    return train_step_fn(x_train, y_train)
""").raise_error()
    scheduler = closure_value(ip.user_ns["train_step_fn"], torch.optim.lr_scheduler.LRScheduler)
    before = scheduler.last_epoch
    result = ip.run_line_magic("speedprobe", "whole_step --try fused-optimizer --steps 2 -o -q")
    moved = scheduler.last_epoch != before
    assert_truthful(str(result), moved, r"\bscheduler \(StepLR\): [^\n]*not restored")


def test_an_optimizer_only_the_helpers_closure_holds_batchprobe(ip: InteractiveShell) -> None:
    ip.run_cell(GODOY).raise_error()
    ip.run_cell("""
train_step_fn = make_train_step_fn(model, loss_fn, optim.Adam(model.parameters(), lr=0.1))

def sized_step(batch_size):
    x = torch.rand(batch_size, 1)
    return train_step_fn(x, 1 + 2 * x)
""").raise_error()
    optimizer = closure_value(ip.user_ns["train_step_fn"], torch.optim.Optimizer)
    before = adam_state(optimizer)
    result = ip.run_line_magic("batchprobe", "sized_step --max-memory 8MiB --max-seconds 10 -o -q")
    moved = adam_state(optimizer) != before
    assert_truthful(str(result), moved, r"\boptimizer \(Adam\): [^\n]*not restored")


def test_a_replay_memory_sampling_with_its_own_generator_speedprobe(ip: InteractiveShell) -> None:
    # PyTorch's DQN tutorial (pytorch/tutorials, intermediate_source/reinforcement_q_learning.py): a ReplayMemory
    # of Transitions in a deque, and `optimize_model()` that samples a batch from it and steps the notebook's
    # optimizer. Here the memory samples with a Generator of its own, as NumPy's documented usage asks
    # (https://numpy.org/doc/stable/reference/random/index.html): the probe's calls advance it, and nothing in the
    # probe's snapshot puts a generator the step reaches back.
    ip.run_cell("""
import random
from collections import deque, namedtuple
import numpy as np
import torch
from torch import nn, optim

Transition = namedtuple("Transition", ("state", "action", "next_state", "reward"))

class ReplayMemory:
    def __init__(self, capacity, seed=None):
        self.memory = deque([], maxlen=capacity)
        self.rng = np.random.default_rng(seed)
    def push(self, *args):
        self.memory.append(Transition(*args))
    def sample(self, batch_size):
        return [self.memory[i] for i in self.rng.choice(len(self.memory), batch_size, replace=False)]
    def __len__(self):
        return len(self.memory)

torch.manual_seed(0)
policy_net = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
optimizer = optim.AdamW(policy_net.parameters(), lr=1e-3, amsgrad=True)
memory = ReplayMemory(10000, seed=0)
for _ in range(256):
    memory.push(torch.randn(1, 4), torch.randint(0, 2, (1, 1)), torch.randn(1, 4), torch.randn(1))
BATCH_SIZE, GAMMA = 32, 0.99

def optimize_model():
    transitions = memory.sample(BATCH_SIZE)
    batch = Transition(*zip(*transitions))
    state_batch, action_batch = torch.cat(batch.state), torch.cat(batch.action)
    reward_batch, next_states = torch.cat(batch.reward), torch.cat(batch.next_state)
    state_action_values = policy_net(state_batch).gather(1, action_batch)
    with torch.no_grad():
        next_state_values = policy_net(next_states).max(1).values
    expected = next_state_values * GAMMA + reward_batch
    loss = nn.SmoothL1Loss()(state_action_values, expected.unsqueeze(1))
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_value_(policy_net.parameters(), 100)
    optimizer.step()
    return loss
""").raise_error()
    before = numpy_state(ip.user_ns["memory"].rng)
    result = ip.run_line_magic("speedprobe", "optimize_model --try fused-optimizer --steps 2 -o -q")
    moved = numpy_state(ip.user_ns["memory"].rng) != before
    assert_truthful(str(result), moved, r"\bmemory\.rng \(NumPy Generator\): advanced, not restored")


def test_a_memory_bank_too_large_to_copy_is_named_not_claimed_speedprobe(ip: InteractiveShell) -> None:
    # The instance-discrimination memory bank (zhirongw/lemniscate.pytorch, lib/NCEAverage.py and main.py: one
    # 128-d feature per training image, updated in place for the batch's indices with momentum, `memory.index_copy_(0,
    # y, updated_weight)`), held as a notebook tensor. At 16,384 images it is 2M elements: the probe keeps copies of
    # small tensors only (a counter, a running sum), so this one is not put back, and the report must say so.
    ip.run_cell("""
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
N, DIM, T, MOMENTUM = 16384, 128, 0.07, 0.5
encoder = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, DIM))
optimizer = torch.optim.SGD(encoder.parameters(), lr=0.03, momentum=0.9)
memory_bank = F.normalize(torch.randn(N, DIM), dim=1)
images, indexes = torch.randn(64, 32), torch.randint(0, N, (64,))

def train_step():
    features = F.normalize(encoder(images), dim=1)
    loss = F.cross_entropy(features @ memory_bank.t() / T, indexes)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        updated = memory_bank.index_select(0, indexes) * MOMENTUM + features.detach() * (1 - MOMENTUM)
        memory_bank.index_copy_(0, indexes, F.normalize(updated, dim=1))
    return loss
""").raise_error()
    before = ip.user_ns["memory_bank"].clone()
    result = ip.run_line_magic("speedprobe", "train_step --try fused-optimizer --steps 2 -o -q")
    moved = not torch.equal(ip.user_ns["memory_bank"], before)
    assert_truthful(str(result), moved, r"(?<![\w.])memory_bank \(Tensor\): value changed, not restored",
                    "memory_bank")


# -- the guard: a plain probe still says everything was restored, and it was -----------------------------------


@pytest.mark.parametrize("probe", ["dataprobe", "speedprobe"])
def test_a_plain_probe_says_everything_restored_checked(ip: InteractiveShell, probe: str) -> None:
    ip.run_cell(DATA_STEP).raise_error()
    ip.run_cell("""
sampler_gen = torch.Generator().manual_seed(3)
loader = DataLoader(torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,))),
                    batch_size=32, shuffle=True, generator=sampler_gen)
batch = next(iter(loader))
def whole_step():
    return train_step(batch)
""").raise_error()
    weights = [p.detach().clone() for p in ip.user_ns["model"].parameters()]
    generator = ip.user_ns["sampler_gen"].get_state()
    if probe == "dataprobe":
        text = dataprobe(ip)
        expected = {"model", "opt", "RNG", "sampler"}
    else:
        text = str(ip.run_line_magic("speedprobe", "whole_step --try fused-optimizer --steps 2 -o -q"))
        expected = {"model", "opt", "RNG", "global flags"}
    assert all(torch.equal(a, b) for a, b in zip(weights, ip.user_ns["model"].parameters(), strict=True))
    assert torch.equal(ip.user_ns["sampler_gen"].get_state(), generator)
    row = restored_row(text)
    assert row.endswith("exactly as before"), text
    assert expected <= set(row.split(None, 1)[1].removesuffix(" exactly as before").split(", ")), text
    assert "not restored" not in text, text
