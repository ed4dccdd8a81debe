"""What a user reads after `%dataprobe`: the verdict line, the three measurements, the recommendation, the table of
settings, throughput against num_workers (a PNG, or text bars without matplotlib), in text and escaped HTML.

Results are plain data, so they are built here by hand, with the recommendation worked out by `decide` as the
runner does.
"""

from __future__ import annotations

import base64
import json
import re
import sys
from dataclasses import replace
from typing import Any

import pytest

from jupyter_gpu.dataprobe import decide
from jupyter_gpu.dataprobe.render import (
    headline,
    measurement_rows,
    plot_png,
    recommendation_rows,
    render_html,
    render_text,
    text_bars,
    trial_rows,
)
from jupyter_gpu.dataprobe.result import (
    CURRENT,
    LOADER,
    LOOP,
    RECHECK,
    SWEEP,
    VERIFY,
    DataProbeResult,
    StepAlone,
    Trial,
    WorkerMemory,
)
from jupyter_gpu.dataprobe.settings import LoaderSettings
from jupyter_gpu.models import Finding

HOSTILE = "<img src=x onerror=alert(1)>"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MIB = 1 << 20
MAIN = LoaderSettings(0)
ONE = LoaderSettings(1, 2, persistent_workers=True)
TWO = LoaderSettings(2, 2, persistent_workers=True)
TWO_DEEP = LoaderSettings(2, 4, persistent_workers=True)


def trial(settings: LoaderSettings, rates: list[float], stage: str = SWEEP, mode: str = LOOP, *,
          wait: float | None = None, first: float | None = 0.2, error: str | None = None,
          memory: WorkerMemory | None = None, gpu_idle: float | None = None) -> Trial:
    return Trial(settings=settings, stage=stage, mode=mode, rates=rates, first_batch_seconds=first,
                 wait_fraction=wait, gpu_idle_fraction=gpu_idle, worker_memory=memory, batches=10 * len(rates),
                 seconds=1.5, error=error)


def loop_result(*, together_rates: list[float], wait: float, sweep: list[Trial], verified: float | None,
                step_rates: list[float] = (3100.0, 3200.0, 3300.0), **changes: Any) -> DataProbeResult:
    """A probe of `train_loader` (0 workers) with `train_step`, its trials in the order the runner runs them."""
    loader_alone = trial(MAIN, [1900.0, 1968.0, 2000.0], CURRENT, LOADER, first=0.31)
    together = trial(MAIN, list(together_rates), CURRENT, LOOP, wait=wait, first=0.01)
    step = StepAlone(rates=list(step_rates), step_seconds=0.01, device="cpu")
    trials = [loader_alone, together, *sweep]
    chosen = decide.recommend([t for t in trials if t.mode == LOOP])
    settings, predicted, best = chosen if chosen else (None, None, None)
    verify = [trial(settings, [verified], VERIFY, wait=0.1)] if settings is not None and verified is not None else []
    fields: dict[str, Any] = dict(
        loader_name="train_loader", step_name="train_step", device="cpu", current=MAIN, batch_size=32,
        dataset_len=4096, cpus=2, loader_alone=loader_alone, step_alone=step, together=together,
        verdict=decide.verdict(wait), wait_fraction=wait,
        perfect_loader_speedup=decide.perfect_loader_speedup(step.samples_per_second, together.samples_per_second),
        trials=trials + verify, recommended=settings.kwargs() if settings else None, recommended_settings=settings,
        predicted=predicted, verified=verified, best=best,
        speedup=verified / together.samples_per_second if verified and settings else None,
        restored=["RNG", "model", "opt"], budget_seconds=60.0, seconds=41.5)
    fields.update(changes)
    return DataProbeResult(**fields)


def input_bound(**changes: Any) -> DataProbeResult:
    """The reference's 2-core figures: 0 workers waits 62% of the loop, 1 worker is the best setting."""
    sweep = [
        trial(MAIN, [600.0, 619.0, 640.0], wait=0.62),
        trial(ONE, [1650.0, 1732.0, 1760.0], wait=0.2, memory=WorkerMemory(1, 210 * MIB, 12 * MIB)),
        trial(TWO, [1236.0, 516.0, 1366.0], wait=0.4, memory=WorkerMemory(2, 220 * MIB, 14 * MIB)),
        trial(ONE, [1700.0, 1745.0], RECHECK, wait=0.2),
        trial(TWO, [1300.0, 1350.0], RECHECK, wait=0.4),
    ]
    return loop_result(together_rates=[600.0, 619.0, 640.0], wait=0.62, sweep=sweep, verified=1795.0, **changes)


def compute_bound(**changes: Any) -> DataProbeResult:
    """The runner does not sweep when the step is the bottleneck: nothing is recommended."""
    fields: dict[str, Any] = dict(recommended=None, recommended_settings=None, predicted=None, best=None,
                                  notes=["The step is the bottleneck, not the loader: the sweep was not run."])
    fields.update(changes)
    return loop_result(together_rates=[900.0, 910.0, 920.0], wait=0.03, sweep=[], verified=None,
                       step_rates=[940.0, 950.0], **fields)


def balanced(**changes: Any) -> DataProbeResult:
    sweep = [trial(MAIN, [1000.0, 1010.0], wait=0.18), trial(ONE, [1150.0, 1170.0], wait=0.08)]
    return loop_result(together_rates=[1000.0, 1010.0], wait=0.18, sweep=sweep, verified=1160.0,
                       step_rates=[1240.0, 1250.0], **changes)


def loader_only(**changes: Any) -> DataProbeResult:
    """No --step: the sweep times the loader alone."""
    loader_alone = trial(MAIN, [1900.0, 1968.0, 2000.0], CURRENT, LOADER, first=0.31)
    sweep = [trial(MAIN, [1950.0, 1990.0], SWEEP, LOADER), trial(ONE, [2600.0, 2700.0], SWEEP, LOADER,
                                                                 memory=WorkerMemory(1, 200 * MIB, None))]
    settings, predicted, best = decide.recommend(sweep)
    fields: dict[str, Any] = dict(
        loader_name="train_loader", step_name=None, device="cpu", current=MAIN, batch_size=32, dataset_len=4096,
        cpus=2, loader_alone=loader_alone, step_alone=None, together=None, verdict=None, wait_fraction=None,
        perfect_loader_speedup=None, trials=[loader_alone, *sweep, trial(settings, [2680.0], VERIFY, LOADER)],
        recommended=settings.kwargs(), recommended_settings=settings, predicted=predicted, verified=2680.0,
        best=best, speedup=2680.0 / 1968.0, restored=["RNG"], seconds=20.0)
    fields.update(changes)
    return DataProbeResult(**fields)


def row(rows: list[tuple[str, str]], heading: str) -> str:
    found = [text for name, text in rows if name == heading]
    assert len(found) == 1, f"{heading!r} in {rows}"
    return found[0]


# -- the headline -------------------------------------------------------------------------------------------------

def test_input_bound_headline_gives_the_wait_and_what_a_perfect_loader_buys() -> None:
    result = input_bound()
    assert result.verdict == "input-bound"
    assert headline(result) == ("dataprobe train_loader: input-bound: the step waited for data 62% of the loop; "
                                "a perfect loader would make it 5.2x faster")
    assert render_text(result).splitlines()[0] == headline(result)


def test_compute_bound_headline_points_at_gputime_not_the_loader() -> None:
    result = compute_bound()
    assert headline(result) == ("dataprobe train_loader: compute-bound: the loader keeps up (the step waited 3% of "
                                "the loop); the step is the bottleneck: time it with %%gputime and speed it up with "
                                "%speedprobe rather than tuning the loader")
    rows = recommendation_rows(result)
    assert [heading for heading, _ in rows] == ["loader tuning"]  # no "none" recommendation to puzzle over
    assert "will not help" in rows[0][1] and "%%gputime" in rows[0][1] and "%speedprobe" in rows[0][1]
    assert "DataLoader(" not in render_text(result)
    assert text_bars(result) == [] and plot_png(result) is None  # no sweep: one worker count is no curve


def test_balanced_headline_says_both_matter() -> None:
    text = headline(balanced())
    assert text.startswith("dataprobe train_loader: balanced: the step waited for data 18% of the loop")
    assert "both matter" in text and "%%gputime" in text and "%speedprobe" in text and "1.2x faster" in text


def test_without_a_step_the_headline_gives_the_loaders_rate_and_how_to_compare_it_with_the_step() -> None:
    result = loader_only()
    assert headline(result) == ("dataprobe train_loader: the loader alone delivers 1,968 samples/s median (min–max "
                                "1,900–2,000, 3 windows); add --step train_step to compare it with the training step")
    headings = [name for name, _ in measurement_rows(result)]
    assert headings == ["your loader", "loader alone"]
    assert "wait" not in render_text(result).split("settings measured:")[1].splitlines()[1]


def test_an_interrupted_probe_says_so_and_shows_what_was_measured() -> None:
    result = replace(input_bound(), interrupted=True, seconds=12.3)
    text = render_text(result)
    assert headline(result).startswith("dataprobe train_loader: interrupted after 12.3 s; what follows is what was "
                                       "measured before it stopped")
    assert "so far input-bound" in headline(result)
    assert "note: Interrupted: these are the trials finished so far." in text
    assert "1,732" in text  # the finished sweep trials are still shown


def test_interrupted_before_any_recommendation() -> None:
    result = replace(input_bound(), interrupted=True, recommended=None, recommended_settings=None, predicted=None,
                     verified=None, best=None, speedup=None)
    assert row(recommendation_rows(result), "recommended") == "none: interrupted before the sweep finished"
    assert "DataLoader(" not in render_text(result)


def test_a_step_that_failed_in_the_loop_gives_no_verdict_and_says_why() -> None:
    together = trial(MAIN, [], CURRENT, LOOP, error="ValueError: shapes (32, 3) and (4,) do not match")
    result = replace(loader_only(), step_name="train_step", together=together, trials=[together])
    assert headline(result) == ("dataprobe train_loader: no verdict: the loop with train_step was not measured: "
                                "ValueError: shapes (32, 3) and (4,) do not match")


# -- the measurements ---------------------------------------------------------------------------------------------

def test_measurement_rows_give_each_rate_with_its_spread_and_first_batch_apart() -> None:
    rows = measurement_rows(input_bound())
    assert row(rows, "your loader") == ("0 workers (main process); batch size 32; 4,096 samples; 2 CPUs usable; "
                                        "step train_step on cpu")
    assert row(rows, "loader alone") == ("1,968 samples/s median (min–max 1,900–2,000, 3 windows); first batch "
                                         "310 ms (one batch in the kernel's process)")  # 0 workers: no start-up
    assert row(rows, "step alone") == ("3,200 samples/s median (min–max 3,100–3,300, 3 windows); 10.0 ms per step on "
                                       "cpu (one cached batch: the ceiling a perfect loader would reach)")
    assert row(rows, "together") == ("619 samples/s median (min–max 600–640, 3 windows); waiting for data 62% of "
                                     "the loop")


def test_gpu_idle_between_steps_shown_only_when_measured() -> None:
    result = input_bound()
    on_cuda = replace(result, device="cuda:0", together=replace(result.together, gpu_idle_fraction=0.4))
    assert "GPU idle 40% between steps" in row(measurement_rows(on_cuda), "together")
    assert "GPU idle" not in row(measurement_rows(result), "together")


# -- the recommendation -------------------------------------------------------------------------------------------

def test_recommendation_states_prediction_check_speedup_closeness_and_code() -> None:
    result = input_bound()
    assert result.recommended_settings == ONE and result.predicted == 1732.0 and result.best == 1732.0
    rows = recommendation_rows(result)
    assert row(rows, "recommended") == "1 worker · prefetch 2 · persistent"
    assert row(rows, "predicted").startswith("1,732 samples/s")
    assert row(rows, "verified") == "1,795 samples/s when checked by running it: confirms the prediction (+4%)"
    assert row(rows, "speed-up") == "2.90x over your current setting (1,795 against 619 samples/s)"
    assert row(rows, "of the best") == "100% of the best the sweep saw (1,732 samples/s)"
    assert row(rows, "code") == ("train_loader = DataLoader(..., num_workers=1, persistent_workers=True)  "
                                 "# keep your other arguments")


def test_a_check_far_from_the_prediction_is_not_called_a_confirmation() -> None:
    result = replace(input_bound(), verified=1200.0)
    verified = row(recommendation_rows(result), "verified")
    assert "does not confirm the prediction (-31%, more than 15% off)" in verified
    assert "confirms the prediction (" not in verified


def test_a_cheaper_setting_within_five_percent_says_which_was_best() -> None:
    # Two deep-prefetch workers measure 3% faster than one worker, which keeps up with room to spare (waits 4%):
    # the one worker is recommended.
    sweep = [trial(MAIN, [600.0, 619.0], wait=0.62), trial(ONE, [1700.0, 1720.0], wait=0.04),
             trial(TWO_DEEP, [1760.0, 1780.0], wait=0.02)]
    result = loop_result(together_rates=[600.0, 619.0], wait=0.62, sweep=sweep, verified=1715.0)
    assert result.recommended_settings == ONE
    assert row(recommendation_rows(result), "of the best") == (
        "97% of the best the sweep saw (1,770 samples/s, 2 workers · prefetch 4 · persistent; the cheaper setting "
        "was chosen, it is within 5%)")


def test_when_the_current_setting_is_best_there_is_nothing_to_paste() -> None:
    sweep = [trial(MAIN, [1000.0, 1010.0], wait=0.35), trial(ONE, [700.0, 720.0], wait=0.5)]
    result = loop_result(together_rates=[1000.0, 1010.0], wait=0.35, sweep=sweep, verified=None)
    assert result.recommended_settings == result.current and result.code() is None
    rows = recommendation_rows(result)
    assert row(rows, "recommended") == ("0 workers (main process): your current setting is already the best "
                                        "measured (1,005 samples/s)")
    assert "code" not in dict(rows)
    assert "DataLoader(" not in render_text(result) and "DataLoader(" not in render_html(result)


# -- the table and the bars ---------------------------------------------------------------------------------------

def test_one_table_row_per_trial_with_the_current_and_recommended_marked() -> None:
    result = input_bound()
    rows = trial_rows(result)
    assert len(rows) == len(result.trials)
    by_stage = {(r[0], r[1]): r for r in rows}
    assert by_stage[("0 workers (main process)", "current, loader alone")][8] == "◀ current"
    sweep_one = by_stage[("1 worker · prefetch 2 · persistent", "sweep")]
    assert sweep_one[2:8] == ("1,732", "1,650–1,760", "3", "200 ms", "210.0 MiB RSS, 12.0 MiB private", "20%")
    assert sweep_one[8] == "◀ recommended"
    assert by_stage[("2 workers · prefetch 2 · persistent", "sweep")][6] == ("220.0 MiB RSS, 14.0 MiB private "
                                                                            "(largest of 2)")
    assert [r[1] for r in rows].count("verify") == 1


def test_a_failed_trial_shows_its_error_in_text_and_escaped_in_html() -> None:
    error = "RuntimeError: DataLoader worker (pid(s) 4242) exited unexpectedly <Toy>"
    result = input_bound()
    result = replace(result, trials=[*result.trials, trial(TWO_DEEP, [], SWEEP, error=error)])
    failed = trial_rows(result)[-1]
    assert failed[2] == "" and failed[8] == f"failed: {error}"
    assert f"failed: {error}" in render_text(result)
    html = render_html(result)
    assert "exited unexpectedly &lt;Toy&gt;" in html and "<Toy>" not in html
    assert result.recommended_settings == ONE  # a failed setting is never the recommendation


def test_text_bars_show_the_best_setting_per_worker_count_over_the_pooled_windows() -> None:
    bars = text_bars(input_bound())
    assert len(bars) == 4  # the legend, then workers 0, 1, 2
    zero, one, two = bars[1:]
    # The sweep timed the loop: the loader-alone rate of the current setting (1,968/s) is not a loop rate.
    assert "619 (600–640)" in zero and "1,968" not in zero
    assert "1,732 (1,650–1,760)" in one and "◀ recommended" in one
    assert "1,300 (516–1,366)" in two  # sweep and recheck windows pooled: the 2.4x spread stays visible
    cells = {line: re.search(r"[█▒┃]+", line).group() for line in (zero, one, two)}
    assert len(cells[one]) > len(cells[two]) > len(cells[zero])
    assert cells[two].count("█") < len(cells[two]) // 2  # the slowest window (516/s) is far below the fastest


def test_the_text_rendering_carries_every_section() -> None:
    pitfall = Finding("DATASET_COPY_ON_READ", "info", "The dataset holds a list of 1,200,000 items.",
                      evidence={"containers": "dataset.samples (list, 1200000 items)"}, fix=["np.array(samples)"])
    result = replace(input_bound(), pitfalls=[pitfall], skipped=["pin_memory: the step runs on the CPU"],
                     notes=["2 CPUs: the sweep stops at 2 workers"])
    text = render_text(result)
    for expected in ("recommendation:", "settings measured:", "samples/s by num_workers",
                     "pitfalls (checked before any worker started):",
                     "1. [info] DATASET_COPY_ON_READ: The dataset holds a list of 1,200,000 items.",
                     "not tried: pin_memory: the step runs on the CPU", "note: 2 CPUs: the sweep stops at 2 workers",
                     "restored  RNG, model, opt exactly as before", "41.5 s of a 60 s budget"):
        assert expected in text, expected


def test_str_of_the_result_contains_the_line_to_paste_and_repr_is_one_line() -> None:
    result = input_bound()
    assert "train_loader = DataLoader(..., num_workers=1, persistent_workers=True)" in str(result)
    assert repr(result) == ("<DataProbeResult: dataprobe train_loader: input-bound; recommended 1 worker · "
                            "prefetch 2 · persistent, 2.90x>")


def test_to_dict_is_json_and_keeps_what_the_user_reads() -> None:
    result = input_bound(pitfalls=[Finding("SHM_TOO_SMALL", "warn", "64 MiB of /dev/shm")])
    data = json.loads(json.dumps(result.to_dict()))
    assert data["verdict"] == "input-bound" and data["wait_fraction"] == 0.62
    assert data["recommended"] == {"num_workers": 1, "pin_memory": False, "prefetch_factor": 2,
                                   "persistent_workers": True}
    assert data["code"] == result.code() and len(data["trials"]) == len(result.trials)
    assert data["trials"][2]["samples_per_second"] == 619.0 and data["pitfalls"][0]["code"] == "SHM_TOO_SMALL"


# -- the plot -----------------------------------------------------------------------------------------------------

def test_plot_png_is_a_png_and_the_html_embeds_it() -> None:
    result = input_bound()
    png = plot_png(result)
    assert png is not None and png.startswith(PNG_SIGNATURE) and len(png) > 5000
    html = render_html(result)
    embedded = re.search(r'src="data:image/png;base64,([^"]+)"', html)
    assert embedded is not None and base64.b64decode(embedded.group(1)).startswith(PNG_SIGNATURE)


def test_without_matplotlib_the_html_shows_the_text_bars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # what `import` sees when it is not installed
    result = input_bound()
    assert plot_png(result) is None
    html = render_html(result)
    assert "data:image/png" not in html
    assert "samples/s by num_workers" in html and "1,732 (1,650–1,760)" in html


def test_nothing_measured_gives_no_plot_and_no_bars() -> None:
    result = replace(loader_only(), trials=[], loader_alone=None, recommended=None, recommended_settings=None,
                     predicted=None, verified=None, best=None, speedup=None, interrupted=True)
    assert plot_png(result) is None and text_bars(result) == []
    assert "settings measured:" not in render_text(result)
    assert "interrupted" in render_html(result)


# -- escaping -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("build", [input_bound, compute_bound, balanced, loader_only])
def test_every_user_string_is_escaped_in_html(build: Any) -> None:
    hostile_trial = trial(TWO_DEEP, [], SWEEP, error=HOSTILE)
    result = build()
    result = replace(result, loader_name=HOSTILE, step_name=HOSTILE if result.step_name else None,
                     trials=[*result.trials, hostile_trial], notes=[HOSTILE], skipped=[HOSTILE],
                     restored=[HOSTILE], pitfalls=[Finding("X", "warn", HOSTILE, evidence={"e": HOSTILE},
                                                           fix=[HOSTILE])])
    html = render_html(result)
    assert "<img src=x" not in html and "onerror=alert(1)>" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert HOSTILE in render_text(result)  # text is not HTML: the name reads as typed


def test_an_unchecked_or_failed_check_is_said_so() -> None:
    result = replace(input_bound(), verified=None, speedup=None)
    result = replace(result, trials=[t for t in result.trials if t.stage != VERIFY])
    assert row(recommendation_rows(result), "verified") == "not checked (no time left in the budget)"
    assert "speed-up" not in dict(recommendation_rows(result))
    failed = replace(result, trials=[*result.trials, trial(ONE, [], VERIFY, error="MemoryError")])
    assert row(recommendation_rows(failed), "verified") == "the check failed: MemoryError"
