"""What does the distributed profile cost each rank, and how long until its verdict?

DDP over gloo, two ranks on this machine's CPU, the tutorial-shaped script tests/fixtures/ddp_scripts/mlp_ddp.py at
two model widths. For each, in alternating order, three times:

- **bare**: `torchrun --nproc-per-node 2 mlp_ddp.py --step-times FILE`, rank 0 timing each optimizer step itself
  (perf_counter at each step); the median of the steps after the first `--warmup` is the unprofiled step;
- **profiled**: `jupyter-gpu profile --steps N --warmup K --json FILE -- torchrun --nproc-per-node 2 mlp_ddp.py`,
  the median of every rank's profiled steps, and the command's wall time (the time to a verdict), beside the bare
  run's wall time for the same number of steps (the script stops after warm-up + N + the counted step there too).

Reported: profiled step / bare step (goal: at most 1.10), and the seconds to a verdict against the bare run's.

    .venv/bin/python bench/bench_ddp_profile.py [--steps 20] [--warmup 5] [--rounds 3] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tables import print_table

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "fixtures" / "ddp_scripts" / "mlp_ddp.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]


def bare(width: int, steps: int, warmup: int, folder: Path) -> tuple[float, float]:
    times = folder / f"bare-{width}.txt"
    samples = (warmup + steps + 1) * 2 * 32  # the same optimizer steps as the profile runs, one epoch
    began = time.perf_counter()
    subprocess.run([*TORCHRUN, str(SCRIPT), "--width", str(width), "--epochs", "1", "--samples", str(samples),
                    "--batch-size", "32", "--step-times", str(times)], check=True, capture_output=True,
                   env=_env())
    wall = time.perf_counter() - began
    steps_seen = [float(t) for t in times.read_text().split()]
    return statistics.median(steps_seen[warmup:]), wall


def profiled(width: int, steps: int, warmup: int, folder: Path) -> tuple[float, float]:
    saved = folder / f"profile-{width}.json"
    samples = (warmup + steps + 1) * 2 * 32 * 4  # enough for the profile's steps; it stops the loop itself
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "jupyter_gpu", "profile", "--steps", str(steps), "--warmup", str(warmup),
                    "--json", str(saved), "--", *TORCHRUN, str(SCRIPT), "--width", str(width), "--epochs", "1",
                    "--samples", str(samples), "--batch-size", "32"], check=True, capture_output=True, env=_env())
    wall = time.perf_counter() - began
    data = json.loads(saved.read_text())
    return statistics.median(r["step"] for r in data["ranks"]), wall


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "OMP_NUM_THREADS": "1"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--markdown", action="store_true")
    options = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for width in (256, 1024):
            bare_steps, bare_walls, profiled_steps, profiled_walls = [], [], [], []
            for round_ in range(options.rounds):
                order = (bare, profiled) if round_ % 2 == 0 else (profiled, bare)
                for run in order:
                    step, wall = run(width, options.steps, options.warmup, Path(folder))
                    (bare_steps if run is bare else profiled_steps).append(step)
                    (bare_walls if run is bare else profiled_walls).append(wall)
            b, p = statistics.median(bare_steps), statistics.median(profiled_steps)
            rows.append((f"MLP 64-{width}-{width}-10, batch 32/rank", f"{b * 1e3:.2f} ms", f"{p * 1e3:.2f} ms",
                         f"{p / b:.2f}", f"{statistics.median(bare_walls):.1f} s",
                         f"{statistics.median(profiled_walls):.1f} s"))
    print_table(("loop (2 ranks, gloo, CPU)", "bare step", "profiled step", "ratio (goal <= 1.10)",
                 "bare run", "profile to its verdict"), rows, markdown=options.markdown)


if __name__ == "__main__":
    main()
