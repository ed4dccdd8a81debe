"""What does `jupyter-gpu autoload on` cost a kernel? Kernel start with and without it, the extension's own
load time, the first cell, the kernel's memory, and how long until the check's answer is ready.

Kernels of a temporary environment (tests/autoload/autoload_kernels.py) are started with jupyter_client,
alternating with and without autoload so machine load hits both alike; medians (min-max) are printed.

    .venv/bin/python bench/bench_autoload.py [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "autoload"))

from autoload_kernels import RunningKernel, TempEnvironment, make_environment

STATE = "__import__('jupyter_gpu.autoload.extension').autoload.extension.STATE"
RSS = "int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1])"  # KiB


def one_kernel(environment: TempEnvironment, autoload: bool) -> dict[str, float]:
    switch = environment.autoload("on" if autoload else "off")
    assert switch.returncode == 0, switch.stderr
    with RunningKernel(environment) as kernel:
        measured = {"start_s": kernel.start_seconds, "rss_mib": int(kernel.evaluate(RSS)) / 1024}
        started = time.perf_counter()
        kernel.run("pass")
        measured["first_cell_s"] = time.perf_counter() - started
        if autoload:
            measured["load_s"] = float(kernel.evaluate(f"{STATE}.load_seconds"))
            kernel.wait_for_check()
            measured["answer_ready_s"] = kernel.start_seconds + time.perf_counter() - started
    return measured


def summary(values: list[float], unit: str, scale: float = 1.0) -> str:
    median = statistics.median(values) * scale
    return f"median {median:8.1f} {unit}  ({min(values) * scale:.1f}-{max(values) * scale:.1f}, n={len(values)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    environment = make_environment(Path(tempfile.mkdtemp(prefix="bench-autoload-")))
    one_kernel(environment, autoload=True)  # warm-up: .pyc files, page cache
    without, with_ = [], []
    for _ in range(runs):
        without.append(one_kernel(environment, autoload=False))
        with_.append(one_kernel(environment, autoload=True))
    environment.autoload("off")

    def column(rows: list[dict[str, float]], key: str) -> list[float]:
        return [row[key] for row in rows]

    start_without, start_with = column(without, "start_s"), column(with_, "start_s")
    print(f"kernel start, without autoload    {summary(start_without, 'ms', 1000)}")
    print(f"kernel start, with autoload       {summary(start_with, 'ms', 1000)}")
    difference = statistics.median(start_with) - statistics.median(start_without)
    print(f"  difference of medians           {difference * 1000:+.1f} ms")
    print(f"extension load (its own timer)    {summary(column(with_, 'load_s'), 'ms', 1000)}")
    print(f"first cell, without autoload      {summary(column(without, 'first_cell_s'), 'ms', 1000)}")
    print(f"first cell, with autoload         {summary(column(with_, 'first_cell_s'), 'ms', 1000)}")
    print(f"kernel RSS, without autoload      {summary(column(without, 'rss_mib'), 'MiB')}")
    print(f"kernel RSS, with autoload         {summary(column(with_, 'rss_mib'), 'MiB')}")
    print(f"check's answer ready after launch {summary(column(with_, 'answer_ready_s'), 's')}")


if __name__ == "__main__":
    main()
