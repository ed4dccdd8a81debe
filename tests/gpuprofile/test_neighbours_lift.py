"""Issue 51, points 1 and 4: every loop %%gpuprofile profiles gets a step the probes can run, and the step returns
the loop's loss. Loops nobody here wrote, taken verbatim from their sources (cited at each); only the data is swapped
for synthetic tensors of the real shapes (sequence lengths and image sizes scaled down for a 2-core CPU) whose
samples take a known time to load, as tests/fixtures/sleepy_data.py does.

For each loop: the step is lifted from the source or, where the source lifter refuses the loop, driven (the user's
own loop run as written, one optimizer step per call); the "Ready steps" commands run as printed, with budget
options added, in the shell; the training state and the notebook's counters are bitwise as before after each probe;
and the step returns the loss.

First run, before the fixes (4 loops and 5 ways of writing the loss, 9 tests): 7 failed. nanoGPT: not lifted ("the
body uses `wandb`, which is not a notebook variable"); timm: not lifted ("the body uses `_backward`, `_forward`,
`_loss`, `torchvision`, which are not a notebook variable"); the HF course loop: lifted, but its step returned None
(`accelerator.backward(loss)` was not read as a backward); the HW11 domain adaptation loop: not lifted (`zip` over
two loaders) and no step at all, only wrappers to fill in; and of the loss forms, the micro-step loop's loss under a
GradScaler, `accelerator.backward(loss)` and a closure's `_backward(loss)` gave nothing (the dict and `.loss` forms
passed).
"""

from __future__ import annotations

import re
import time

import pytest
import torch
from public_loops import NANOGPT_HELPERS, NANOGPT_TRAIN_LOOP
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import Dataset

from jupyter_gpu.gpuprofile.render import render_text


class SleepyImages(Dataset):
    """`length` samples of `shape` float32 noise and a label in [0, classes), each taking `item_seconds` to load."""

    def __init__(self, length: int, shape: tuple[int, ...], item_seconds: float, classes: int = 10) -> None:
        self.length, self.shape, self.item_seconds, self.classes = length, shape, item_seconds, classes

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.item_seconds)
        generator = torch.Generator().manual_seed(index)
        return torch.randn(self.shape, generator=generator), index % self.classes


class SleepyTokens(Dataset):
    """`length` tokenised sentence pairs as a collator pads them (input_ids, attention_mask, labels), each taking
    `item_seconds` to load."""

    def __init__(self, length: int, tokens: int, item_seconds: float, vocab: int = 1000) -> None:
        self.length, self.tokens, self.item_seconds, self.vocab = length, tokens, item_seconds, vocab

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        time.sleep(self.item_seconds)
        generator = torch.Generator().manual_seed(index)
        return {"input_ids": torch.randint(0, self.vocab, (self.tokens,), generator=generator),
                "attention_mask": torch.ones(self.tokens, dtype=torch.long),
                "labels": torch.tensor(index % 2)}


# --- 1. nanoGPT: karpathy/nanoGPT, train.py (commit e2221318), the training loop from `X, Y = get_batch('train')`
# to the end, verbatim: `while True` with an iteration counter, gradient accumulation under a GradScaler
# (`loss = loss / gradient_accumulation_steps`, `scaler.scale(loss).backward()` in a micro-step loop), and
# `if wandb_log: wandb.log(...)` with wandb_log False and no wandb imported. Its config's names as train.py sets
# them; the GPT is a one-layer stand-in with GPT's forward(idx, targets) -> (logits, loss) and estimate_mfu.
NANOGPT = """
import math, os, time
from contextlib import nullcontext
import torch
from torch import nn
from torch.nn import functional as F
torch.manual_seed(1337)
out_dir = 'out'
eval_interval = 2000
log_interval = 1
eval_iters = 2
eval_only = False
always_save_checkpoint = True
wandb_log = False
gradient_accumulation_steps = 4
batch_size = 12
block_size = 64
learning_rate = 6e-4
max_iters = 600000
weight_decay = 1e-1
beta1, beta2 = 0.9, 0.95
grad_clip = 1.0
decay_lr = True
warmup_iters = 2000
lr_decay_iters = 600000
min_lr = 6e-5
device, device_type, dtype = 'cpu', 'cpu', 'float32'
master_process, ddp = True, False
ctx = nullcontext()
iter_num, best_val_loss = 0, 1e9
model_args, config = {}, {}

class GPT(nn.Module):
    def __init__(self, vocab_size=65, n_embd=32):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size)

    def forward(self, idx, targets=None):
        logits = self.lm_head(self.wte(idx))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def estimate_mfu(self, fwdbwd_per_iter, dt):
        return 0.0

def get_batch(split):
    time.sleep(0.001)  # the known cost of making a batch (np.memmap and the copy, in train.py)
    ix = torch.randint(10000 - block_size, (batch_size,))
    x = torch.stack([torch.arange(i, i + block_size) % 65 for i in ix])
    y = torch.stack([torch.arange(i + 1, i + 1 + block_size) % 65 for i in ix])
    x, y = x.to(device), y.to(device)
    return x, y

model = GPT()
scaler = torch.amp.GradScaler('cpu', enabled=(dtype == 'float16'))
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(beta1, beta2))

""" + NANOGPT_HELPERS

NANOGPT_RUN = "%%gpuprofile -o -q --steps 3 --warmup 1\n" + NANOGPT_TRAIN_LOOP


# --- 2. timm: huggingface/pytorch-image-models, train.py (commit 2aabaef0), train_one_epoch(...), verbatim: an epoch
# function whose body defines `def _forward():` and `def _backward(_loss):` and calls them, and a branch that never
# runs (`if args.save_images and output_dir: torchvision.utils.save_image(...)`, no torchvision here). Its module's
# names (`utils`, `model_parameters`, `_logger`) are small stand-ins; 3x32x32 images (timm's CIFAR size), batch 16.
TIMM = """
import logging, os, time
from collections import OrderedDict
from contextlib import suppress
from types import SimpleNamespace
import torch
from torch import nn
from torch.utils.data import DataLoader
torch.manual_seed(42)
_logger = logging.getLogger('train')

class AverageMeter:
    def __init__(self):
        self.val = self.avg = self.sum = self.count = 0
    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

utils = SimpleNamespace(AverageMeter=AverageMeter, is_primary=lambda args: True,
                        dispatch_clip_grad=lambda parameters, value, mode='norm': torch.nn.utils.clip_grad_norm_(
                            parameters, value))

def model_parameters(model, exclude_head=False):
    return model.parameters()

args = SimpleNamespace(mixup_off_epoch=0, prefetcher=False, grad_accum_steps=1, channels_last=False,
                       clip_grad=None, clip_mode='norm', distributed=False, synchronize_step=False, log_interval=50,
                       save_images=False, recovery_interval=0)
model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                      nn.Flatten(), nn.Linear(16, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=2e-5)
train_loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
loader_train = DataLoader(SleepyImages(512, (3, 32, 32), 0.0003), batch_size=16, shuffle=True)
device = torch.device('cpu')
"""

TIMM_FUNCTION = '''
def train_one_epoch(
        epoch,
        model,
        loader,
        optimizer,
        loss_fn,
        args,
        device=torch.device('cuda'),
        lr_scheduler=None,
        saver=None,
        output_dir=None,
        amp_autocast=suppress,
        loss_scaler=None,
        model_ema=None,
        mixup_fn=None,
):
    if args.mixup_off_epoch and epoch >= args.mixup_off_epoch:
        if args.prefetcher and loader.mixup_enabled:
            loader.mixup_enabled = False
        elif mixup_fn is not None:
            mixup_fn.mixup_enabled = False

    second_order = hasattr(optimizer, 'is_second_order') and optimizer.is_second_order
    has_no_sync = hasattr(model, "no_sync")
    update_time_m = utils.AverageMeter()
    data_time_m = utils.AverageMeter()
    losses_m = utils.AverageMeter()

    model.train()

    accum_steps = args.grad_accum_steps
    last_accum_steps = len(loader) % accum_steps
    updates_per_epoch = (len(loader) + accum_steps - 1) // accum_steps
    num_updates = epoch * updates_per_epoch
    last_batch_idx = len(loader) - 1
    last_batch_idx_to_accum = len(loader) - last_accum_steps

    data_start_time = update_start_time = time.time()
    optimizer.zero_grad()
    update_sample_count = 0
    for batch_idx, (input, target) in enumerate(loader):
        last_batch = batch_idx == last_batch_idx
        need_update = last_batch or (batch_idx + 1) % accum_steps == 0
        update_idx = batch_idx // accum_steps
        if batch_idx >= last_batch_idx_to_accum:
            accum_steps = last_accum_steps

        if not args.prefetcher:
            input, target = input.to(device), target.to(device)
            if mixup_fn is not None:
                input, target = mixup_fn(input, target)
        if args.channels_last:
            input = input.contiguous(memory_format=torch.channels_last)

        # multiply by accum steps to get equivalent for full update
        data_time_m.update(accum_steps * (time.time() - data_start_time))

        def _forward():
            with amp_autocast():
                output = model(input)
                loss = loss_fn(output, target)
            if accum_steps > 1:
                loss /= accum_steps
            return loss

        def _backward(_loss):
            if loss_scaler is not None:
                loss_scaler(
                    _loss,
                    optimizer,
                    clip_grad=args.clip_grad,
                    clip_mode=args.clip_mode,
                    parameters=model_parameters(model, exclude_head='agc' in args.clip_mode),
                    create_graph=second_order,
                    need_update=need_update,
                )
            else:
                _loss.backward(create_graph=second_order)
                if need_update:
                    if args.clip_grad is not None:
                        utils.dispatch_clip_grad(
                            model_parameters(model, exclude_head='agc' in args.clip_mode),
                            value=args.clip_grad,
                            mode=args.clip_mode,
                        )
                    optimizer.step()

        if has_no_sync and not need_update:
            with model.no_sync():
                loss = _forward()
                _backward(loss)
        else:
            loss = _forward()
            _backward(loss)

        if not args.distributed:
            losses_m.update(loss.item() * accum_steps, input.size(0))
        update_sample_count += input.size(0)

        if not need_update:
            data_start_time = time.time()
            continue

        num_updates += 1
        optimizer.zero_grad()
        if model_ema is not None:
            model_ema.update(model)

        if args.synchronize_step and device.type == 'cuda':
            torch.cuda.synchronize()
        time_now = time.time()
        update_time_m.update(time.time() - update_start_time)
        update_start_time = time_now

        if update_idx % args.log_interval == 0:
            lrl = [param_group['lr'] for param_group in optimizer.param_groups]
            lr = sum(lrl) / len(lrl)

            if args.distributed:
                reduced_loss = utils.reduce_tensor(loss.data, args.world_size)
                losses_m.update(reduced_loss.item() * accum_steps, input.size(0))
                update_sample_count *= args.world_size

            if utils.is_primary(args):
                _logger.info(
                    f'Train: {epoch} [{update_idx:>4d}/{updates_per_epoch} '
                    f'({100. * update_idx / (updates_per_epoch - 1):>3.0f}%)]  '
                    f'Loss: {losses_m.val:#.3g} ({losses_m.avg:#.3g})  '
                    f'Time: {update_time_m.val:.3f}s, {update_sample_count / update_time_m.val:>7.2f}/s  '
                    f'({update_time_m.avg:.3f}s, {update_sample_count / update_time_m.avg:>7.2f}/s)  '
                    f'LR: {lr:.3e}  '
                    f'Data: {data_time_m.val:.3f} ({data_time_m.avg:.3f})'
                )

                if args.save_images and output_dir:
                    torchvision.utils.save_image(
                        input,
                        os.path.join(output_dir, 'train-batch-%d.jpg' % batch_idx),
                        padding=0,
                        normalize=True
                    )

        if saver is not None and args.recovery_interval and (
                (update_idx + 1) % args.recovery_interval == 0):
            saver.save_recovery(epoch, batch_idx=update_idx)

        if lr_scheduler is not None:
            lr_scheduler.step_update(num_updates=num_updates, metric=losses_m.avg)

        update_sample_count = 0
        data_start_time = time.time()
        # end for

    if hasattr(optimizer, 'sync_lookahead'):
        optimizer.sync_lookahead()

    return OrderedDict([('loss', losses_m.avg)])
'''

TIMM_RUN = "train_one_epoch(0, model, loader_train, optimizer, train_loss_fn, args, device=device)"


# --- 3. The Hugging Face course, chapter 3, "A full training" (huggingface/course, chapters/en/chapter3/4.mdx), the
# 🤗 Accelerate version of the loop, verbatim: `outputs = model(**batch)`, `loss = outputs.loss`,
# `accelerator.backward(loss)`. The Accelerator is a small class of Accelerate's shape (prepare, backward); the
# model a stand-in returning an output with `.loss` and `.logits`; MRPC's batch of 8 padded sentence pairs.
HF_COURSE = """
from dataclasses import dataclass
import torch
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
torch.manual_seed(0)

class Accelerator:
    device = torch.device('cpu')
    def prepare(self, *objects):
        return objects
    def backward(self, loss, **kwargs):
        loss.backward(**kwargs)

@dataclass
class SequenceClassifierOutput:
    loss: torch.Tensor
    logits: torch.Tensor

class SequenceClassifier(nn.Module):
    def __init__(self, vocab=1000, hidden=32, num_labels=2):
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, hidden, mode='sum')
        self.classifier = nn.Linear(hidden, num_labels)
    def forward(self, input_ids, attention_mask, labels):
        logits = self.classifier(self.embed(input_ids, per_sample_weights=attention_mask.float()))
        return SequenceClassifierOutput(nn.functional.cross_entropy(logits, labels), logits)

train_dataloader = DataLoader(SleepyTokens(256, 64, 0.0003), shuffle=True, batch_size=8)
eval_dataloader = DataLoader(SleepyTokens(64, 64, 0.0), batch_size=8)
accelerator = Accelerator()
model = SequenceClassifier()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
train_dl, eval_dl, model, optimizer = accelerator.prepare(
    train_dataloader, eval_dataloader, model, optimizer
)
num_epochs = 3
num_training_steps = num_epochs * len(train_dl)
lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / num_training_steps)
progress_bar = tqdm(range(num_training_steps), disable=True)
"""

HF_COURSE_RUN = """%%gpuprofile -o -q --steps 3 --warmup 1
model.train()
for epoch in range(num_epochs):
    for batch in train_dl:
        outputs = model(**batch)
        loss = outputs.loss
        accelerator.backward(loss)

        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
        progress_bar.update(1)
"""


# --- 4. A course's domain adaptation homework: ML2021 Spring HW11 (Hung-yi Lee, NTU), the sample code's
# train_epoch(source_dataloader, target_dataloader, lamb), verbatim (its comments left out): one batch of each domain
# per step through `zip(source_dataloader, target_dataloader)` and three optimizers, the domain classifier's
# first. The source lifter refuses it (a step needs a batch of each loader): its step is driven. 1x32x32 images, as
# the homework resizes them; batch 32.
DANN = """
import torch
from torch import nn
from torch.utils.data import DataLoader
torch.manual_seed(0)
device = 'cpu'
feature_extractor = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(4),
                                  nn.Flatten())
label_predictor = nn.Sequential(nn.Linear(512, 32), nn.ReLU(), nn.Linear(32, 10))
domain_classifier = nn.Sequential(nn.Linear(512, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1))
class_criterion = nn.CrossEntropyLoss()
domain_criterion = nn.BCEWithLogitsLoss()
optimizer_F = torch.optim.Adam(feature_extractor.parameters())
optimizer_C = torch.optim.Adam(label_predictor.parameters())
optimizer_D = torch.optim.Adam(domain_classifier.parameters())
source_dataloader = DataLoader(SleepyImages(640, (1, 32, 32), 0.0002), batch_size=32, shuffle=True)
target_dataloader = DataLoader(SleepyImages(640, (1, 32, 32), 0.0002), batch_size=32, shuffle=True)

def train_epoch(source_dataloader, target_dataloader, lamb):

    running_D_loss, running_F_loss = 0.0, 0.0
    total_hit, total_num = 0.0, 0.0

    for i, ((source_data, source_label), (target_data, _)) in enumerate(zip(source_dataloader, target_dataloader)):

        source_data = source_data.to(device)
        source_label = source_label.to(device)
        target_data = target_data.to(device)

        optimizer_D.zero_grad()
        optimizer_F.zero_grad()
        optimizer_C.zero_grad()

        mixed_data = torch.cat([source_data, target_data], dim=0)
        domain_label = torch.zeros([source_data.shape[0] + target_data.shape[0], 1]).to(device)
        domain_label[:source_data.shape[0]] = 1

        feature = feature_extractor(mixed_data)
        domain_logits = domain_classifier(feature.detach())
        loss = domain_criterion(domain_logits, domain_label)
        running_D_loss += loss.item()
        loss.backward()
        optimizer_D.step()

        class_logits = label_predictor(feature[:source_data.shape[0]])
        domain_logits = domain_classifier(feature)
        loss = class_criterion(class_logits, source_label) - lamb * domain_criterion(domain_logits, domain_label)
        running_F_loss += loss.item()
        loss.backward()
        optimizer_F.step()
        optimizer_C.step()


        total_hit += torch.sum(torch.argmax(class_logits, dim=1) == source_label).item()
        total_num += source_data.shape[0]
        print(i, end='\\r')

    return running_D_loss / (i+1), running_F_loss / (i+1), total_hit / total_num
"""

DANN_RUN = "train_epoch(source_dataloader, target_dataloader, lamb=0.1)"

# Budget options added to each printed command, so that it runs in seconds.
BUDGETS = {"speedprobe": "--steps 2 --try tf32,fused-optimizer", "dataprobe": "--seconds 2 --workers 0,1"}
READY = re.compile(r"^  (%(speedprobe|dataprobe|batchprobe) [^(]*?)\s{3}\(")


def ready_commands(text: str) -> list[tuple[str, str]]:
    """(probe, the command) of each ready step the report printed as defined, from its "Ready steps" section."""
    commands, inside = [], False
    for line in text.splitlines():
        if line.startswith("Ready steps"):
            inside = True
            continue
        if inside and line and not line.startswith(" "):
            inside = False
        match = READY.match(line) if inside else None
        if match is not None and "is defined in" in line:
            commands.append((match.group(2), match.group(1).strip()))
    return commands


def training_state(ns: dict, names: list[str], counters: list[str]) -> dict:
    """Bitwise: each model's tensors, each optimizer's state, the torch RNG and the notebook's counters."""
    state: dict = {"rng": torch.get_rng_state().clone()}
    for name in names:
        value = ns[name]
        if isinstance(value, torch.nn.Module):
            state[name] = {key: tensor.clone() for key, tensor in value.state_dict().items()}
            state[name + ".training"] = [module.training for module in value.modules()]
        else:
            state[name] = repr(value.state_dict())
    for name in counters:
        state[name] = repr(ns.get(name))
    return state


def assert_same(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    for key, value in before.items():
        if isinstance(value, dict):
            assert all(torch.equal(value[k], after[key][k]) for k in value), key
        elif isinstance(value, torch.Tensor):
            assert torch.equal(value, after[key]), key
        else:
            assert value == after[key], key


def optimizer_steps(ip, cell: str) -> tuple[object, dict[int, int]]:
    """What `cell` returns, and how many times each optimizer stepped while it ran."""
    steps: dict[int, int] = {}
    handle = register_optimizer_step_post_hook(lambda opt, *_: steps.__setitem__(id(opt), steps.get(id(opt), 0) + 1))
    try:
        outcome = ip.run_cell(cell)
        outcome.raise_error()
    finally:
        handle.remove()
    return outcome.result, steps


def profile(ip, setup: str, run: str):
    ip.user_ns.update(SleepyImages=SleepyImages, SleepyTokens=SleepyTokens)
    ip.run_cell(setup).raise_error()
    if run.startswith("%%"):
        outcome = ip.run_cell(run)
        outcome.raise_error()
        return outcome.result
    return ip.run_line_magic("gpuprofile", f"-o -q --steps 3 --warmup 1 {run}")


def run_ready_steps_and_check_restored(ip, result, names: list[str], counters: list[str]) -> list[str]:
    """Each ready command as printed, with budget options, and the state bitwise as before it; the probes run."""
    text = render_text(result)
    commands = ready_commands(text)
    assert any(probe == "speedprobe" for probe, _ in commands), text
    for probe, command in commands:
        if probe == "batchprobe":
            continue  # %batchprobe grows the batch: minutes on a CPU, and not what this issue is about
        before = training_state(ip.user_ns, names, counters)
        outcome = ip.run_line_magic(probe, f"{command.split(' ', 1)[1]} {BUDGETS[probe]} -o -q")
        assert outcome is not None and getattr(outcome, "error", None) in (None, ""), (command, outcome)
        assert_same(before, training_state(ip.user_ns, names, counters))
    return [command for _, command in commands]


def test_nanogpt_while_true_with_gradscaler_accumulation_is_lifted_and_returns_its_loss(ip) -> None:
    result = profile(ip, NANOGPT, NANOGPT_RUN)
    [step] = [r for r in result.ready_steps if r.probe == "%speedprobe"]
    assert step.name == "profile_train_step", step.reason  # lifted: the wandb branch never runs
    assert "ready steps are lifted" in render_text(result)
    commands = run_ready_steps_and_check_restored(
        ip, result, ["model", "optimizer"], ["iter_num", "local_iter_num", "best_val_loss", "running_mfu"])
    assert commands == ["%speedprobe profile_train_step"]
    loss, steps = optimizer_steps(ip, "profile_train_step()")
    assert list(steps.values()) == [1]
    # The last micro-step's loss, as the loop scaled it (`loss / gradient_accumulation_steps`).
    assert isinstance(loss, torch.Tensor) and loss.ndim == 0 and loss.grad_fn is not None
    assert 0 < loss.item() * 4 < 10


def test_timm_epoch_function_with_inner_closures_is_lifted_and_returns_its_loss(ip) -> None:
    result = profile(ip, TIMM + TIMM_FUNCTION, TIMM_RUN)
    names = [r.name for r in result.ready_steps]
    assert names == ["profile_step", "profile_train_step", "profile_sized_step"], result.ready_steps[0].reason
    commands = run_ready_steps_and_check_restored(ip, result, ["model", "optimizer"], [])
    assert commands[:2] == ["%dataprobe loader_train --step profile_step", "%speedprobe profile_train_step"]
    loss, steps = optimizer_steps(ip, "profile_train_step()")
    assert list(steps.values()) == [1]
    assert isinstance(loss, torch.Tensor) and loss.ndim == 0 and loss.grad_fn is not None


def test_hf_course_accelerate_loop_is_lifted_and_returns_outputs_loss(ip) -> None:
    result = profile(ip, HF_COURSE, HF_COURSE_RUN)
    assert [r.name for r in result.ready_steps][:2] == ["profile_step", "profile_train_step"]
    run_ready_steps_and_check_restored(ip, result, ["model", "optimizer", "lr_scheduler"], [])
    loss, steps = optimizer_steps(ip, "profile_train_step()")
    assert list(steps.values()) == [1]
    # `accelerator.backward(loss)`, loss = outputs.loss: the step returns it.
    assert isinstance(loss, torch.Tensor) and loss.ndim == 0 and loss.grad_fn is not None


def test_a_loop_the_lifter_refuses_is_driven_one_optimizer_step_per_call(ip) -> None:
    result = profile(ip, DANN, DANN_RUN)
    steps = {r.probe: r for r in result.ready_steps}
    # Not lifted (the reason is kept), but driven: the user's own function, run as written.
    assert steps["%speedprobe"].name == "profile_train_step" and "zip" in (steps["%speedprobe"].reason or "")
    assert steps["%dataprobe"].command == "%dataprobe source_dataloader --step profile_step"
    text = render_text(result)
    assert "ready steps are driven" in text, text
    names = ["feature_extractor", "label_predictor", "domain_classifier", "optimizer_F", "optimizer_C", "optimizer_D"]
    run_ready_steps_and_check_restored(ip, result, names, [])
    loss, counted = optimizer_steps(ip, "profile_train_step()")
    assert sorted(counted.values()) == [1, 1, 1]  # one step of each of the three optimizers: one iteration
    # The loss the loop last called backward() on: the feature extractor's and label predictor's.
    assert isinstance(loss, torch.Tensor) and loss.ndim == 0
    batch = ip.run_cell("next(iter(source_dataloader))").result
    ip.user_ns["_given"] = batch
    loss, counted = optimizer_steps(ip, "profile_step(_given)")
    assert sorted(counted.values()) == [1, 1, 1] and isinstance(loss, torch.Tensor)


@pytest.mark.parametrize(("source", "returned"), [
    ("for micro_step in range(4):\n    with ctx:\n        logits, loss = model(X, Y)\n"
     "        loss = loss / 4\n    scaler.scale(loss).backward()\nscaler.step(optimizer)\n", "loss"),
    ("outputs = model(**batch)\nloss = outputs.loss\naccelerator.backward(loss)\noptimizer.step()\n", "loss"),
    ("def _backward(_loss):\n    _loss.backward()\n    optimizer.step()\nif sync:\n    loss = f()\n"
     "    _backward(loss)\nelse:\n    loss = f()\n    _backward(loss)\n", "loss"),
    ("outputs = model(**batch)\n(outputs['loss'] / accum).backward()\noptimizer.step()\n", "outputs['loss']"),
    ("out = model(x)\nout.loss.backward()\noptimizer.step()\n", "out.loss"),
])
def test_the_lifted_step_returns_the_loss_however_the_loop_computes_it(source: str, returned: str) -> None:
    import ast

    from jupyter_gpu.gpuprofile.lift import _loss_returned

    found = _loss_returned(ast.parse(source).body)
    assert found is not None and ast.unparse(found.value) == returned


def test_where_the_step_cannot_return_the_loss_the_note_names_the_line_it_looked_at() -> None:
    import ast

    from jupyter_gpu.gpuprofile.lift import _loss_exit

    body = ast.parse("out = model(x)\ncriterion(out, y).backward()\nopt.step()\n").body
    exit_ = _loss_exit(body, set(), 7)
    assert exit_.value is None and exit_.missing is not None and "line 2" in exit_.missing
    nothing = _loss_exit(ast.parse("opt.step()\n").body, set(), 7)
    assert nothing.missing is not None and "at line 7 calls no backward()" in nothing.missing
