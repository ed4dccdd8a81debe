"""On a real GPU, what the CPU suite cannot check: each phase's GPU time from CUDA events, the datasheet MFU for a
GPU in the table, the time the host waited at each sync against a `torch.cuda._sleep` kernel of known length, and
that a loop that never touched CUDA leaves it uninitialised. No IPython here: `profile_training` is the entry."""

from __future__ import annotations

import itertools
import statistics
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch import nn

from jupyter_gpu.gpuprofile.peaks import find_peak
from jupyter_gpu.gpuprofile.runner import profile_training

pytestmark = pytest.mark.gpu


def make_training(dtype: torch.dtype | None = None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = [(torch.randn(256, 1024), torch.randn(256, 1024)) for _ in range(8)]
    loader = torch.utils.data.DataLoader(data, batch_size=None)

    def train_epoch(epochs: int = 20) -> None:
        for _ in range(epochs):
            for x, y in loader:
                x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
                opt.zero_grad()
                with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
                    loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
    return model, opt, train_epoch


def test_each_phase_gets_its_gpu_time_and_the_mfu_its_datasheet_peak() -> None:
    model, opt, train_epoch = make_training(torch.bfloat16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = profile_training(train_epoch, steps=10, warmup=3, namespace={"model": model, "opt": opt})
    assert result.device.startswith("cuda") and result.steps == 10
    for key in ("forward", "backward", "optimizer"):
        assert result.bucket(key).gpu_seconds is not None and result.bucket(key).gpu_seconds > 0, key
    assert result.compute == "bf16"
    peak = find_peak(torch.cuda.get_device_name(0))
    if peak is not None:
        assert result.ceiling.datasheet_name == peak.name and result.mfu is not None and 0 < result.mfu < 1
    assert result.of_ceiling is not None and 0 < result.of_ceiling < 1.5
    assert result.copies is not None and result.copies.count == pytest.approx(2.0)  # x and y, pageable
    assert result.peak_memory and result.peak_memory > 0
    timeline = result.gpu_timeline  # three steps under torch.profiler after the counted one
    assert timeline is not None and timeline.steps == 3, result.not_measured
    assert 0 < timeline.busy <= 1 and timeline.kernels_per_step > 3 and timeline.median_kernel > 0
    assert result.gpu_busy == timeline.busy
    # The operators are ranked by their kernels' time from the trace. AdamW's foreach kernels over 8.4M fp32
    # parameters move over 100 MB each (at least 28 µs at 4.8 TB/s), longer than this model's bf16 matmuls
    # (7-20 µs): they may lead the table, as the optimizer's; the matrix products lead the model's own operators.
    assert result.operators and all(op.gpu_seconds is not None for op in result.operators)
    model_ops = [op for op in result.operators if not op.optimizer]
    assert model_ops[0].gpu_seconds > 0 and model_ops[0].name in ("mm", "addmm"), result.operators
    assert any(op.optimizer and op.name.startswith("_foreach_") for op in result.operators), result.operators
    if result.optimizer_share is not None and result.optimizer_share >= 0.3:
        assert any("fused-optimizer" in item.command for item in result.plan), result.plan
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_the_wait_at_a_sync_is_the_queued_work_it_waited_for() -> None:
    # `torch.cuda._sleep` spins for a number of cycles, so its length follows the SM clock: calibrated once at the
    # idle clock (345 MHz on the H200) a "20 ms" kernel ran 4.3 ms at the boost clock. So the cycles are set after
    # the clock is up, and the truth is what each kernel took in the loop itself, from CUDA events around it.
    x = torch.ones(1, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):  # the last of three, after the clock has risen
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        torch.cuda.synchronize()
    cycles = int(10_000_000 * 0.02 / (start.elapsed_time(end) / 1000))  # about a 20 ms kernel
    model = nn.Linear(1, 1).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    spans: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def train() -> None:
        for _ in range(30):
            opt.zero_grad()
            loss = model(x).sum()
            loss.backward()
            opt.step()
            began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            began.record()
            torch.cuda._sleep(cycles)
            ended.record()
            spans.append((began, ended))
            loss.item()  # the host waits here for the 20 ms kernel

    result = profile_training(train, steps=10, warmup=3, namespace={"model": model, "opt": opt})
    torch.cuda.synchronize()
    kernel = statistics.median(a.elapsed_time(b) / 1000 for a, b in spans[3:])  # after the warm-up steps
    assert 0.005 < kernel < 0.1, kernel  # a kernel long enough that the wait is mostly it
    [sync] = [s for s in result.syncs if s.source == "loss.item()  # the host waits here for the 20 ms kernel"]
    assert sync.per_step == 1.0
    assert sync.seconds == pytest.approx(kernel, rel=0.10)
    assert result.plan[0].cause.startswith("sync at")


def test_a_host_bound_cnn_step_costs_under_ten_percent_more_profiled_and_the_report_says_what_it_costs() -> None:
    # On the H200 the report said the hooks cost a ResNet step 3.1 ms (25%): the estimate charged a CUDA event pair
    # to each of the step's 60 module calls, and the global module hooks slowed every one of them. Small convolutions
    # at batch 32 keep the step host-bound, where the hooks' host time shows in full.
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Conv2d(3, 32, 3, padding=1)]
    for _ in range(8):
        layers += [nn.Conv2d(32, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True)]
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batches = [(torch.randn(32, 3, 32, 32, device="cuda"), torch.randint(0, 10, (32,), device="cuda"))] * 8
    loader = torch.utils.data.DataLoader(batches, batch_size=None)
    step_ends: list[float] = []

    def train(epochs: int = 10) -> None:
        for _ in range(epochs):
            for images, labels in loader:
                opt.zero_grad()
                loss = nn.functional.cross_entropy(model(images), labels)
                loss.backward()
                opt.step()
                loss.item()
                step_ends.append(time.perf_counter())  # a step is from one step's end to the next, as profiled

    def unprofiled() -> float:
        step_ends.clear()
        train(5)
        return statistics.median(b - a for a, b in itertools.pairwise(step_ends[10:]))

    before = unprofiled()
    result = profile_training(train, steps=20, warmup=5, namespace={"model": model, "opt": opt})
    after = unprofiled()
    bare = min(before, after)
    assert result.overhead_seconds is not None and result.overhead_seconds < 0.10 * result.seconds, (
        result.overhead_seconds, result.seconds)
    assert result.seconds < 1.10 * bare, (result.seconds, before, after)


def test_a_loop_that_never_touched_cuda_leaves_it_uninitialised() -> None:
    script = textwrap.dedent("""
        import torch
        from torch import nn
        from jupyter_gpu.gpuprofile.runner import profile_training
        model = nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader([(torch.zeros(8), 0)] * 64, batch_size=8)
        def train():
            for _ in range(5):
                for x, y in loader:
                    opt.zero_grad(); nn.functional.cross_entropy(model(x), y).backward(); opt.step()
        result = profile_training(train, steps=5, warmup=1, namespace=globals())
        print(result.device, torch.cuda.is_initialized())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["cpu", "False"]
