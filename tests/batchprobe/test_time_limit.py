"""`%batchprobe --max-seconds`: a search whose trials grow slow with the batch (a CPU step takes as long as its
batch is big) stops before the trial that would end past the limit, and says what ran, where the memory limit lies
and how to go on. The step's cost is known: it sleeps in proportion to the batch and holds memory in proportion."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from jupyter_gpu.batchprobe.render import headline
from jupyter_gpu.batchprobe.result import Trial
from jupyter_gpu.batchprobe.runner import ProbeRequest, run_probe
from jupyter_gpu.batchprobe.time_limit import affordable_size, predicted_seconds

MiB = 2**20
SLEEP_PER_SAMPLE = 2e-3  # a batch of 1,000 takes 2 s a step
BYTES_PER_SAMPLE = 64 * 1024  # 16,384 float32 per sample: 1,000 samples hold 64 MiB


def slow_step_in(namespace: dict) -> None:
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(batch_size: int) -> None:
        activations = torch.ones(batch_size, BYTES_PER_SAMPLE // 4)
        time.sleep(SLEEP_PER_SAMPLE * batch_size)
        opt.zero_grad()
        model(activations[:, :4]).sum().backward()
        opt.step()

    namespace.update(model=model, opt=opt, step=step)


def test_the_search_stops_before_a_trial_that_would_end_past_the_limit_and_says_where_the_limit_lies() -> None:
    namespace: dict = {}
    slow_step_in(namespace)
    started = time.perf_counter()
    result = run_probe(namespace["step"], ProbeRequest(max_memory=64 * MiB, max_seconds=2.0), namespace=namespace)
    took = time.perf_counter() - started
    # Without the limit the search would go on to ~1,000 (2 s a step, 2 steps a trial).
    assert result.limited_by == "time limit" and not result.interrupted
    limit = result.time_limit
    assert limit is not None and limit["seconds"] == 2.0
    # The trials kept to the limit, and the one refused never ran: had it, the probe would have taken at least its
    # known cost more (the probe's own overhead, not bounded here, took 4.2 s of wall time beside another test).
    assert sum(t.seconds for t in result.trials) < 2.0 + 0.5
    assert took < 2.0 + 2 * SLEEP_PER_SAMPLE * limit["next_size"], took
    assert limit["next_size"] > result.max_batch_size >= 2
    ran = {t.batch_size for t in result.trials if t.fitted}
    assert result.max_batch_size == max(ran) and limit["next_size"] not in ran
    # Before stopping it tried the largest size the time left afforded, not just the doubling's 4.
    last = result.trials[-1]
    assert last.how == "time left" and last.fitted and last.batch_size == result.max_batch_size > 8
    # Predicted from the largest trial that ran, scaled by the batch: never less than the known cost.
    assert limit["predicted_seconds"] >= 2 * SLEEP_PER_SAMPLE * limit["next_size"]
    assert result.recommended in ran  # no trial beyond the limit for the recommendation either
    text = headline(result)
    assert f"batch {result.max_batch_size} runs; stopped at the 2.00 s time limit" in text, text
    assert f"the next trial (batch {limit['next_size']}) would take about" in text
    assert "raise --max-seconds" in text and f"--start {result.max_batch_size}" in text
    assert "max batch size" not in text  # it is not the most that fits, and does not say so
    assert f"{result.search_trials} trials before the time limit" in str(result)  # not "to find the limit"
    assert "to find the limit" not in str(result)


def test_without_a_limit_the_same_step_is_searched_to_its_memory_limit() -> None:
    namespace: dict = {}
    slow_step_in(namespace)
    result = run_probe(namespace["step"], ProbeRequest(max_memory=4 * MiB, max_seconds=None), namespace=namespace)
    assert result.limited_by == "memory" and result.time_limit is None
    assert 32 <= result.max_batch_size <= 64  # 4 MiB at 64 KiB a sample, less what the step holds besides


def trial(size: int, step_seconds: float, seconds: float, fitted: bool = True) -> Trial:
    return Trial(batch_size=size, fitted=fitted, peak_bytes=1, step_seconds=step_seconds,
                 samples_per_second=size / step_seconds, steps_run=2, seconds=seconds)


def test_a_trial_is_predicted_in_proportion_to_the_largest_step_plus_the_fixed_cost() -> None:
    # Steps of 1 ms + 1 ms per sample; each trial also spends 50 ms restoring state. At 8 a step is 9 ms, so 1.125 ms
    # a sample: proportional overestimates a larger size (1,000: 1.125 s a step against 1.001 s), never under.
    trials = [trial(2, 0.003, 0.056), trial(4, 0.005, 0.060), trial(8, 0.009, 0.068)]
    assert predicted_seconds(trials, 1000, steps=2) == pytest.approx(0.05 + 2 * 1.125, rel=1e-6)
    assert predicted_seconds(trials, 1000, steps=2) > 0.05 + 2 * (0.001 + 1.0)
    # And the inverse: the largest size whose trial takes at most 80% of the time left.
    size = affordable_size(trials, 10.0, steps=2)
    assert size is not None and predicted_seconds(trials, size, 2) <= 8.0 < predicted_seconds(trials, size + 1, 2)


def test_small_sizes_that_cost_the_same_do_not_make_a_large_one_look_cheap() -> None:
    # Batches 2 and 4 both take 40 ms (all fixed cost): a line through them would call batch 9,000 free.
    trials = [trial(2, 0.040, 0.1), trial(4, 0.040, 0.1), trial(16, 0.5, 0.03, fitted=False)]
    assert predicted_seconds(trials, 9000, steps=2) == pytest.approx(0.02 + 2 * 0.010 * 9000, rel=1e-6)
    assert predicted_seconds([], 800, steps=2) is None  # the first trial always runs


def test_a_step_whose_time_does_not_grow_is_searched_to_the_end_despite_a_first_prediction_past_the_limit() -> None:
    # Every size costs the same 20 ms a step: scaled from batch 4, batch 65,536 looks like minutes, but the trials
    # in the time left show it is not, and the search reaches --max.
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(batch_size: int) -> None:
        time.sleep(0.02)
        opt.zero_grad()
        model(torch.ones(min(batch_size, 8), 4)).sum().backward()
        opt.step()

    namespace = {"model": model, "opt": opt}
    result = run_probe(step, ProbeRequest(max_memory=64 * MiB, max_seconds=4.0), namespace=namespace)
    assert result.time_limit is None and result.limited_by in ("--max", "ignores batch_size"), result.limited_by
    assert any(t.how == "time left" for t in result.trials)  # the first prediction was past the limit
