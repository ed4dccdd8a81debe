"""`%dataprobe`'s cost and accuracy on loaders where its shortcuts do not apply, against the exhaustive sweep.

`bench_dataprobe.py` times loaders whose every batch takes the same time, with long epochs: there the sweep leaves the
deeper prefetch queue and the restarted workers out. Here, at ratio 5 (a batch takes five steps to load in one
process), the same engine and the same exhaustive sweep (17 settings x 3 windows of 0.4 s) run on:

- **uneven**: `UnevenBatches` (tests/fixtures/sleepy_data.py), about one batch in four taking four times the others'
  time: the deeper queue is measured;
- **short epoch**: 48 samples, 6 batches an epoch: every trial crosses an epoch's end, so the restarted workers are
  measured.

Per loader: ours' wall time and trials against the sweep's, and the exhaustive rate of ours' recommendation over the
sweep's best (goals: at most a third of the time, within 10% of the best).

    .venv/bin/python bench/bench_dataprobe_shapes.py [--window 0.4]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_dataprobe import exhaustive, exhaustive_settings
from torch.utils.data import DataLoader

from jupyter_gpu.dataprobe.runner import DataProbeRequest, run_dataprobe
from tests.fixtures.sleepy_data import SleepyDataset, UnevenBatches, sleepy_step

STEP_SECONDS = 0.02
BATCH = 8
RATIO = 5
WORKERS = (0, 1, 2, 4, 8)
ITEM_SECONDS = RATIO * STEP_SECONDS / BATCH

LOADERS: dict[str, Callable[[], DataLoader]] = {
    "uneven": lambda: DataLoader(UnevenBatches(4096, ITEM_SECONDS, batch_size=BATCH), batch_size=BATCH),
    "short epoch": lambda: DataLoader(SleepyDataset(6 * BATCH, ITEM_SECONDS), batch_size=BATCH),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=0.4)
    args = parser.parse_args()
    print("| loader | ours: trials (what) | wall s: ours / exhaustive | ours / exhaustive | ours: setting | "
          "exhaustive best | ours / best |")
    print("|---|---|---:|---:|---|---|---:|")
    for name, make in LOADERS.items():
        started = time.perf_counter()
        result = run_dataprobe(make(), sleepy_step(STEP_SECONDS),
                               DataProbeRequest(workers=WORKERS, seconds=60, window_seconds=args.window))
        ours = time.perf_counter() - started
        sweep = exhaustive(make(), STEP_SECONDS, exhaustive_settings(WORKERS), args.window)
        best_settings, best = sweep.best()
        chosen = result.recommended_settings or result.current
        rate = sweep.rate(chosen) or 0.0
        what = ", ".join(f"{trial.stage} {trial.settings.label()}" for trial in result.trials)
        print(f"| {name} | {len(result.trials)} ({what}) | {ours:.1f} / {sweep.seconds:.1f} | "
              f"{ours / sweep.seconds:.2f} | {chosen.label()} | {best_settings.label()} {best:.0f} | "
              f"{rate / best:.2f} |")


if __name__ == "__main__":
    main()
