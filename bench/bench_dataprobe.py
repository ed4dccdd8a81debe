"""Does `%dataprobe` recommend a DataLoader setting as fast as an exhaustive sweep's best, in a third of its time,
and how does Lightning's `num_workers` heuristic compare?

Fixtures with known costs (`tests/fixtures/sleepy_data.py`): the user's loader is
`loader_for_ratio(ratio, step_seconds=S, batch_size=B)` with `num_workers=0`, a dataset whose every item sleeps
`ratio * S / B` seconds (so one batch takes `ratio` times the step to load in one process), and the step is
`sleepy_step(S)`, a sleep of S seconds standing in for an asynchronous GPU step the host waits on. Sleeps hold no
CPU, so N workers load N items at once even on this 2-core machine: more workers than cores still help a sleep
loader, which is why the worker counts are W = 0, 1, 2, 4, 8 (`--workers`), what our default picks on an 8-CPU
machine, and not the 0, 1, 2 it would pick here. Ratios 0.2, 0.5, 1, 2 and 5 (`--ratios`); S = 20 ms, B = 8.

For every ratio, in one process, one after the other (the exhaustive sweep first on the 1st, 3rd and 5th ratio,
ours first on the others, so a drift of the machine's load does not always favour one side):

1. **ours**: `run_dataprobe(loader, step, DataProbeRequest(workers=W, seconds=60, window_seconds=w))`, the engine
   of `%dataprobe loader --step step`, with every timed window `w` seconds long (`--window`, default 0.4 s) so that
   both sides measure at the same precision; the 60 s budget (`--seconds`) is then only the limit past which the
   probe would leave phases out. Reported: its verdict and wait share, the setting it recommends (the user's own,
   `num_workers=0`, kept when it stops at "compute-bound"), that setting's samples/s as it verified it, and its
   wall time, the loader alone, the step alone and the loop at the user's setting included (they give the verdict).
2. **exhaustive sweep** of the same settings: 0 workers, and every W > 0 with `prefetch_factor` 2 and 4 and
   `persistent_workers` True and False (17 settings for the default W), each timed in the training loop by the
   same engine, `TrialRunner(...).trial(settings, stage="sweep", mode="loop", windows=3, window_seconds=w)`, on a
   fresh DataLoader built from the user's. Its best setting is the highest median of 3 windows; its wall time is
   the whole sweep's.
3. **Lightning's heuristic**: `lightning.fabric.utilities.data.suggested_max_num_workers(1)` (one process per
   machine), i.e. `max(1, cpus - 1)` with the CPUs of `os.sched_getaffinity`; where lightning is not installed,
   that documented formula computed here (the output says which). A user follows it by setting that
   `num_workers`, DataLoader's defaults otherwise (`prefetch_factor=2`, `persistent_workers=False`); its
   samples/s is read from the exhaustive table (measured like it if it is not a setting of the sweep).

Per ratio the table gives: the exhaustive best (setting, samples/s) and how many of the swept settings are within
10% of it (many: any reasonable choice passes; few: the choice matters); ours (setting, its samples/s in the
exhaustive table and as ours verified it, and exhaustive(ours) / exhaustive best, goal >= 0.90); Lightning's setting
with its exhaustive samples/s and ratio to the best; the wall time of ours and of the exhaustive sweep and their
ratio (goal <= 1/3); the verdict ours gave, next to the one its thresholds give for the nominal ratio, the loop at
`num_workers=0` waiting `ratio / (1 + ratio)` of the time (0.2 is "balanced", 0.5 and above "input-bound"), and
the measured ratio (step alone / loader alone in samples/s, as ours measured them: the sleeps' own overhead makes
it a little above nominal). Every rate is a median of windows; the exhaustive best is the largest of 17 noisy
medians, so it is biased upward by the noise, and the ratios to it are a little pessimistic.

Timings on a shared 2-core machine vary from run to run: run it more than once and report each run.

    .bench-venv/bin/python bench/bench_dataprobe.py [--ratios 0.2,0.5,1,2,5] [--workers 0,1,2,4,8]
        [--window 0.4] [--seconds 60] [--step-seconds 0.02] [--batch-size 8] [--markdown]

(`.bench-venv`: see bench/bench_batchprobe.py; `.venv/bin/python` works too, with Lightning's formula computed here.)
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the fixtures live in tests/, beside the package

from tables import print_report

from jupyter_gpu.dataprobe import decide
from jupyter_gpu.dataprobe.loaders import recipe_of, usable_cpus
from jupyter_gpu.dataprobe.measure import StepTarget, TrialRunner
from jupyter_gpu.dataprobe.result import LOOP, SWEEP, DataProbeResult, Trial
from jupyter_gpu.dataprobe.runner import DataProbeRequest, run_dataprobe
from jupyter_gpu.dataprobe.settings import DEFAULT_PREFETCH, LoaderSettings
from jupyter_gpu.rendering.units import format_rate
from tests.fixtures.sleepy_data import loader_for_ratio, sleepy_step

EXHAUSTIVE_WINDOWS = 3
PREFETCH_FACTORS = (2, 4)
ACCURACY_GOAL = 0.90  # ours within 10% of the best (issue 16)
TIME_GOAL = 1 / 3  # ours at most a third of the exhaustive sweep's wall time


# -- the three contestants --------------------------------------------------------------------------------------


def exhaustive_settings(workers: tuple[int, ...]) -> list[LoaderSettings]:
    """0 workers, then every count x prefetch_factor x persistent_workers (pin_memory stays off: no GPU step)."""
    found = [LoaderSettings(0)] if 0 in workers else []
    for count in sorted(set(workers) - {0}):
        for prefetch in PREFETCH_FACTORS:
            for persistent in (True, False):
                found.append(LoaderSettings(count, prefetch, persistent))
    return found


def lightning_workers() -> tuple[int, str]:
    """Lightning's suggested num_workers for one process per machine, and where the number came from."""
    try:
        from lightning.fabric.utilities.data import suggested_max_num_workers
    except ImportError:
        # Lightning's documented formula: all usable CPUs but one, left for the main process.
        cpus = len(os.sched_getaffinity(0))
        return max(1, cpus - 1), f"max(1, cpus // 1 - 1) with cpus = {cpus} (computed here: lightning not importable)"
    import lightning

    return suggested_max_num_workers(1), f"lightning {lightning.__version__} suggested_max_num_workers(1)"


def lightning_settings(count: int) -> LoaderSettings:
    """What a user who follows the warning writes: that num_workers, DataLoader's defaults for the rest."""
    return LoaderSettings(count, DEFAULT_PREFETCH, persistent_workers=False)


@dataclass
class Sweep:
    trials: list[Trial]
    seconds: float
    # Settings outside the grid (Lightning's count on a bigger machine), measured the same way afterwards: looked up
    # by `rate`, never counted in the sweep's best, size or time.
    extra: list[Trial] = field(default_factory=list)

    def rate(self, settings: LoaderSettings) -> float | None:
        return next((trial.samples_per_second for trial in [*self.trials, *self.extra]
                     if trial.settings == settings), None)

    def best(self) -> tuple[LoaderSettings, float]:
        ranked = decide.ranking(self.trials)  # highest median first, ties to the cheaper setting
        return ranked[0]

    def within(self, share: float) -> int:
        _, best = self.best()
        return sum(1 for trial in self.trials if (trial.samples_per_second or 0) >= share * best)


def runner_for(loader: object, step_seconds: float) -> TrialRunner:
    """The engine's own trial runner on the user's loader and step (nothing to restore: the step has no state)."""
    target = StepTarget(sleepy_step(step_seconds), torch.device("cpu"), cuda=False)
    return TrialRunner(torch, recipe_of(loader), target, restore=lambda: None)


def exhaustive(loader: object, step_seconds: float, settings: list[LoaderSettings], window: float) -> Sweep:
    runner = runner_for(loader, step_seconds)
    started = time.perf_counter()
    trials = [runner.trial(each, stage=SWEEP, mode=LOOP, windows=EXHAUSTIVE_WINDOWS, window_seconds=window)
              for each in settings]
    seconds = time.perf_counter() - started
    failed = [f"{trial.settings.label()}: {trial.error}" for trial in trials if trial.error]
    if failed:
        raise SystemExit("the exhaustive sweep could not measure " + "; ".join(failed))
    return Sweep(trials, seconds)


def ours(loader: object, step_seconds: float, workers: tuple[int, ...], window: float,
         budget: float) -> tuple[DataProbeResult, float]:
    request = DataProbeRequest(workers=workers, seconds=budget, window_seconds=window)
    started = time.perf_counter()
    result = run_dataprobe(loader, sleepy_step(step_seconds), request, loader_name="loader", step_name="step")
    return result, time.perf_counter() - started


# -- one ratio --------------------------------------------------------------------------------------------------


@dataclass
class Row:
    ratio: float
    sweep: Sweep
    result: DataProbeResult
    ours_seconds: float
    chosen: LoaderSettings          # ours' recommendation, or the user's setting when it did not sweep
    chosen_rate: float              # chosen's samples/s in the exhaustive table
    lightning: LoaderSettings
    lightning_rate: float

    @property
    def best(self) -> tuple[LoaderSettings, float]:
        return self.sweep.best()

    @property
    def expected_verdict(self) -> str:
        return decide.verdict(self.ratio / (1 + self.ratio))

    @property
    def measured_ratio(self) -> float | None:
        step, alone = self.result.step_alone, self.result.loader_alone
        if step is None or alone is None or not step.samples_per_second or not alone.samples_per_second:
            return None
        return step.samples_per_second / alone.samples_per_second


def run_ratio(index: int, ratio: float, args: argparse.Namespace, settings: list[LoaderSettings],
              lightning: LoaderSettings) -> Row:
    def loader() -> object:  # a fresh user loader per contestant: neither sees what the other iterated
        return loader_for_ratio(ratio, step_seconds=args.step_seconds, batch_size=args.batch_size)

    if index % 2 == 0:
        sweep = exhaustive(loader(), args.step_seconds, settings, args.window)
        result, seconds = ours(loader(), args.step_seconds, args.workers, args.window, args.seconds)
    else:
        result, seconds = ours(loader(), args.step_seconds, args.workers, args.window, args.seconds)
        sweep = exhaustive(loader(), args.step_seconds, settings, args.window)
    chosen = result.recommended_settings or result.current  # compute-bound: the user keeps the loader as it is
    extra = [each for each in (chosen, lightning) if sweep.rate(each) is None]
    if extra:  # a setting outside the sweep (Lightning's count on a bigger machine): measured the same way
        sweep.extra = exhaustive(loader(), args.step_seconds, extra, args.window).trials
    return Row(ratio, sweep, result, seconds, chosen, sweep.rate(chosen) or 0.0, lightning,
               sweep.rate(lightning) or 0.0)


# -- output -----------------------------------------------------------------------------------------------------


def short(settings: LoaderSettings) -> str:
    """`4w p2 pers`, `0w`: short enough for a table cell."""
    if settings.num_workers == 0:
        return "0w"
    return f"{settings.num_workers}w p{settings.prefetch_factor}" + (" pers" if settings.persistent_workers else "")


def _goal(value: float, goal: float, above: bool) -> str:
    met = value >= goal if above else value <= goal
    return "" if met else " ✗"


def table_rows(rows: list[Row]) -> list[tuple[str, ...]]:
    out = []
    for row in rows:
        best_settings, best = row.best
        ours_share = row.chosen_rate / best
        time_share = row.ours_seconds / row.sweep.seconds
        result = row.result
        verified = format_rate(result.verified) if result.verified is not None else "—"
        kept = " (kept)" if row.chosen == result.current else ""  # the user's own setting: nothing to change
        measured = f"{row.measured_ratio:.2f}" if row.measured_ratio is not None else "—"
        wait = f"{result.wait_fraction:.0%}" if result.wait_fraction is not None else "—"
        out.append((
            f"{row.ratio:g} ({measured})",
            f"{result.verdict} {wait}" + ("" if result.verdict == row.expected_verdict
                                          else f" (thresholds: {row.expected_verdict})"),
            f"{short(best_settings)} {format_rate(best)}",
            f"{row.sweep.within(ACCURACY_GOAL)}/{len(row.sweep.trials)}",
            f"{short(row.chosen)}{kept} {format_rate(row.chosen_rate)} / {verified}",
            f"{ours_share:.2f}{_goal(ours_share, ACCURACY_GOAL, True)}",
            f"{short(row.lightning)} {format_rate(row.lightning_rate)}",
            f"{row.lightning_rate / best:.2f}",
            f"{row.ours_seconds:.1f} / {row.sweep.seconds:.1f}",
            f"{time_share:.2f}{_goal(time_share, TIME_GOAL, False)}",
            f"{len(result.trials)} / {len(row.sweep.trials)}",
        ))
    return out


HEADINGS = ("ratio (measured)", "ours: verdict, wait", "exhaustive best, samples/s", "within 10%",
            "ours: setting, exhaustive / verified samples/s", "ours / best", "Lightning: setting, samples/s",
            "Lightning / best", "wall s: ours / exhaustive", "ours / exhaustive", "trials: ours / exhaustive")


def print_details(rows: list[Row]) -> None:
    print("\nEvery setting, samples/s (exhaustive median of 3 windows | ours: trials in the order run, stage, median):")
    for row in rows:
        rates = ", ".join(f"{short(trial.settings)} {format_rate(trial.samples_per_second)}"
                          for trial in row.sweep.trials)
        rates += "".join(f"; outside the grid: {short(trial.settings)} {format_rate(trial.samples_per_second)}"
                         for trial in row.sweep.extra)
        print(f"- ratio {row.ratio:g}: exhaustive {rates}")
        steps = row.result.step_alone
        mine = ", ".join(f"{short(trial.settings)} {trial.stage}/{trial.mode} {format_rate(trial.samples_per_second)}"
                         for trial in row.result.trials)
        ceiling = f"step alone {format_rate(steps.samples_per_second)}; " if steps is not None else ""
        print(f"    ours: {ceiling}{mine}")
        print(f"    ours' wall time: {phases(row)}")
        if steps is not None and steps.samples_per_second:
            loop = max(trial.samples_per_second or 0 for trial in row.result.trials if trial.mode == LOOP)
            print(f"    ours' fastest loop / step alone: {loop / steps.samples_per_second:.2f} (the sweep stops "
                  f"early at {decide.CEILING_SHARE:.2f})")
        for line in (*row.result.skipped, *row.result.notes):
            print(f"    ours, {line}")


def phases(row: Row) -> str:
    """Where ours' wall time went: the trials of each stage, and the rest (the step alone, set-up, pitfalls)."""
    spent: dict[str, tuple[int, float]] = {}
    for trial in row.result.trials:
        count, seconds = spent.get(trial.stage, (0, 0.0))
        spent[trial.stage] = (count + 1, seconds + trial.seconds)
    parts = [f"{stage} {count} trial{'s' if count > 1 else ''} {seconds:.1f} s"
             for stage, (count, seconds) in spent.items()]
    rest = row.ours_seconds - sum(seconds for _, seconds in spent.values())
    return ", ".join(parts) + f", step alone and the rest {rest:.1f} s (of {row.ours_seconds:.1f} s)"


def summary(rows: list[Row]) -> None:
    shares = [row.chosen_rate / row.best[1] for row in rows]
    times = [row.ours_seconds / row.sweep.seconds for row in rows]
    light = [row.lightning_rate / row.best[1] for row in rows]
    verdicts = sum(1 for row in rows if row.result.verdict == row.expected_verdict)
    print(f"\nours / best: {min(shares):.2f}–{max(shares):.2f} (goal >= {ACCURACY_GOAL:.2f} on "
          f"{sum(share >= ACCURACY_GOAL for share in shares)} of {len(rows)}); Lightning / best: "
          f"{min(light):.2f}–{max(light):.2f}; wall ours / exhaustive: {min(times):.2f}–{max(times):.2f} "
          f"(goal <= {TIME_GOAL:.2f} on {sum(share <= TIME_GOAL for share in times)} of {len(rows)}); verdict as "
          f"the thresholds give for the nominal ratio on {verdicts} of {len(rows)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ratios", default="0.2,0.5,1,2,5", help="load/compute ratios of the fixtures")
    parser.add_argument("--workers", default="0,1,2,4,8", help="num_workers both sweeps try")
    parser.add_argument("--window", type=float, default=0.4, help="seconds of every timed window, both sides")
    parser.add_argument("--seconds", type=float, default=60.0, help="ours: the time budget (%%dataprobe --seconds)")
    parser.add_argument("--step-seconds", type=float, default=0.02, help="the sleep standing in for the step")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--markdown", action="store_true", help="the table as Markdown, to paste in docs")
    args = parser.parse_args()
    ratios = [float(value) for value in args.ratios.split(",") if value.strip()]
    args.workers = tuple(int(value) for value in args.workers.split(",") if value.strip())
    count, source = lightning_workers()
    lightning = lightning_settings(count)
    settings = exhaustive_settings(args.workers)
    print(f"torch {torch.__version__}, Python {platform.python_version()}, {usable_cpus()} usable CPUs "
          f"(os.sched_getaffinity); Lightning's num_workers: {count}, from {source}")
    print(f"fixtures: sleep step {args.step_seconds * 1000:g} ms, batch {args.batch_size}, user's loader "
          f"num_workers=0; W = {', '.join(map(str, args.workers))}; windows {args.window:g} s; ours' budget "
          f"{args.seconds:g} s; exhaustive: {len(settings)} settings x {EXHAUSTIVE_WINDOWS} windows\n", flush=True)
    begun = time.perf_counter()
    rows = []
    for index, ratio in enumerate(ratios):
        row = run_ratio(index, ratio, args, settings, lightning)
        rows.append(row)
        print(f"done: ratio {ratio:g} (ours {row.ours_seconds:.1f} s, exhaustive {row.sweep.seconds:.1f} s)",
              flush=True)
    print_report(HEADINGS, table_rows(rows), args.markdown, [lambda: summary(rows), lambda: print_details(rows)], begun)


if __name__ == "__main__":
    main()
