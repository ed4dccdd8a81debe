"""%%gpuprofile against costs known in advance (sleeps on 2 noisy cores): each bucket within 10% of the truth, the
profiled step within 10% of the same loop unprofiled, and the whole profile within 3x the profiled steps.

The loop is tests/fixtures/known_cost_loop.py: each cost times itself where it happens, and that is the truth.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import pytest
from known_cost_loop import LOOP, SETUP, SYNC_LINE

from jupyter_gpu.gpuprofile.result import middle_half

pytestmark = pytest.mark.timing


@dataclass
class Attempt:
    """One profiled run of the known-cost loop and one unprofiled run right after it."""

    result: Any
    whole: float
    truth: dict[str, float]
    profiled_rest: float    # per step, what is left of a profiled step once its known costs are taken out
    unprofiled_rest: float  # the same of an unprofiled step
    unprofiled: float       # the unprofiled step

    @property
    def overhead_ok(self) -> bool:
        return abs(self.profiled_rest - self.unprofiled_rest) <= 0.10 * self.unprofiled


def attempt(ip) -> Attempt:
    ip.run_cell(SETUP).raise_error()
    began = time.perf_counter()
    result = ip.run_cell("%%gpuprofile -o -q --steps 30 --warmup 3\n" + LOOP).result
    whole = time.perf_counter() - began
    # A step runs from one optimizer step's end to the next: profiled step j (the 3 warm-up steps come first) holds
    # batch 3 + j's loading, forward and backward, and iteration 2 + j's logging and collection after its optimizer
    # step. The typical step is the mean over the middle half of the steps: the truth is averaged over the same.
    steps = [3 + j for j in middle_half(result.step_seconds)]
    recorded = vars(ip.user_ns["truth"])
    truth = {"data": [recorded["data"][s] for s in steps], "forward": [recorded["forward"][s] for s in steps],
             "other": [recorded["other"][s - 1] for s in steps], "gc": [recorded["gc"][s - 1] for s in steps]}
    means = {kind: statistics.mean(values) for kind, values in truth.items()}

    # The same loop unprofiled, step by step, as the user would time it. A 5 ms sleep here overruns by a timer tick
    # (10 ms) on some steps and not on others, so the two runs' steps differ by that noise, not by the profile: each
    # step's own known costs are taken out on both sides, and what is left (the loop's real work, plus the hooks on
    # the profiled side) is compared, against 10% of the unprofiled step.
    profiled_rest = statistics.fmean(result.step_seconds[j] - sum(recorded[kind][3 + j] for kind in ("data", "forward"))
                                     - sum(recorded[kind][2 + j] for kind in ("other", "gc"))
                                     for j in range(result.steps))
    for times in recorded.values():
        times.clear()
    stop = "    step_ends.append(time.perf_counter())\n"
    ip.run_cell("step_ends.clear()\nstep_ends.append(time.perf_counter())\n"
                + LOOP.replace(stop, stop + "    if len(step_ends) > 34:\n        break\n")).raise_error()
    ends = ip.user_ns["step_ends"]  # ends[k] - ends[k - 1]: iteration k - 1, all four costs of it
    pairs = [(ends[k] - ends[k - 1], k - 1) for k in range(5, len(ends))]
    unprofiled = statistics.fmean(seconds for seconds, _ in pairs)
    unprofiled_rest = statistics.fmean(seconds - sum(recorded[kind][i] for kind in recorded) for seconds, i in pairs)
    return Attempt(result, whole, means, profiled_rest, unprofiled_rest, unprofiled)


def test_each_bucket_lands_within_ten_percent_of_its_known_cost(ip) -> None:
    # Up to three attempts, the one whose profiled and unprofiled runs were least disturbed judged: the timing lane
    # runs two files at once on 2 cores, and another process's burst only slows a run (a clean clone's suite once
    # measured 5.9 ms of "rest" per profiled step against 1.2 ms unprofiled, where the profile's hooks cost 0.3 ms).
    attempts: list[Attempt] = []
    while len(attempts) < 3 and not (attempts and attempts[-1].overhead_ok):
        attempts.append(attempt(ip))
    best = min(attempts, key=lambda a: abs(a.profiled_rest - a.unprofiled_rest) / a.unprofiled)
    result = best.result
    for kind in ("data", "forward", "other", "gc"):
        # Besides the sleep, "other" holds the loop's own Python and opt.zero_grad(): a few hundred microseconds.
        assert result.bucket(kind).seconds == pytest.approx(best.truth[kind], rel=0.10, abs=0.0005), kind
    assert sum(b.seconds for b in result.breakdown) == pytest.approx(result.seconds, rel=0.05)
    [sync] = result.syncs
    assert (sync.line, sync.per_step) == (SYNC_LINE, 2.0)
    assert best.overhead_ok, [(a.profiled_rest, a.unprofiled_rest, a.unprofiled) for a in attempts]
    assert best.whole <= 3 * sum(result.step_seconds), (best.whole, sum(result.step_seconds))
