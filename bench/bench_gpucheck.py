"""How fast is `jupyter-gpu check` against what users run today, `python -m torch.utils.collect_env`?

Both run as fresh processes of the same interpreter, interleaved in one run so machine load hits both
alike; the medians and their ratio are printed. A second part times `%gpucheck` repeated in one IPython
shell (the torch probe is cached until something changes) against the first call.

    .venv/bin/python bench/bench_gpucheck.py [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def wall(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, capture_output=True, check=False)
    return time.perf_counter() - started


# What a GPU machine costs: the same check, but with torch imported in the child probe as it is whenever
# there is GPU evidence (on a machine without any, the probe is skipped because it cannot change the verdict).
FORCED_PROBE = ("from jupyter_gpu.gpucheck.facts.context import ProbeContext\n"
                "from jupyter_gpu.gpucheck.facts.gather import gather_facts\n"
                "from jupyter_gpu.gpucheck.diagnose.engine import diagnose\n"
                "print(diagnose(gather_facts(ProbeContext(), force_torch_probe=True)))")


def compare_cli(runs: int) -> None:
    ours, forced, theirs = [], [], []
    for _ in range(runs):
        ours.append(wall([sys.executable, "-m", "jupyter_gpu", "check"]))
        forced.append(wall([sys.executable, "-c", FORCED_PROBE]))
        theirs.append(wall([sys.executable, "-m", "torch.utils.collect_env"]))
    a, f, b = statistics.median(ours), statistics.median(forced), statistics.median(theirs)
    print(f"jupyter-gpu check                 median {a:.3f} s  (min {min(ours):.3f}, n={runs})")
    print(f"  same, torch probed in a child   median {f:.3f} s  (min {min(forced):.3f}, n={runs})")
    print(f"python -m torch.utils.collect_env median {b:.3f} s  (min {min(theirs):.3f}, n={runs})")
    print(f"ratio jupyter-gpu / collect_env   {a / b:.2f}  ({b / a:.1f}x faster)")
    print(f"ratio with torch probed           {f / b:.2f}  ({b / f:.1f}x faster)")


def compare_magic(runs: int) -> None:
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "jupyter_gpu")
    started = time.perf_counter()
    shell.run_line_magic("gpucheck", "-q")
    first = time.perf_counter() - started
    repeats = []
    for _ in range(runs):
        started = time.perf_counter()
        shell.run_line_magic("gpucheck", "-q")
        repeats.append(time.perf_counter() - started)
    forced = []
    for _ in range(max(3, runs // 3)):
        started = time.perf_counter()
        shell.run_line_magic("gpucheck", "-q --refresh")
        forced.append(time.perf_counter() - started)
    print(f"%gpucheck first call              {first:.3f} s")
    print(f"%gpucheck repeated                median {statistics.median(repeats):.3f} s  "
          f"(max {max(repeats):.3f}, n={runs})")
    print(f"%gpucheck --refresh               median {statistics.median(forced):.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    options = parser.parse_args()
    compare_cli(options.runs)
    compare_magic(options.runs * 3)


if __name__ == "__main__":
    main()
