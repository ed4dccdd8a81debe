"""Is `%gputime` as accurate as `torch.utils.benchmark`, and how much does it add per run against `%timeit`?

Everything runs in one IPython shell in one process, interleaved round by round so machine load hits
every tool alike:

1. Accuracy: the median of `%gputime -n 200 -r 5 a @ b` against
   `torch.utils.benchmark.Timer(...).blocked_autorange()` on the same CPU matmul. The Timer gets the
   same thread count as the notebook (its default of one thread would time a different computation).
2. Overhead: the per-run time of an empty statement, `%gputime -n 100000 -r 5 pass` against
   `%timeit -n 100000 -r 5 pass` (the cost of the loop itself, which is all an empty statement measures).
3. Fixed cost: one `%gputime` call around a trivial statement against `%time`.

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


def fixed_cost(shell, rounds: int) -> None:
    """What one call of the magic costs around the cell: backend read, counting set-up, display."""
    import time
    from contextlib import redirect_stdout
    from io import StringIO

    ours, theirs = [], []
    for _ in range(rounds * 4):
        started = time.perf_counter()
        shell.run_line_magic("gputime", "-q x = 1")
        ours.append(time.perf_counter() - started)
        started = time.perf_counter()
        with redirect_stdout(StringIO()):
            shell.run_line_magic("time", "x = 1")
        theirs.append(time.perf_counter() - started)
    mine, reference = statistics.median(ours), statistics.median(theirs)
    print("One call around a trivial statement (the magic's fixed cost)")
    print(f"  %gputime -q x = 1             median {mine * 1e6:9.1f} µs")
    print(f"  %time x = 1                   median {reference * 1e6:9.1f} µs")


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
    fixed_cost(shell, args.rounds)


if __name__ == "__main__":
    main()
