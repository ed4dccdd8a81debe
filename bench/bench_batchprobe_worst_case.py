"""Issue 54's second debt, measured: how often does `%batchprobe`'s search take more trials than doubling then
bisection (Lightning's binsearch), and by how many, when the memory model's jump is contradicted by an
out-of-memory far below it; and how many it takes where the model is right.

The scenarios are the property tests' own (tests/batchprobe/test_search.py): `run_contradicted` (a step whose memory
grows by 4 KiB a sample, so the model predicts a limit near the 23 GiB budget, but that runs out of memory above a
hidden limit far below), for --start 1, 2, 5, 16, with and without --max 65536, fed curves (the CPU budget) or
peaks alone (CUDA), at every hidden limit from --start to --start + 299 and at 1000, 4095, 4096, 30001; and the
training curves of `test_curves_give_the_exact_answer_in_at_most_six_trials` at targets 40, 1000 and 65000.

    .venv/bin/python bench/bench_batchprobe_worst_case.py
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path[:0] = [str(TESTS / "batchprobe"), str(TESTS), str(TESTS / "fixtures")]

from test_search import (  # noqa: E402 -- the property tests' scenarios, not a copy of them
    CURVES,
    doubling_then_bisection,
    run_contradicted,
    run_curve_search,
    training_curve,
)


def main() -> None:
    over = total = worst = 0
    for curves in (True, False):
        for start in (1, 2, 5, 16):
            for maximum in (None, 65536):
                for limit in [*range(start, start + 300), 1000, 4095, 4096, 30_001]:
                    _, trials = run_contradicted(start, maximum, 23 << 30, limit, 4096, curves)
                    searching = len(trials) - (1 if trials[-1][2] == "re-run" else 0)
                    extra = searching - doubling_then_bisection(start, limit)
                    total += 1
                    if extra > 0:
                        over += 1
                        worst = max(worst, extra)
    print(f"contradicted model: {over} of {total} searches take more trials than doubling then bisection, "
          f"by at most {worst}")
    for shape, (model_bytes, activations, temporary) in sorted(CURVES.items()):
        curve = training_curve(model_bytes, activations, temporary, 1)
        for target in (40, 1000, 65000):
            budget = max(curve(target)) + sum(activations) // 3
            search, trials = run_curve_search(2, None, budget, curve)
            print(f"{shape:12} limit {search.answer:>6}: {len(trials)} trials, doubling then bisection "
                  f"{doubling_then_bisection(2, search.answer)}")


if __name__ == "__main__":
    main()
