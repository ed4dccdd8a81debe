"""Issue 50, cause 1 (%speedprobe): the options apply to what the step reaches through the helper functions,
closures and closure factories it calls, not only to what it names. Neighbours of the DQN and LBFGS patterns, each
written as its public source writes it, in a real IPython shell on real CPU torch.
"""

from __future__ import annotations

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from jupyter_gpu.speedprobe.catalog import adopt_lines
from jupyter_gpu.speedprobe.result import SpeedProbeResult

NOT_FOUND = ("no torch.optim optimizer was found", "no torch.nn.Module was found")


def speedprobe(ip: InteractiveShell, line: str) -> SpeedProbeResult:
    with capture_output():
        result = ip.run_line_magic("speedprobe", f"{line} -o -q")
    assert isinstance(result, SpeedProbeResult)
    return result


def weights(ip: InteractiveShell, *names: str) -> list[torch.Tensor]:
    return [tensor.detach().clone() for name in names for tensor in ip.user_ns[name].state_dict().values()]


def assert_unchanged(before: list[torch.Tensor], after: list[torch.Tensor]) -> None:
    assert len(before) == len(after) and all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


# -- 1. PyTorch's DQN tutorial: the loop body calls optimize_model(), which uses the notebook's optimizer -----------
# pytorch/tutorials intermediate_source/reinforcement_q_learning.py (https://pytorch.org/tutorials/intermediate/
# reinforcement_q_learning.html): ReplayMemory over a deque, select_action() reading the global steps_done and
# policy_net, optimize_model() using the globals memory, policy_net, target_net and optimizer, and the soft update of
# target_net in the loop body. The env is a fixed random walk here (no gymnasium).
DQN = """
import math, random
from collections import namedtuple, deque
import torch
import torch.nn as nn
import torch.optim as optim

Transition = namedtuple('Transition', ('state', 'action', 'next_state', 'reward'))

class ReplayMemory(object):
    def __init__(self, capacity):
        self.memory = deque([], maxlen=capacity)
    def push(self, *args):
        self.memory.append(Transition(*args))
    def sample(self, batch_size):
        return random.sample(self.memory, batch_size)
    def __len__(self):
        return len(self.memory)

class DQN(nn.Module):
    def __init__(self, n_observations, n_actions):
        super(DQN, self).__init__()
        self.layer1 = nn.Linear(n_observations, 64)
        self.layer2 = nn.Linear(64, 64)
        self.layer3 = nn.Linear(64, n_actions)
    def forward(self, x):
        x = torch.relu(self.layer1(x))
        x = torch.relu(self.layer2(x))
        return self.layer3(x)

BATCH_SIZE, GAMMA, EPS_START, EPS_END, EPS_DECAY, TAU, LR = 32, 0.99, 0.9, 0.05, 1000, 0.005, 1e-4
n_actions, n_observations = 2, 4
torch.manual_seed(0); random.seed(0)
policy_net = DQN(n_observations, n_actions)
target_net = DQN(n_observations, n_actions)
target_net.load_state_dict(policy_net.state_dict())
optimizer = optim.AdamW(policy_net.parameters(), lr=LR, amsgrad=True)
memory = ReplayMemory(10000)
steps_done = 0

def select_action(state):
    global steps_done
    sample = random.random()
    eps_threshold = EPS_END + (EPS_START - EPS_END) * math.exp(-1. * steps_done / EPS_DECAY)
    steps_done += 1
    if sample > eps_threshold:
        with torch.no_grad():
            return policy_net(state).max(1).indices.view(1, 1)
    return torch.tensor([[random.randrange(n_actions)]], dtype=torch.long)

def optimize_model():
    if len(memory) < BATCH_SIZE:
        return
    transitions = memory.sample(BATCH_SIZE)
    batch = Transition(*zip(*transitions))
    non_final_mask = torch.tensor(tuple(map(lambda s: s is not None, batch.next_state)), dtype=torch.bool)
    non_final_next_states = torch.cat([s for s in batch.next_state if s is not None])
    state_batch = torch.cat(batch.state)
    action_batch = torch.cat(batch.action)
    reward_batch = torch.cat(batch.reward)
    state_action_values = policy_net(state_batch).gather(1, action_batch)
    next_state_values = torch.zeros(BATCH_SIZE)
    with torch.no_grad():
        next_state_values[non_final_mask] = target_net(non_final_next_states).max(1).values
    expected_state_action_values = (next_state_values * GAMMA) + reward_batch
    criterion = nn.SmoothL1Loss()
    loss = criterion(state_action_values, expected_state_action_values.unsqueeze(1))
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_value_(policy_net.parameters(), 100)
    optimizer.step()
    return loss

state = torch.randn(1, n_observations)
for _ in range(BATCH_SIZE):
    memory.push(state, torch.tensor([[0]]), torch.randn(1, n_observations), torch.tensor([1.0]))

def train_step():
    global state
    action = select_action(state)
    observation, reward = torch.randn(1, n_observations), torch.tensor([1.0])
    memory.push(state, action, observation, reward)
    state = observation
    loss = optimize_model()
    target_net_state_dict = target_net.state_dict()
    policy_net_state_dict = policy_net.state_dict()
    for key in policy_net_state_dict:
        target_net_state_dict[key] = policy_net_state_dict[key]*TAU + target_net_state_dict[key]*(1-TAU)
    target_net.load_state_dict(target_net_state_dict)
    return loss
"""


def test_dqn_loop_body_reaches_the_optimizer_through_optimize_model(ip: InteractiveShell) -> None:
    ip.run_cell(DQN).raise_error()
    ip.run_cell("train_step()").raise_error()
    before = weights(ip, "policy_net", "target_net")
    steps_done = ip.user_ns["steps_done"]
    result = speedprobe(ip, "train_step --try fused-optimizer --steps 2")
    fused = result.option("fused-optimizer")
    assert fused.skipped is None or not fused.skipped.startswith(NOT_FOUND), fused.skipped
    assert "fused-optimizer: optimizer (AdamW): fused=True" in result.notes
    assert_unchanged(before, weights(ip, "policy_net", "target_net"))
    assert ip.user_ns["steps_done"] == steps_done and len(ip.user_ns["memory"]) == 33


# -- 2. PyTorch's neural-style-transfer tutorial: LBFGS with a closure that runs the notebook's cnn -----------------
# pytorch/tutorials advanced_source/neural_style_tutorial.py (https://pytorch.org/tutorials/advanced/
# neural_style_tutorial.html): `optimizer = optim.LBFGS([input_img])`, `run = [0]`, and a `closure()` that clamps the
# image, zeroes the gradients, runs the features network and returns the loss; `optimizer.step(closure)`. Here the
# closure is a notebook function (as the tutorial's cells are often flattened) and the features network a small CNN.
NEURAL_STYLE = """
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

torch.manual_seed(0)
cnn = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU()).eval()
cnn.requires_grad_(False)
content_img, style_img = torch.rand(1, 3, 32, 32), torch.rand(1, 3, 32, 32)

def gram_matrix(input):
    a, b, c, d = input.size()
    features = input.view(a * b, c * d)
    G = torch.mm(features, features.t())
    return G.div(a * b * c * d)

content_target = cnn(content_img).detach()
style_target = gram_matrix(cnn(style_img)).detach()
input_img = content_img.clone().requires_grad_(True)
optimizer = optim.LBFGS([input_img], max_iter=2)
style_weight, content_weight = 1e6, 1
run = [0]

def closure():
    with torch.no_grad():
        input_img.clamp_(0, 1)
    optimizer.zero_grad()
    features = cnn(input_img)
    style_score = F.mse_loss(gram_matrix(features), style_target)
    content_score = F.mse_loss(features, content_target)
    loss = style_weight * style_score + content_weight * content_score
    loss.backward()
    run[0] += 1
    return style_score + content_score

def style_step():
    return optimizer.step(closure)
"""


def test_an_lbfgs_closure_reaches_the_notebooks_cnn(ip: InteractiveShell) -> None:
    ip.run_cell(NEURAL_STYLE).raise_error()
    image = ip.user_ns["input_img"].detach().clone()
    result = speedprobe(ip, "style_step --try channels-last --steps 2")
    channels_last = result.option("channels-last")
    assert channels_last.skipped is None or not channels_last.skipped.startswith(NOT_FOUND), channels_last.skipped
    assert torch.equal(ip.user_ns["input_img"].detach(), image) and ip.user_ns["run"] == [0]


# -- 3. a GAN step split into helpers, as the DCGAN-style repositories write it ------------------------------------
# The update of pytorch/tutorials beginner_source/dcgan_faces_tutorial.py (netG, netD, optimizerD, optimizerG,
# BCELoss, real_label/fake_label) split into a discriminator step and a generator step, as in
# lyeoni/pytorch-mnist-GAN pytorch-mnist-GAN.ipynb (`def D_train(x)`, `def G_train(x)` using the notebook's globals
# D, G, D_optimizer, G_optimizer, criterion); the loop body names only netG itself.
GAN = """
import torch
import torch.nn as nn
import torch.optim as optim

torch.manual_seed(0)
nz, batch_size = 16, 32
netG = nn.Sequential(nn.Linear(nz, 64), nn.ReLU(), nn.Linear(64, 32), nn.Tanh())
netD = nn.Sequential(nn.Linear(32, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1), nn.Sigmoid())
criterion = nn.BCELoss()
optimizerD = optim.Adam(netD.parameters(), lr=0.0002, betas=(0.5, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=0.0002, betas=(0.5, 0.999))
real_label, fake_label = 1., 0.
real_batch = torch.rand(batch_size, 32) * 2 - 1

def D_train(real, fake):
    netD.zero_grad()
    label = torch.full((real.size(0),), real_label)
    errD_real = criterion(netD(real).view(-1), label)
    errD_real.backward()
    label.fill_(fake_label)
    errD_fake = criterion(netD(fake.detach()).view(-1), label)
    errD_fake.backward()
    optimizerD.step()
    return errD_real + errD_fake

def G_train(fake):
    netG.zero_grad()
    label = torch.full((fake.size(0),), real_label)
    errG = criterion(netD(fake).view(-1), label)
    errG.backward()
    optimizerG.step()
    return errG

def gan_step():
    noise = torch.randn(batch_size, nz)
    fake = netG(noise)
    D_train(real_batch, fake)
    return G_train(fake)
"""


def test_a_gan_step_reaches_both_optimizers_and_the_discriminator_through_its_helpers(ip: InteractiveShell) -> None:
    ip.run_cell(GAN).raise_error()
    before = weights(ip, "netG", "netD")
    result = speedprobe(ip, "gan_step --try fused-optimizer --steps 2")
    fused = result.option("fused-optimizer")
    assert fused.skipped is None or not fused.skipped.startswith(NOT_FOUND), fused.skipped
    assert sorted(note for note in result.notes if "fused=True" in note) == [
        "fused-optimizer: optimizerD (Adam): fused=True", "fused-optimizer: optimizerG (Adam): fused=True"]
    assert sorted(adopt_lines(("compile",), result.code_context)) == [
        "netD = torch.compile(netD)", "netG = torch.compile(netG)"]
    assert_unchanged(before, weights(ip, "netG", "netD"))


# -- 4. a closure factory: make_train_step_fn(model, loss_fn, optimizer) -------------------------------------------
# dvgodoy/PyTorchStepByStep (Deep Learning with PyTorch Step-by-Step), helpers.py / Chapter 2:
# `def make_train_step_fn(model, loss_fn, optimizer): def perform_train_step_fn(x, y): ... return
# perform_train_step_fn` and `train_step_fn = make_train_step_fn(model, loss_fn, optimizer)`; the notebook also
# still holds an earlier experiment's model and optimizer, which the step never touches.
FACTORY = """
import torch
import torch.nn as nn
import torch.optim as optim

torch.manual_seed(42)
x_train, y_train = torch.rand(80, 1), torch.rand(80, 1)
baseline = nn.Sequential(nn.Linear(1, 1))
baseline_optimizer = optim.SGD(baseline.parameters(), lr=0.1)

def make_train_step_fn(model, loss_fn, optimizer):
    def perform_train_step_fn(x, y):
        model.train()
        yhat = model(x)
        loss = loss_fn(yhat, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()
    return perform_train_step_fn

model = nn.Sequential(nn.Linear(1, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = optim.Adam(model.parameters(), lr=0.1)
loss_fn = nn.MSELoss(reduction='mean')
train_step_fn = make_train_step_fn(model, loss_fn, optimizer)

def step():
    return train_step_fn(x_train, y_train)
"""


def test_a_closure_factorys_step_gets_the_options_for_its_own_model_only(ip: InteractiveShell) -> None:
    ip.run_cell(FACTORY).raise_error()
    before = weights(ip, "model", "baseline")
    result = speedprobe(ip, "step --try fused-optimizer --steps 2")
    assert [note for note in result.notes if "fused=True" in note] == ["fused-optimizer: optimizer (Adam): fused=True"]
    assert sorted(adopt_lines(("fused-optimizer", "compile"), result.code_context)) == [
        "model = torch.compile(model)",
        "optimizer = torch.optim.Adam(model.parameters(), fused=True)  # keep your other arguments"]
    assert_unchanged(before, weights(ip, "model", "baseline"))


@pytest.mark.parametrize("source", [DQN, GAN])
def test_the_walk_never_runs_a_property_of_the_users_objects(ip: InteractiveShell, source: str) -> None:
    # A Trainer-like object with a property that would train a step if read: the discovery must not read it.
    ip.run_cell(source + """
class Holder:
    calls = 0
    @property
    def trained(self):
        Holder.calls += 1
        raise RuntimeError("a property was read")
holder = Holder()
""").raise_error()
    step = "train_step" if source is DQN else "gan_step"
    ip.run_cell(f"_probe_step = {step}\ndef {step}():\n    holder\n    return _probe_step()").raise_error()
    speedprobe(ip, f"{step} --try fused-optimizer --steps 2")
    assert ip.user_ns["Holder"].calls == 0


# -- 5. makemore: the minibatch is drawn with a notebook-global torch.Generator -------------------------------------
# karpathy/nn-zero-to-hero lectures/makemore/makemore_part3_bn.ipynb: `g = torch.Generator().manual_seed(2147483647)`,
# the parameters drawn with `generator=g`, and each training step's minibatch `ix = torch.randint(0, Xtr.shape[0],
# (batch_size,), generator=g)`; here the loop body is a function with an nn.Module and an optimizer.
MAKEMORE = """
import torch
import torch.nn as nn
import torch.nn.functional as F

g = torch.Generator().manual_seed(2147483647)
Xtr, Ytr = torch.randint(0, 27, (1000, 3), generator=g), torch.randint(0, 27, (1000,), generator=g)
model = nn.Sequential(nn.Embedding(27, 10), nn.Flatten(), nn.Linear(30, 64), nn.Tanh(), nn.Linear(64, 27))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
batch_size = 32

def train_step():
    ix = torch.randint(0, Xtr.shape[0], (batch_size,), generator=g)
    Xb, Yb = Xtr[ix], Ytr[ix]
    loss = F.cross_entropy(model(Xb), Yb)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss
"""


def test_the_notebooks_generator_the_step_draws_batches_with_is_put_back(ip: InteractiveShell) -> None:
    ip.run_cell(MAKEMORE).raise_error()
    state = ip.user_ns["g"].get_state().clone()
    speedprobe(ip, "train_step --try fused-optimizer --steps 2")
    assert torch.equal(ip.user_ns["g"].get_state(), state), "g moved: the next minibatch is not the one it would be"
