"""The `%batchprobe` engine (`run_probe`, `probe_batch_size`) on real CPU torch training steps under a memory budget.

The CPU budget counts the bytes live tensors hold and raises torch.OutOfMemoryError past it, so a real MLP + Adam
step really runs out of memory half-way (usually in backward); the answers are checked against a brute-force run
of the same step under an independent `TensorBudget`.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import random
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from jupyter_gpu.batchprobe.budget import TensorBudget
from jupyter_gpu.batchprobe.result import BatchProbeResult
from jupyter_gpu.batchprobe.runner import ProbeError, ProbeRequest, StickyCudaError, probe_batch_size, run_probe

MiB = 2**20
BUDGET = 4 * MiB
OOM_MESSAGE = "CUDA out of memory. Tried to allocate 2.00 GiB"

Step = Callable[[int], Any]


class Net(nn.Module):
    """Activations grow with the batch (BatchNorm1d, three pointwise layers); its parameters are small."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, width), nn.BatchNorm1d(width), nn.GELU(), nn.Tanh(), nn.SiLU())
        self.head = nn.Sequential(nn.Dropout(0.1), nn.Linear(width, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


@dataclasses.dataclass
class Training:
    model: Net
    opt: torch.optim.Adam
    step: Step
    refs: list[weakref.ref[torch.Tensor]]

    @property
    def namespace(self) -> dict[str, Any]:
        return {"model": self.model, "opt": self.opt}


def make_training(seed: int = 0, fail_from: int | None = None) -> Training:
    """A real training step: model.train(), forward, backward, Adam step; `fail_from` raises ValueError from then."""
    torch.manual_seed(seed)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    refs: list[weakref.ref[torch.Tensor]] = []

    def step(batch_size: int) -> None:
        model.train()
        x = torch.randn(batch_size, 16)
        y = torch.randint(0, 4, (batch_size,))
        hidden = model.body(x)
        refs.append(weakref.ref(hidden))
        loss = nn.functional.cross_entropy(model.head(hidden), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if fail_from is not None and batch_size >= fail_from:
            raise ValueError(f"labels do not match batch {batch_size}")  # after the state changed

    return Training(model, opt, step, refs)


def fits_under_fresh_budget(size: int, steps: int = 2) -> bool:
    """Brute force: a fresh copy of the training state runs `steps` steps at `size` under an independent budget."""
    training = make_training()
    try:
        with TensorBudget(torch, "cpu", BUDGET).trial():
            for _ in range(steps):
                training.step(size)
        return True
    except torch.OutOfMemoryError:
        return False
    finally:
        del training


def probe_fresh(request: ProbeRequest) -> BatchProbeResult:
    training = make_training()
    result = run_probe(training.step, request, namespace=training.namespace)
    del training
    gc.collect()  # the brute force after this must see the same baseline as the probe did
    return result


def sequence(result: BatchProbeResult) -> list[tuple[int, bool, str]]:
    return [(t.batch_size, t.fitted, t.how) for t in result.trials]


def fingerprint(training: Training) -> dict[str, Any]:
    """Everything a trial can change, as values (clones) and identities, comparable bitwise.

    Gradients by value only: the probe holds them weakly, so one nobody else holds may come back as a new
    object with the same bytes (`test_a_gradient_the_user_holds_comes_back_as_the_same_object`).
    """
    model, opt = training.model, training.opt
    params = dict(model.named_parameters())
    return {
        "params": {name: (id(p), p.detach().clone()) for name, p in params.items()},
        "grads": {name: None if p.grad is None else p.grad.clone() for name, p in params.items()},
        "buffers": {name: (id(b), b.clone()) for name, b in model.named_buffers()},
        "training": {name: module.training for name, module in model.named_modules()},
        "opt_state": [(id(p), {key: (id(v), v.clone()) if torch.is_tensor(v) else v for key, v in state.items()})
                      for p, state in opt.state.items()],
        "opt_groups": [{key: value for key, value in group.items() if key != "params"} for group in opt.param_groups],
        "opt_params": [[id(p) for p in group["params"]] for group in opt.param_groups],
    }


def assert_same(before: Any, after: Any, where: str = "state") -> None:
    if isinstance(before, dict):
        assert isinstance(after, dict) and before.keys() == after.keys(), where
        for key in before:
            assert_same(before[key], after[key], f"{where}[{key!r}]")
    elif isinstance(before, list | tuple):
        assert isinstance(after, list | tuple) and len(before) == len(after), where
        for index, (old, new) in enumerate(zip(before, after, strict=True)):
            assert_same(old, new, f"{where}[{index}]")
    elif torch.is_tensor(before):
        assert torch.is_tensor(after) and before.dtype == after.dtype, where
        assert torch.equal(before.view(torch.uint8) if before.dim() else before, after.view(torch.uint8)
                           if after.dim() else after), f"{where} changed"
    else:
        assert before == after, f"{where}: {before!r} != {after!r}"


def rng_draws() -> tuple[list[float], float, list[float]]:
    return torch.rand(4).tolist(), random.random(), np.random.rand(3).tolist()


# -- the exact limit --------------------------------------------------------------------------------------


def test_the_limit_is_exact_against_brute_force_and_verified_after_the_last_failure() -> None:
    result = probe_fresh(ProbeRequest(max_memory=BUDGET))
    answer = result.max_batch_size
    tried = sequence(result)
    assert answer > 64, tried

    assert fits_under_fresh_budget(answer), tried
    assert not fits_under_fresh_budget(answer + 1), tried
    for smaller in (answer - 1, answer // 2):
        assert fits_under_fresh_budget(smaller), (smaller, tried)

    assert result.limited_by == "memory"
    last_fit = max(i for i, t in enumerate(result.trials) if t.batch_size == answer and t.fitted)
    last_failure = max(i for i, t in enumerate(result.trials) if not t.fitted)
    assert last_fit > last_failure, tried
    assert result.trial(answer) is not None and result.trial(answer).fitted
    assert result.trial(answer).peak_bytes <= BUDGET
    assert any(t.batch_size == answer + 1 and not t.fitted for t in result.trials), tried

    recommended = result.trial(result.recommended)
    assert 0 < result.recommended <= answer
    assert recommended is not None and recommended.fitted, tried
    assert recommended.peak_bytes <= (1 - result.margin) * BUDGET
    assert result.search_trials <= 6, tried


def test_a_step_that_only_raises_out_of_memory_gets_the_exact_hidden_limit() -> None:
    hidden = 40

    def step(batch_size: int) -> None:
        if batch_size > hidden:
            raise torch.OutOfMemoryError(OOM_MESSAGE)

    result = run_probe(step, ProbeRequest(max_memory=BUDGET), namespace={})
    assert result.max_batch_size == hidden, sequence(result)
    assert result.trial(hidden + 1) is not None and not result.trial(hidden + 1).fitted
    assert result.limited_by == "memory"
    assert 0 < result.recommended <= hidden


def test_a_size_limit_error_is_reported_as_a_size_limit_not_memory() -> None:
    limit = 24

    def step(batch_size: int) -> None:
        if batch_size > limit:
            raise RuntimeError("CUDA error: invalid configuration argument")

    result = run_probe(step, ProbeRequest(max_memory=BUDGET), namespace={})
    assert result.max_batch_size == limit, sequence(result)
    assert result.limited_by == "size limit"
    assert f"{limit + 1} hits a size limit" in str(result)


def test_a_sticky_cuda_error_stops_the_probe_and_says_restart_the_kernel() -> None:
    calls: list[int] = []

    def step(batch_size: int) -> None:
        calls.append(batch_size)
        if batch_size > 8:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(StickyCudaError, match="restart the kernel") as stopped:
        run_probe(step, ProbeRequest(max_memory=BUDGET), namespace={})
    assert "illegal memory access" in str(stopped.value.__cause__)
    assert max(calls) == 16 and calls.count(16) == 1  # no retry after the context is gone


@pytest.mark.parametrize(("maximum", "hidden"), [(128, 8), (500, 100)])
def test_the_peers_cases_an_out_of_memory_above_a_size_gives_exactly_that_size(maximum: int, hidden: int) -> None:
    # accelerate's test_memory_explicit (out of memory above 8) and a finder started at 500 with failures above
    # 100: accelerate's `starting_batch_size` is the largest size it tries, which is our --max.
    tried: list[int] = []

    def step(batch_size: int) -> None:
        tried.append(batch_size)
        torch.ones(batch_size, 64).sum()
        if batch_size > hidden:
            raise torch.OutOfMemoryError(OOM_MESSAGE)

    result = run_probe(step, ProbeRequest(maximum=maximum, max_memory=BUDGET), namespace={})
    assert result.max_batch_size == hidden and result.limited_by == "memory", sequence(result)
    assert max(tried) <= maximum and min(tried) >= 2


@pytest.mark.timing
def test_the_progress_line_keeps_counting_during_a_long_trial() -> None:
    shown: list[tuple[float, str]] = []
    started = time.perf_counter()

    def step(batch_size: int) -> None:
        time.sleep(0.9)

    run_probe(step, ProbeRequest(start=2, maximum=2, max_memory=BUDGET, steps=2), namespace={},
              progress=lambda text: shown.append((time.perf_counter() - started, text)))
    during = [(at, text) for at, text in shown if "trial 1: batch 2 (start) …" in text]
    assert len(during) >= 2, shown  # the line as the trial starts, then at least one tick while it runs
    scale = {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}
    elapsed = [float(number) * scale[unit] for number, unit in
               (text.rsplit("[", 1)[1].rstrip("]").split() for _, text in during)]
    assert elapsed == sorted(elapsed) and elapsed[-1] >= 0.9, during
    assert shown[-1][1] == ""  # emptied at the end, and no tick after it
    time.sleep(1.2)
    assert shown[-1][1] == ""


def test_the_max_cap_is_reported_as_the_limit() -> None:
    calls: list[int] = []

    def step(batch_size: int) -> None:  # real work that grows with the batch, far below the budget
        calls.append(batch_size)
        torch.ones(batch_size, 256).mul(2).sum()

    result = run_probe(step, ProbeRequest(maximum=50, max_memory=BUDGET), namespace={})
    assert result.max_batch_size == 50
    assert result.limited_by == "--max"
    assert max(calls) == 50  # nothing above the cap was run
    assert "the --max cap, not memory" in str(result)


def test_nothing_fits_when_the_budget_is_below_what_is_already_in_use() -> None:
    training = make_training()
    result = run_probe(training.step, ProbeRequest(max_memory=1024), namespace=training.namespace)
    assert result.max_batch_size == 0 and result.recommended == 0
    assert result.limited_by == "nothing fits"
    assert result.trials and not any(t.fitted for t in result.trials)
    assert str(result).startswith("batchprobe: nothing fits at --start 2: batch 2 needs more than ")
    assert "the budget is 1.0 KiB" in str(result)


# -- state and memory ------------------------------------------------------------------------------------


@pytest.mark.parametrize("trained", [False, True], ids=["fresh", "trained"])
def test_the_state_is_bitwise_the_same_after_trials_that_failed_half_way(trained: bool) -> None:
    training = make_training(seed=1)
    if trained:  # gradients and Adam moments exist before the probe
        training.step(8)
    training.model.head.eval()  # a submodule in eval mode, which the step's model.train() switches
    before = fingerprint(training)
    assert (training.opt.state != {}) is trained
    rng = (torch.get_rng_state(), random.getstate(), np.random.get_state())
    expected_draws = rng_draws()
    torch.set_rng_state(rng[0])
    random.setstate(rng[1])
    np.random.set_state(rng[2])

    result = run_probe(training.step, ProbeRequest(max_memory=BUDGET), namespace=training.namespace)

    assert any(not t.fitted for t in result.trials), sequence(result)
    assert rng_draws() == expected_draws
    after = fingerprint(training)
    assert_same(before, after)
    if not trained:
        assert all(p.grad is None for p in training.model.parameters())
        assert len(training.opt.state) == 0
    assert training.model.head.training is False and training.model.body.training is True
    assert training.model.body[1].num_batches_tracked.item() == (1 if trained else 0)


def test_memory_is_back_to_the_start_and_every_trial_tensor_is_freed() -> None:
    training = make_training()
    result = run_probe(training.step, ProbeRequest(max_memory=BUDGET), namespace=training.namespace)
    assert any(not t.fitted for t in result.trials)
    assert len(training.refs) >= len(result.trials)
    assert result.memory_after == result.memory_before
    assert [ref for ref in training.refs if ref() is not None] == []
    assert "back to the starting level" in str(result)
    # More memory after, with every trial tensor freed, is no reference the step kept: on the H200 it was cuBLAS's
    # workspaces, allocated during the trials and kept by torch.
    grown = replace(result, memory_after=result.memory_before + (65 << 20))
    assert "65.0 MiB more than before, held by no tensor the trials made" in str(grown)
    kept = replace(grown, leftovers=[{"batch_size": 8, "bytes": 65 << 20, "holders": []}])
    assert "(something the step created is still referenced)" in str(kept)


def test_a_non_oom_error_is_one_sentence_with_the_users_line_and_the_state_is_restored() -> None:
    training = make_training(fail_from=20)
    training.step(4)
    before = fingerprint(training)
    with pytest.raises(ProbeError) as caught:
        run_probe(training.step, ProbeRequest(max_memory=BUDGET), namespace=training.namespace)
    message = str(caught.value)
    assert message.startswith("the step raised ValueError: labels do not match batch ")
    assert " (at test_probe.py, line " in message  # the user's own line, with its text
    assert "`raise ValueError(" in message and message.endswith("(everything it changed was put back)")
    assert int(message.split(" at batch size ")[1].split()[0]) >= 20  # the size it failed at
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # no package traceback under it
    assert_same(before, fingerprint(training))


def test_a_step_that_takes_other_arguments_is_refused_before_any_trial() -> None:
    training = make_training()
    before = fingerprint(training)
    with pytest.raises(ProbeError, match=r"^`no_size` takes no arguments, and %batchprobe calls it with one argument, "
                                         r"the batch size: step\(batch_size\); write def step\(batch_size\)"):
        run_probe(named(lambda: None, "no_size"), ProbeRequest(max_memory=BUDGET), namespace=training.namespace)
    with pytest.raises(ProbeError, match=r"^`two` takes batch_size, extra, and %batchprobe calls it"):
        run_probe(named(lambda batch_size, extra: None, "two"), ProbeRequest(max_memory=BUDGET),
                  namespace=training.namespace)
    assert_same(before, fingerprint(training))


def named(function, name: str):
    function.__name__ = name
    return function


def test_keyboard_interrupt_keeps_the_finished_trials_and_restores_the_state() -> None:
    training = make_training()
    training.step(4)
    before = fingerprint(training)
    calls = 0
    steps = 2

    def step(batch_size: int) -> None:
        nonlocal calls
        calls += 1
        training.step(batch_size)
        if calls == 2 * steps + 1:  # the first step of the third trial, after it changed the state
            raise KeyboardInterrupt

    result = run_probe(step, ProbeRequest(max_memory=BUDGET, steps=steps), namespace=training.namespace)
    assert result.interrupted
    assert len(result.trials) == 2 and all(t.fitted for t in result.trials)
    assert_same(before, fingerprint(training))
    assert "Interrupted" in str(result)
    assert "no recommendation (interrupted" in str(result) and "recommended 0" not in str(result)

    calls = 0
    with pytest.raises(KeyboardInterrupt):
        probe_batch_size(step, ProbeRequest(max_memory=BUDGET, steps=steps), namespace=training.namespace)
    assert_same(before, fingerprint(training))


# -- what each trial reports ----------------------------------------------------------------------------


@pytest.mark.timing
def test_each_trial_runs_steps_steps_and_times_the_steady_state() -> None:
    steps = 3
    calls: list[int] = []

    def step(batch_size: int) -> None:
        # The first step of each trial is slow (warm-up, lazy state), the following ones fast.
        time.sleep(0.1 if len(calls) % steps == 0 else 0.002)
        calls.append(batch_size)

    result = run_probe(step, ProbeRequest(maximum=16, steps=steps, max_memory=BUDGET), namespace={})
    assert all(t.fitted for t in result.trials), sequence(result)  # no failure: every trial ran all its steps
    assert len(calls) == steps * len(result.trials)
    for trial in result.trials:
        assert trial.steps_run == steps
        assert calls.count(trial.batch_size) >= steps
        assert trial.step_seconds is not None and 0.002 <= trial.step_seconds < 0.05
        assert trial.samples_per_second == pytest.approx(trial.batch_size / trial.step_seconds)
        assert trial.peak_bytes is not None and trial.peak_bytes <= BUDGET


def test_amp_bf16_runs_the_step_under_cpu_autocast() -> None:
    seen: list[tuple[bool, torch.dtype, torch.dtype]] = []
    weight = torch.randn(8, 8)

    def step(batch_size: int) -> None:
        out = torch.randn(batch_size, 8) @ weight
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), out.dtype))

    result = run_probe(step, ProbeRequest(maximum=4, amp="bf16", max_memory=BUDGET), namespace={})
    assert result.amp == "bf16" and seen
    assert set(seen) == {(True, torch.bfloat16, torch.bfloat16)}
    assert not torch.is_autocast_enabled("cpu")  # off again after the probe


def test_the_result_serialises_and_renders_its_numbers() -> None:
    kept: list[torch.Tensor] = []

    def step(batch_size: int) -> None:
        kept.append(torch.ones(batch_size, 64))
        kept.clear()
        if batch_size > 100:
            raise torch.OutOfMemoryError(OOM_MESSAGE)

    result = run_probe(step, ProbeRequest(max_memory=BUDGET), namespace={})
    assert result.max_batch_size == 100
    data = json.loads(json.dumps(result.to_dict()))
    assert data["max_batch_size"] == result.max_batch_size and data["recommended"] == result.recommended
    assert len(data["trials"]) == len(result.trials)
    first = data["trials"][0]
    assert {"batch_size", "fitted", "peak_bytes", "samples_per_second"} <= first.keys()
    text, html = str(result), result._repr_html_()
    assert text.startswith(f"batchprobe: max batch size {result.max_batch_size}")
    for shown in (text, html):
        assert str(result.max_batch_size) in shown and str(result.recommended) in shown


@pytest.mark.parametrize(("held", "advised"), [(64 * 1024, True), (256, False)])
def test_a_notebook_tensor_is_advised_off_only_when_it_is_a_real_share_of_the_budget(held: int, advised: bool) -> None:
    # A CNN cell's last `inputs` batch (384 KiB) was advised off a 22.6 GiB budget: noise beside what matters.
    def step(batch_size: int) -> None:
        if batch_size > 100:
            raise torch.OutOfMemoryError(OOM_MESSAGE)

    features = torch.ones(held // 4)  # float32: `held` bytes
    result = probe_batch_size(step, ProbeRequest(max_memory=BUDGET), namespace={"features": features})
    text = str(result)
    assert "held before  features " in text
    assert ("if training keeps features on the host, it would not be on the GPU: give --max-memory" in text) is advised


def test_html_escapes_text_from_the_step() -> None:
    def step(batch_size: int) -> None:
        if batch_size > 10:
            raise torch.OutOfMemoryError("CUDA out of memory <script>alert(1)</script>")

    result = run_probe(step, ProbeRequest(max_memory=BUDGET), namespace={})
    assert result.max_batch_size == 10
    assert "<script>" not in result._repr_html_()
    hostile = dataclasses.replace(result, device="<script>alert(2)</script>", notes=["<img src=x onerror=alert(3)>"])
    html = hostile._repr_html_()
    assert "<script>" not in html and "<img" not in html
    assert "&lt;script&gt;" in html
