"""TensorBudget on the CPU, with real torch tensors: what it counts, when it refuses, and what it leaves behind."""

from __future__ import annotations

import gc
import types
import weakref
from collections.abc import Iterator

import pytest
import torch
from fake_cuda import FakeCuda, FakeGpu

from jupyter_gpu.batchprobe.budget import AllocatorBudget, TensorBudget
from jupyter_gpu.batchprobe.oom import FailureKind, classify
from jupyter_gpu.probekit.storages import live_tensor_bytes

LOTS = 1 << 40  # a limit nothing here reaches


@pytest.fixture
def budget() -> Iterator[TensorBudget]:
    gc.collect()
    counted = TensorBudget(torch, "cpu", limit_bytes=LOTS)
    yield counted
    counted.close()


def assert_budget_oom(error: BaseException) -> None:
    assert isinstance(error, torch.OutOfMemoryError)
    assert "jupyter-gpu memory budget" in str(error)
    failure = classify(error)
    assert failure is not None
    assert failure.kind is FailureKind.OUT_OF_MEMORY
    assert failure.flavour == "memory budget"


# -- what a trial counts -----------------------------------------------------------------------------------


def test_a_new_tensor_adds_its_storage(budget: TensorBudget) -> None:
    with budget.trial():
        before = budget.live
        x = torch.ones(1000)
        assert budget.live - before == 4000
        y = torch.empty(250, dtype=torch.float64)
        assert budget.live - before == 4000 + 2000
    del x, y


def test_views_in_place_ops_out_and_detach_add_nothing(budget: TensorBudget) -> None:
    with budget.trial():
        x = torch.ones(1000)
        after_x = budget.live
        views = [x[10:20], x.view(10, 100), x.view(10, 100).t(), x.reshape(100, 10), x.unsqueeze(0), x.detach()]
        x.add_(1)
        x.mul_(2)
        torch.add(x, 1, out=x)
        x.clamp_(max=5)
        assert budget.live == after_x
    del x, views


def test_clone_empty_and_matmul_outputs_add_their_storage(budget: TensorBudget) -> None:
    with budget.trial():
        a = torch.ones(10, 20)
        b = torch.ones(20, 30)
        before = budget.live
        c = a.clone()
        assert budget.live - before == 10 * 20 * 4
        e = torch.empty(100, dtype=torch.int64)
        assert budget.live - before == 10 * 20 * 4 + 800
        m = a @ b
        assert budget.live - before == 10 * 20 * 4 + 800 + 10 * 30 * 4
    del a, b, c, e, m


def test_a_freed_storage_is_subtracted_and_the_peak_remembers_it(budget: TensorBudget) -> None:
    with budget.trial():
        start = budget.live
        x = torch.ones(1000)
        v = x[:10]
        del x
        assert budget.live - start == 4000  # the view still holds the storage
        del v
        assert budget.live == start
        big = torch.ones(5000)
        del big
        assert budget.live == start
    assert budget.peak().bytes == start + 20_000


def test_a_trial_peak_starts_from_what_is_live(budget: TensorBudget) -> None:
    with budget.trial():
        big = torch.ones(10_000)
        del big
    with budget.trial():
        small = torch.ones(10)
    assert budget.peak().bytes == budget.live  # the first trial's 40 KB are not this one's peak
    del small


def test_a_tensor_autograd_saved_for_backward_is_counted_until_backward_frees_it(budget: TensorBudget) -> None:
    with budget.trial():
        x = torch.ones(1000, requires_grad=True)
        before = budget.live
        y = torch.relu(x)  # relu saves its output for backward
        z = y * 2
        del y
        gc.collect()
        assert budget.live - before == 8000  # y's storage is still held by z's graph
        z.sum().backward()
        del z
        x.grad = None
        gc.collect()
        assert budget.live == before


def test_meta_tensors_are_seen_but_not_counted() -> None:
    gc.collect()
    budget = TensorBudget(torch, "cpu", limit_bytes=live_tensor_bytes(torch, "cpu") + 1000)
    try:
        with budget.trial():
            huge = torch.empty(10**9, device="meta")
            small = torch.ones(10)
        assert "cpu" in budget.devices_seen
        assert "meta" in budget.devices_seen
        del huge, small
    finally:
        budget.close()


# -- the limit ---------------------------------------------------------------------------------------------


def test_crossing_the_limit_raises_torch_out_of_memory() -> None:
    gc.collect()
    budget = TensorBudget(torch, "cpu", limit_bytes=live_tensor_bytes(torch, "cpu") + 10_000)
    try:
        with budget.trial():
            fits = torch.ones(2000)  # 8 KB of 10 KB
            with pytest.raises(torch.OutOfMemoryError) as raised:
                torch.ones(1000)  # 4 KB more
        assert_budget_oom(raised.value)
        del fits
    finally:
        budget.close()


def test_the_limit_counts_tensors_that_existed_before() -> None:
    gc.collect()
    existing = torch.ones(250_000)  # 1 MB held before the budget exists
    baseline = live_tensor_bytes(torch, "cpu")
    assert baseline >= existing.numel() * 4
    budget = TensorBudget(torch, "cpu", limit_bytes=baseline + 50_000)
    try:
        assert budget.baseline == baseline
        with budget.trial():
            small = torch.ones(1000)
            with pytest.raises(torch.OutOfMemoryError) as raised:
                torch.ones(100_000)  # 400 KB: far below 1 MB, but over what is left
        assert_budget_oom(raised.value)
        assert budget.peak().bytes >= baseline + 4000
        del small
    finally:
        budget.close()
    del existing


def test_running_out_inside_backward() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(500, 500)  # the weight's gradient alone is 1 MB
    gc.collect()
    budget = TensorBudget(torch, "cpu", limit_bytes=live_tensor_bytes(torch, "cpu") + 200_000)
    try:
        with budget.trial():
            loss = model(torch.ones(4, 500)).sum()  # the forward fits
            with pytest.raises(torch.OutOfMemoryError) as raised:
                loss.backward()
        assert_budget_oom(raised.value)
        del loss
    finally:
        budget.close()


def test_running_out_inside_the_optimizer_step() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(500, 500)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(4, 500)).sum().backward()  # gradients exist before the budget: part of its baseline
    gc.collect()
    budget = TensorBudget(torch, "cpu", limit_bytes=live_tensor_bytes(torch, "cpu") + 200_000)
    try:
        with budget.trial(), pytest.raises(torch.OutOfMemoryError) as raised:
            optimizer.step()  # Adam's first step allocates two 1 MB moments for the weight
        assert_budget_oom(raised.value)
    finally:
        budget.close()


def test_without_a_limit_the_budget_is_free_memory_plus_what_is_live() -> None:
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        available = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    existing = torch.ones(250_000)
    budget = TensorBudget(torch, "cpu")
    try:
        assert "free" in budget.source and "memory" in budget.source
        assert budget.baseline >= existing.numel() * 4
        assert budget.limit_bytes > budget.baseline
        assert 0.5 * available < budget.limit_bytes - budget.baseline < 2 * available
    finally:
        budget.close()
    del existing


# -- closing -----------------------------------------------------------------------------------------------


def test_after_close_nothing_is_tracked_and_the_budget_can_die() -> None:
    budget = TensorBudget(torch, "cpu", limit_bytes=LOTS)
    with budget.trial():
        survivor = torch.ones(1000)
    budget.close()
    live = budget.live
    del survivor  # freed after close: no callback may touch the budget any more
    gc.collect()
    assert budget.live == live
    with budget.trial():
        outlives = torch.ones(1000)
    budget.close()
    ref = weakref.ref(budget)
    del budget
    gc.collect()
    assert ref() is None
    del outlives  # its storage's weak reference must not call back into a dead budget
    gc.collect()


# -- live_tensor_bytes -------------------------------------------------------------------------------------


def measure() -> int:
    gc.collect()
    return live_tensor_bytes(torch, "cpu")


def test_live_tensor_bytes_counts_a_storage_once_with_views_alive() -> None:
    before = measure()
    base = torch.ones(1000)
    views = [base[1:], base.view(10, 100), base.view(10, 100).t(), base[::2], base.detach()]
    assert measure() - before == 4000
    del base
    assert measure() - before == 4000  # the views keep it alive
    del views
    assert measure() == before


def test_live_tensor_bytes_counts_a_parameters_gradient() -> None:
    before = measure()
    parameter = torch.nn.Parameter(torch.ones(1000))
    (parameter * 2).sum().backward()  # the gradient has no Python object until someone reads .grad
    assert measure() - before == 8000
    assert parameter.grad is not None
    assert measure() - before == 8000  # read once, still counted once
    del parameter
    assert measure() == before


def test_live_tensor_bytes_ignores_meta_tensors() -> None:
    before = measure()
    meta = torch.empty(10**9, device="meta")
    assert measure() == before
    del meta


def gpu_with_8_gib() -> FakeCuda:
    return FakeCuda([FakeGpu(total_memory=8 << 30)])


def test_the_cuda_budget_peak_covers_every_step_and_reads_what_each_step_left() -> None:
    cuda = gpu_with_8_gib()
    fake_torch = types.SimpleNamespace(cuda=cuda, Tensor=torch.Tensor)
    budget = AllocatorBudget(fake_torch, limit_bytes=2 << 30)
    assert cuda.get_per_process_memory_fraction(0) == 0.25
    kept = cuda.allocate(100 << 20)
    with budget.trial():
        activations = cuda.allocate(500 << 20)  # the step's peak: 600 MiB allocated
        cuda.free(activations)
        grads = cuda.allocate(300 << 20)
        first = budget.live_after_step()
        cuda.free(grads)
        grads = cuda.allocate(200 << 20)
        second = budget.live_after_step()
    budget.end_trial()
    assert (first, second) == (400 << 20, 300 << 20)
    assert budget.peak().bytes == 600 << 20 and budget.peak().curve is None
    assert budget.leftovers() == {}  # no CUDA storages live on this machine
    budget.close()
    assert cuda.get_per_process_memory_fraction(0) == 1.0
    cuda.free(kept)
    cuda.free(grads)


def test_a_trial_peak_is_its_own_not_the_cache_an_earlier_bigger_trial_left() -> None:
    # reset_peak_memory_stats sets the reserved peak to what is reserved now: cache kept from an earlier trial
    # would count as this trial's peak, and a batch size that fits would be reported as needing that much.
    cuda = gpu_with_8_gib()
    budget = AllocatorBudget(types.SimpleNamespace(cuda=cuda, Tensor=torch.Tensor), limit_bytes=6 << 30)
    with budget.trial():
        cuda.free(cuda.allocate(4 << 30))  # batch 256: 4 GiB, freed; the allocator keeps it reserved
    budget.end_trial()
    with budget.trial():
        cuda.free(cuda.allocate(1 << 30))  # batch 64: 1 GiB
    budget.end_trial()
    assert budget.peak().bytes == 1 << 30
    budget.close()


def test_going_past_the_cap_is_torchs_own_out_of_memory_error() -> None:
    cuda = gpu_with_8_gib()
    budget = AllocatorBudget(types.SimpleNamespace(cuda=cuda, Tensor=torch.Tensor), limit_bytes=1 << 30)
    with budget.trial(), pytest.raises(torch.OutOfMemoryError) as raised:
        cuda.allocate(2 << 30)
    budget.end_trial()
    failure = classify(raised.value)
    assert failure is not None and failure.kind is FailureKind.OUT_OF_MEMORY
    assert "1024.00 MiB allowed" in str(raised.value)  # c10's format_size: up to 1 GiB in MiB
    budget.close()
    with pytest.raises(TypeError):
        cuda.set_per_process_memory_fraction(1, 0)  # torch takes a float only
    with pytest.raises(ValueError, match="Allowed range"):
        cuda.set_per_process_memory_fraction(1.5, 0)


# -- across trials: what existed before, what an earlier trial left ---------------------------------------


def test_a_tensor_from_before_the_trial_gives_its_bytes_back_when_the_trial_frees_it() -> None:
    # An earlier step's gradient that the step's own zero_grad() drops: the trial may use that memory.
    gc.collect()
    old = {"grad": torch.ones(10_000)}
    budget = TensorBudget(torch, "cpu", limit_bytes=LOTS)
    with budget.trial():
        start = budget.live
        old.clear()
        assert budget.live == start - 40_000
    budget.close()


def test_what_an_earlier_trial_left_alive_is_not_charged_to_the_next(budget: TensorBudget) -> None:
    kept: dict[str, torch.Tensor] = {}
    with budget.trial():
        kept["last"] = torch.ones(25_000)  # a hook keeping the last output
    budget.end_trial()
    assert sum(budget.leftovers().values()) == 100_000
    with budget.trial():
        assert budget.inherited == 100_000 and budget.charged == budget.live - 100_000
        charged_at_start = budget.charged
        kept["last"] = torch.ones(1_000)  # this trial's own output replaces it and is charged
        assert budget.inherited == 0
        assert budget.charged == charged_at_start + 4_000
    assert budget.peak().bytes == charged_at_start + 4_000
    assert sum(budget.leftovers().values()) == 4_000


def test_the_curve_is_the_charged_bytes_after_each_allocation(budget: TensorBudget) -> None:
    with budget.trial():
        start = budget.charged
        a = torch.ones(100)
        b = torch.ones(200)
        del a
        c = torch.ones(50)
    assert budget.peak().curve == (start + 400, start + 1200, start + 1000)
    del b, c


def test_excluded_tensors_are_never_counted() -> None:
    # The probe's own host copies of the training state live on the CPU too; they are not the step's memory.
    gc.collect()
    budget = TensorBudget(torch, "cpu", limit_bytes=LOTS)
    counted = budget.live
    copies = [torch.ones(5_000)]
    budget.exclude(copies)
    with budget.trial():
        assert budget.live == counted
    budget.close()
    del copies
