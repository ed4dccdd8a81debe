"""How fast is `jupyter-gpu check` on a GPU machine, against a bare `import torch` and `collect_env`?

Everything runs as fresh processes of this interpreter, interleaved round by round so machine load hits
every case alike; medians and ratios are printed:

- `python -c 'import torch'`: the floor, since the check imports torch once in a child;
- `python -m torch.utils.collect_env`: what users run today;
- `jupyter-gpu check` as on a machine without a GPU (torch is not imported: it cannot change the verdict);
- `jupyter-gpu check`, first check: the torch probe forced as on a GPU machine, the cache empty;
- `jupyter-gpu check`, repeated in a new process: the probe's answer read from the cache.

The probe is forced with `JUPYTER_GPU_FORCE_TORCH_PROBE=1` (an environment variable meant for benchmarks:
the torch child runs exactly as it does where there is GPU evidence, started at once beside the base child),
and every round gets an empty cache folder (`JUPYTER_GPU_CACHE_DIR`). A second part times `%gpucheck`
in one IPython shell, forced the same way. Goals (issue 15): first check within 1.1x of the bare import,
repeated check under 0.3 s.

    .venv/bin/python bench/bench_gpucheck.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

FORCE = {"JUPYTER_GPU_FORCE_TORCH_PROBE": "1"}
CHECK = [sys.executable, "-m", "jupyter_gpu", "check"]
FIRST_GOAL, REPEATED_GOAL_S = 1.1, 0.3


def wall(command: list[str], env: dict[str, str] | None = None) -> float:
    started = time.perf_counter()
    subprocess.run(command, capture_output=True, check=False, env={**os.environ, **(env or {})})
    return time.perf_counter() - started


def probe_record(cache: str, *args: str) -> dict:
    done = subprocess.run([*CHECK, "--json", *args], capture_output=True, text=True, check=False,
                          env={**os.environ, **FORCE, "JUPYTER_GPU_CACHE_DIR": cache})
    return json.loads(done.stdout)["facts"]["probe"]["torch"]


def confirm_what_is_measured() -> None:
    """The forced first check really imports torch in a child and the repeated one really reads the cache."""
    with tempfile.TemporaryDirectory() as cache:
        first, repeated = probe_record(cache), probe_record(cache)
    assert first["ran"] and not first["cached"] and first["ok"], first
    assert repeated["cached"] and repeated["cache_status"] == "hit", repeated
    print(f"first check: torch child ran ({first['wall_s']:.3f} s in the child), "
          f"repeated check: cached ({repeated['cache_file']})")


def compare_cli(runs: int) -> None:
    times: dict[str, list[float]] = {name: [] for name in ("bare", "collect_env", "check", "first", "repeated")}
    for round_ in range(runs):
        with tempfile.TemporaryDirectory() as cache:
            forced = {**FORCE, "JUPYTER_GPU_CACHE_DIR": cache}  # empty: this round's first check fills it
            # The repeated check must follow the first one; the groups rotate so no case always goes first.
            groups: list[list[tuple[str, list[str], dict[str, str] | None]]] = [
                [("bare", [sys.executable, "-c", "import torch"], None)],
                [("collect_env", [sys.executable, "-m", "torch.utils.collect_env"], None)],
                [("check", CHECK, None)],
                [("first", CHECK, forced), ("repeated", CHECK, forced)],
            ]
            shift = round_ % len(groups)
            for group in groups[shift:] + groups[:shift]:
                for name, command, env in group:
                    times[name].append(wall(command, env))
    median = {name: statistics.median(values) for name, values in times.items()}
    labels = {
        "bare": "python -c 'import torch'",
        "collect_env": "python -m torch.utils.collect_env",
        "check": "jupyter-gpu check (no GPU here)",
        "first": "jupyter-gpu check, probe, 1st",
        "repeated": "jupyter-gpu check, probe, again",
    }
    for name, label in labels.items():
        print(f"{label:36} median {median[name]:.3f} s  (min {min(times[name]):.3f}, n={runs})")
    first_ratio = median["first"] / median["bare"]
    print(f"first check / bare import torch      {first_ratio:.2f}  (goal <= {FIRST_GOAL}: "
          f"{'met' if first_ratio <= FIRST_GOAL else 'NOT met'}); "
          f"fastest runs: {min(times['first']) / min(times['bare']):.2f}, less hit by other load")
    print(f"repeated check                       {median['repeated']:.3f} s  (goal < {REPEATED_GOAL_S} s: "
          f"{'met' if median['repeated'] < REPEATED_GOAL_S else 'NOT met'})")
    print(f"first check / collect_env            {median['first'] / median['collect_env']:.2f}  "
          f"({median['collect_env'] / median['first']:.1f}x faster)")
    print(f"repeated check / collect_env         {median['repeated'] / median['collect_env']:.2f}  "
          f"({median['collect_env'] / median['repeated']:.1f}x faster)")
    print(f"check without a GPU / collect_env    {median['check'] / median['collect_env']:.2f}")


def compare_magic(runs: int) -> None:
    from IPython.testing.globalipapp import start_ipython

    with tempfile.TemporaryDirectory() as cache:
        os.environ.update({**FORCE, "JUPYTER_GPU_CACHE_DIR": cache})
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
    print(f"%gpucheck first call (probe)         {first:.3f} s")
    print(f"%gpucheck repeated (cached)          median {statistics.median(repeats):.3f} s  "
          f"(max {max(repeats):.3f}, n={runs})")
    print(f"%gpucheck --refresh                  median {statistics.median(forced):.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    options = parser.parse_args()
    confirm_what_is_measured()
    compare_cli(options.runs)
    compare_magic(options.runs * 3)


if __name__ == "__main__":
    main()
