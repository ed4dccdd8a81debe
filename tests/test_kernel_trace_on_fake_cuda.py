"""The kernel timeline, the launch-bound rule and the operator ranking on the trace a real CUDA run gives
(fake_profiler.py: the host's operators recorded by torch's own profiler, the device's events in kineto's shapes).

Each test is a defect a read of torch's and kineto's sources found in code that had not run on a GPU since it
changed: annotation spans counted as kernels, inclusive device time counted twice, non-aten operators given
nothing, an unfinished tail divided by the completed steps, a host-bound step called launch-bound, and the
optimizer's memory traffic blamed on the model.
"""

from __future__ import annotations

import time

import pytest
import torch
from fake_cuda import FakeCuda
from fake_profiler import GpuModel, cuda_torch
from torch import nn
from torch.autograd import DeviceType
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from jupyter_gpu.gpuprofile.assemble import _operators
from jupyter_gpu.gpuprofile.census import make_census
from jupyter_gpu.gpuprofile.plan import with_plan
from jupyter_gpu.gpuprofile.render import render_text
from jupyter_gpu.gpuprofile.result import BACKWARD, FORWARD, OPTIMIZER, Bucket, Ceiling, ProfileResult
from jupyter_gpu.probekit.kernel_trace import (
    analyse,
    gpu_events,
    mark_step,
    operator_device_seconds,
    trace_kernels,
)
from jupyter_gpu.speedprobe.decide import launch_bound

WORK = {"kernel", "gpu_memcpy", "gpu_memset"}


def work_events(traced) -> list:
    """The trace's kernels, memcpys and memsets, read off the fake's own events (independently of the product)."""
    return [e for e in traced.profiler.kineto_results.events()
            if e.device_type() == DeviceType.CUDA and e.activity_type() in WORK]


def union_seconds(events) -> float:
    total, covered = 0.0, float("-inf")
    for event in sorted(events, key=lambda e: e.start_ns()):
        start, end = max(event.start_ns(), covered), event.end_ns()
        if end > start:
            total += end - start
        covered = max(covered, end)
    return total / 1e9


def mlp_with(optimizer: str, **options):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = getattr(torch.optim, optimizer)(model.parameters(), **{"lr": 1e-3, **options})
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    loss_fn = nn.CrossEntropyLoss()

    def step() -> float:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    step()  # the optimizer's state exists before the traced step, as in a loop's later steps
    return step


def test_annotation_spans_are_not_kernels_and_do_not_fill_the_optimizers_host_gaps() -> None:
    # Adam's for-loop path (foreach=False) launches a few kernels per parameter from Python, inside torch's
    # `Optimizer.step#Adam.step` record_function: kineto draws one GPU span over all of them.
    fake = cuda_torch(FakeCuda(), GpuModel(kernel_us=lambda name: 1.0, launch_us=0.5))
    step = mlp_with("Adam", foreach=False)
    with fake.profiler.profile(activities=None) as traced:
        mark_step(fake)
        step()
        mark_step(fake)
    spans = [e for e in traced.profiler.kineto_results.events()
             if e.device_type() == DeviceType.CUDA and e.is_user_annotation()]
    assert [s.name() for s in spans] == ["Optimizer.step#Adam.step"]  # the fake draws what kineto draws
    trace = gpu_events(fake, traced)
    work = work_events(traced)
    assert len(trace.events) == len(work) and trace.steps == 1
    timeline = analyse(trace.events, trace.steps, trace.window)
    assert timeline is not None
    assert timeline.kernels_per_step == len(work)
    assert timeline.busy == pytest.approx(union_seconds(work) / (trace.window[1] - trace.window[0]), rel=1e-4)
    # The span covers host gaps: its kernels fill less than it, so counting it as work would change `busy`.
    inside = [e for e in work if spans[0].start_ns() <= e.start_ns() <= spans[0].end_ns()]
    assert union_seconds(inside) < 0.8 * spans[0].duration_ns() / 1e9, "kernels shorter than the host's gaps"
    assert timeline.host_wait > 0  # the host gaps inside the optimizer's step are idle time


def test_each_kernel_goes_to_the_outermost_operator_the_census_counted_and_other_namespaces_keep_theirs() -> None:
    # torch's device time is inclusive: `_to_copy` holds its `copy_`, `zeros` its `zero_`/`fill_`, a custom op the
    # kernels it launches. A key by key read of key_averages() counted each nested kernel twice and gave a
    # torch.library op (any namespace but aten) nothing.
    lib = torch.library.Library("jgtrace", "DEF")  # kept alive while the op is used
    torch.library.define("jgtrace::scale", "(Tensor x) -> Tensor", lib=lib)
    torch.library.impl("jgtrace::scale", "CompositeExplicitAutograd", lambda x: x * 2.0, lib=lib)
    buffer = torch.zeros(64, 64)

    def step() -> None:
        x = torch.randn(64, 64)
        y = x.to(torch.float64)            # _to_copy -> copy_
        z = torch.zeros(64, 64)            # zeros -> zero_
        buffer.copy_(x)                    # the user's own copy_
        torch.ops.jgtrace.scale(x + z)     # a custom op of its own namespace
        (y.sum() + buffer.sum()).item()

    fake = cuda_torch(FakeCuda(), GpuModel(kernel_us=lambda name: 7.0))
    census = make_census(torch, cuda_timing=False)
    with census:
        step()
    counted = census.totals().names()
    assert {"_to_copy", "zeros", "copy_", "jgtrace::scale"} <= counted
    with fake.profiler.profile(activities=None) as traced:
        mark_step(fake)
        step()
        mark_step(fake)
    found = operator_device_seconds(traced, 1, counted)
    kernel = 7e-6
    assert found[("copy_", False)] == pytest.approx(kernel), "only the user's own copy_, not the one in _to_copy"
    assert found[("_to_copy", False)] == pytest.approx(kernel)
    assert found[("zeros", False)] == pytest.approx(kernel)
    assert found[("jgtrace::scale", False)] >= kernel
    # Every kernel is counted once: the operators' times add up to the trace's work (the .item() copy included).
    assert sum(found.values()) == pytest.approx(len(work_events(traced)) * kernel)


def test_a_cell_that_ends_while_the_trace_runs_is_judged_over_its_completed_steps() -> None:
    # Two training steps, then the cell's validation loop (many more kernels) runs until the cell ends, with no
    # step boundary after it: the tail had been divided by the two completed steps.
    fake = cuda_torch(FakeCuda(), GpuModel(kernel_us=lambda name: 5.0))
    step = mlp_with("SGD", lr=0.1)
    model_input = torch.randn(256, 32)
    with fake.profiler.profile(activities=None) as traced:
        mark_step(fake)
        for _ in range(2):
            step()
            mark_step(fake)
        for _ in range(20):  # the unfinished tail
            (model_input @ model_input.T).relu().sum()
    trace = gpu_events(fake, traced)
    assert trace.steps == 2
    one = cuda_torch(FakeCuda(), GpuModel(kernel_us=lambda name: 5.0))
    with one.profiler.profile(activities=None) as single:
        mark_step(one)
        step()
        mark_step(one)
    per_step = len(gpu_events(one, single).events)
    assert len(trace.events) == 2 * per_step, "the tail's kernels are not the steps'"
    counted = {"addmm", "mm", "relu", "sum", "t", "threshold_backward", "_log_softmax", "nll_loss_forward",
               "_local_scalar_dense", "add_", "mul_", "zero_"}
    tail_free = operator_device_seconds(traced, 2, counted)
    assert ("mm", False) not in tail_free or tail_free[("mm", False)] == pytest.approx(
        operator_device_seconds(single, 1, counted).get(("mm", False), 0.0))


def test_a_step_that_makes_its_own_batches_is_host_bound_not_launch_bound() -> None:
    # A step that builds its batch on the host (next(it), get_batch, a CPU augmentation) leaves the GPU idle
    # between launches too; CUDA graphs do not touch that time, so it is not launch-bound.
    fake = cuda_torch(FakeCuda(), GpuModel(kernel_us=lambda name: 3.0))
    step = mlp_with("SGD", lr=0.1)

    def host_bound() -> None:
        time.sleep(0.004)  # the host making the batch
        step()

    timeline = trace_kernels(fake, host_bound, steps=3)
    assert timeline is not None and timeline.kernels_per_step >= 20 and timeline.busy < 0.5
    assert timeline.outside_launches > timeline.launch_wait + timeline.kernel_wait
    assert not timeline.launch_bound
    assert not launch_bound("cuda", 60, 0.005, traced=timeline.at_step(0.005).launch_bound)


@pytest.mark.timing  # apart from the other tests: another process's load stretches the host's gaps between launches
def test_the_same_step_without_the_hosts_batch_launches_back_to_back_and_is_launch_bound() -> None:
    fake = cuda_torch(FakeCuda(), GpuModel(kernel_us=lambda name: 3.0))
    step = mlp_with("SGD", lr=0.1)
    # One intra-op thread: the CPU operators behind the fake kernels wait for every torch thread, and a sibling the
    # OS holds off its core stalls the launching thread in a way its own run-queue time does not show.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        launch = trace_kernels(fake, step, steps=3)
    finally:
        torch.set_num_threads(threads)
    assert launch is not None and launch.launch_bound, launch
    assert launch_bound("cuda", 60, 0.0005, traced=launch.at_step(0.0005).launch_bound)


def profile(**fields) -> ProfileResult:
    """A 10 ms CUDA step whose forward, backward and optimizer took 8 ms on the GPU."""
    buckets = [Bucket(FORWARD, 0.003, 0.003, 0.003, 0.3, gpu_seconds=0.003),
               Bucket(BACKWARD, 0.004, 0.004, 0.004, 0.4, gpu_seconds=0.004),
               Bucket(OPTIMIZER, 0.003, 0.003, 0.003, 0.3, gpu_seconds=0.003)]
    return ProfileResult(device="cuda:0", device_name="NVIDIA H200", counted="optimizer steps",
                         step_seconds=[0.01] * 10, breakdown=buckets, models=["model"], **fields)


def census_of(step, optimizer_class: type) -> object:
    """The real census over one call of `step`, with the optimizer's operators told apart as %%gpuprofile does."""
    inside = [False]
    pre = register_optimizer_step_pre_hook(lambda *a: inside.__setitem__(0, True))
    post = register_optimizer_step_post_hook(lambda *a: inside.__setitem__(0, False))
    try:
        census = make_census(torch, cuda_timing=False, in_optimizer=lambda: inside[0])
        with census:
            step()
    finally:
        pre.remove()
        post.remove()
    return census.totals()


def test_an_unfused_optimizers_kernels_lead_the_table_as_the_optimizers_and_the_plan_says_fused() -> None:
    # As the H200 transformer's AdamW (foreach, about 8.4M fp32 parameters): each _foreach_ kernel moves over
    # 100 MB, about 28 µs at 4.8 TB/s, longer than the model's bf16 matmuls (7-20 µs). The ranking is right; the
    # plan had called the step memory-bound and offered torch.compile(model).
    fake = cuda_torch(FakeCuda(), GpuModel(kernel_us=lambda name: 40.0 if "_foreach_" in name else
                                           (8.0 if name.endswith(("mm", "addmm")) else 4.0)))
    step = mlp_with("AdamW", foreach=True)
    totals = census_of(step, torch.optim.AdamW)
    assert any(name.startswith("_foreach_") for name in totals.optimizer_operators)
    assert not any(name.startswith("_foreach_") for name in totals.operators)
    with fake.profiler.profile(activities=None) as traced:
        mark_step(fake)
        step()
        mark_step(fake)
    gpu = operator_device_seconds(traced, 1, totals.names())
    ceiling = Ceiling(device="cuda:0", compute="fp32", matmul_flops=5e13, bandwidth=4e12, seconds=0.05,
                      datasheet_flops=67e12, datasheet_bandwidth=4.8e12)
    ranked, memory_share, optimizer_share = _operators(totals, ceiling, gpu)
    assert ranked[0].name.startswith("_foreach_") and ranked[0].optimizer
    assert ranked[0].label.endswith("(optimizer)")
    assert optimizer_share is not None and optimizer_share > 0.5
    result = with_plan(profile(operators=ranked, memory_bound_share=memory_share, optimizer_share=optimizer_share),
                       loaders=[], total_memory=None)
    causes = {item.cause: item.command for item in result.plan}
    optimizer_item = next(cause for cause in causes if cause.startswith("the optimizer's step"))
    assert "--try fused-optimizer" in causes[optimizer_item] and "fused=True" in causes[optimizer_item]
    # The model's memory-bound share is of the model's own operators: the optimizer's bytes are not in it.
    model_ops = [op for op in ranked if not op.optimizer]
    assert memory_share == pytest.approx(sum(op.time for op in model_ops if op.bound == "memory")
                                         / sum(op.time for op in model_ops))
    order = [item.cause for item in result.plan]
    assert order.index(optimizer_item) < min((order.index(c) for c in order if c.startswith("memory-bound")),
                                             default=len(order))
    text = render_text(result)
    assert "(optimizer)" in text and "of the model's operator time is memory-bound" in text
    fused = with_plan(profile(operators=ranked, optimizer_share=optimizer_share, optimizer_fused=True),
                      loaders=[], total_memory=None)
    assert not any(item.cause.startswith("the optimizer's step") for item in fused.plan)


@pytest.mark.parametrize(("cuda_version", "applied"), [("12.4", True), ("11.8", True), ("12.6", False),
                                                        ("13.0", False)])
def test_a_trace_on_a_cuda_build_before_12_6_keeps_cupti_up_for_graph_captures(monkeypatch, cuda_version: str,
                                                                                applied: bool) -> None:
    # torch applies this only when inductor's global triton.cudagraphs is set; reduce-overhead compiles capture
    # graphs without it, and a later trace in the same process could crash there.
    monkeypatch.delenv("DISABLE_CUPTI_LAZY_REINIT", raising=False)
    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    import os

    fake = cuda_torch(FakeCuda(), cuda_version=cuda_version)
    assert trace_kernels(fake, lambda: torch.ones(4).sum(), steps=1) is not None
    assert (os.environ.get("DISABLE_CUPTI_LAZY_REINIT"), os.environ.get("TEARDOWN_CUPTI")) == (
        ("1", "0") if applied else (None, None))


def test_operator_device_time_is_read_from_a_real_trace_by_the_census_names() -> None:
    # torch's own profiler on the CPU (its first start in a process costs seconds: kept out of the fast loop).
    a = torch.randn(64, 64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as traced:
        for _ in range(2):
            (a @ a + 1).sum()
    found = operator_device_seconds(traced, steps=2, counted={"mm", "add", "sum"})
    assert {("mm", False), ("add", False), ("sum", False)} == set(found)  # aten::mm -> "mm", as the census names it
    assert all(seconds == 0.0 for seconds in found.values())  # no CUDA here: no kernel time
    assert operator_device_seconds(traced, steps=0, counted={"mm"}) == {}
