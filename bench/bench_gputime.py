"""Is `%gputime` as accurate as `torch.utils.benchmark`, and how much does it add per run against `%timeit`?

Everything runs in one IPython shell in one process, interleaved round by round so machine load hits
every tool alike:

1. Accuracy: the median of `%gputime -n 200 -r 5 a @ b` against
   `torch.utils.benchmark.Timer(...).blocked_autorange()` on the same CPU matmul. The Timer gets the
   same thread count as the notebook (its default of one thread would time a different computation).
2. Overhead: the per-run time of an empty statement, `%gputime -n 100000 -r 5 pass` against
   `%timeit -n 100000 -r 5 pass` (the cost of the loop itself, which is all an empty statement measures).

    .venv/bin/python bench/bench_gputime.py [--rounds N] [--size N]
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.utils.benchmark as benchmark
from IPython.testing.globalipapp import start_ipython


def accuracy(shell, rounds: int, size: int) -> None:
    shell.user_ns["a"] = torch.randn(size, size)
    shell.user_ns["b"] = torch.randn(size, size)
    timer = benchmark.Timer(stmt="a @ b", globals={"a": shell.user_ns["a"], "b": shell.user_ns["b"]},
                            num_threads=torch.get_num_threads())
    ours, theirs = [], []
    for _ in range(rounds):
        ours.append(shell.run_line_magic("gputime", "-n 200 -r 5 -q -o a @ b").median)
        theirs.append(timer.blocked_autorange(min_run_time=1.0).median)
    mine, reference = statistics.median(ours), statistics.median(theirs)
    print(f"CPU matmul {size}x{size}, {torch.get_num_threads()} threads, {rounds} interleaved rounds")
    print(f"  %gputime -n 200 -r 5          median {mine * 1e6:9.2f} µs  (rounds: {_spread(ours)})")
    print(f"  Timer.blocked_autorange       median {reference * 1e6:9.2f} µs  (rounds: {_spread(theirs)})")
    print(f"  ratio %gputime / Timer        {mine / reference:.3f}  (difference {abs(mine / reference - 1):.1%})")


def overhead(shell, rounds: int) -> None:
    ours, theirs = [], []
    for _ in range(rounds):
        ours.append(shell.run_line_magic("gputime", "-n 100000 -r 5 -q -o --no-ops pass").median)
        theirs.append(statistics.median(shell.run_line_magic("timeit", "-n 100000 -r 5 -q -o pass").timings))
    mine, reference = statistics.median(ours), statistics.median(theirs)
    print("Empty statement, per run (the timing loop's own cost)")
    print(f"  %gputime -n 100000 -r 5       median {mine * 1e9:7.1f} ns  (rounds: {_spread(ours, 1e9, 'ns')})")
    print(f"  %timeit  -n 100000 -r 5       median {reference * 1e9:7.1f} ns  "
          f"(rounds: {_spread(theirs, 1e9, 'ns')})")
    print(f"  ratio %gputime / %timeit      {mine / reference:.2f}  "
          f"(+{(mine - reference) * 1e9:.1f} ns per run)")


def _spread(values: list[float], scale: float = 1e6, unit: str = "µs") -> str:
    return f"{min(values) * scale:.1f}-{max(values) * scale:.1f} {unit}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=256)
    args = parser.parse_args()
    shell = start_ipython()
    shell.run_line_magic("load_ext", "jupyter_gpu")
    accuracy(shell, args.rounds, args.size)
    overhead(shell, args.rounds)


if __name__ == "__main__":
    main()
