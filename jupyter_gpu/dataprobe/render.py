"""Text and HTML renderings of a `DataProbeResult`, and its plot. Every value in the HTML is escaped.

The text bars (samples/s against num_workers) are the plot when matplotlib is absent, and always part of the text.
"""

from __future__ import annotations

import base64
import io
from html import escape

from jupyter_gpu.dataprobe import decide
from jupyter_gpu.dataprobe.result import LOOP, SWEEP, VERIFY, DataProbeResult, StepAlone, Trial
from jupyter_gpu.dataprobe.settings import LoaderSettings
from jupyter_gpu.rendering.kit import (
    COLOUR,
    code_block_html,
    findings_html,
    findings_text,
    rows_html,
    rows_text,
    table_text,
)
from jupyter_gpu.rendering.units import format_bytes, format_duration, format_rate, format_seconds

BAR_WIDTH = 30
TABLE_HEADINGS = ("setting", "stage", "samples/s", "min–max", "windows", "first batch", "worker memory", "wait", "")
# The example the headline gives for a step: the name most notebooks use, so the line reads as something to type.
STEP_EXAMPLE = "train_step"
# Columns the text table right-aligns: numbers line up on their last digit.
NUMERIC_HEADINGS = ("samples/s", "windows", "first batch")
VERDICT_COLOUR = {"input-bound": COLOUR["warn"], "balanced": COLOUR["info"], "compute-bound": COLOUR["ok"]}
# The fix for an IterableDataset that every worker yields whole: each worker keeps its own share of the items.
SPLIT_FIX = ("info = torch.utils.data.get_worker_info(); "
             "items = items if info is None else items[info.id::info.num_workers]")


# -- the headline -------------------------------------------------------------------------------------------------

def headline(result: DataProbeResult) -> str:
    """One line: what limits the loop, or what the loader alone delivers when no step was given."""
    start = f"dataprobe {result.loader_name}: "
    if result.interrupted:
        text = (f"{start}interrupted after {format_seconds(result.seconds)}; what follows is what was measured "
                "before it stopped")
        if result.verdict is not None and result.wait_fraction is not None:
            text += f" (so far {result.verdict}: the step waited for data {result.wait_fraction:.0%} of the loop)"
        return text
    if result.step_name is None:
        return start + _loader_alone_headline(result)
    if result.verdict is None or result.wait_fraction is None:
        together = result.together
        why = f": {together.error}" if together is not None and together.error else ""
        return f"{start}no verdict: the loop with {result.step_name} was not measured{why}"
    waited = result.wait_fraction
    speedup = result.perfect_loader_speedup
    if result.verdict == "input-bound":
        text = f"{start}input-bound: the step waited for data {waited:.0%} of the loop"
        if speedup is not None:
            text += f"; a perfect loader would make it {speedup:.1f}x faster"
        return text
    if result.verdict == "compute-bound":
        return (f"{start}compute-bound: the loader keeps up (the step waited {waited:.0%} of the loop); the step is "
                "the bottleneck: time it with %%gputime and speed it up with %speedprobe rather than tuning "
                "the loader")
    gain = f" (a perfect loader would make it {speedup:.1f}x faster)" if speedup is not None else ""
    return (f"{start}balanced: the step waited for data {waited:.0%} of the loop{gain}; both matter: a faster "
            "loader and a faster step (time it with %%gputime, speed it up with %speedprobe) would each "
            "help")


def _loader_alone_headline(result: DataProbeResult) -> str:
    trial = result.loader_alone
    hint = f"; add --step {STEP_EXAMPLE} to compare it with the training step"
    if trial is None or trial.samples_per_second is None:
        why = f" ({trial.error})" if trial is not None and trial.error else ""
        return f"the loader alone was not measured{why}{hint}"
    return f"the loader alone delivers {_rates_text(trial.samples_per_second, trial.rates)}{hint}"


# -- (heading, text) rows -----------------------------------------------------------------------------------------

def measurement_rows(result: DataProbeResult) -> list[tuple[str, str]]:
    """The user's loader, then the three measurements: the loader alone, the step alone, both together."""
    rows = [("your loader", _your_loader_line(result))]
    if result.loader_alone is not None:
        rows.append(("loader alone", _loader_alone_line(result.loader_alone)))
    if result.step_alone is not None:
        rows.append(("step alone", _step_alone_line(result.step_alone)))
    if result.together is not None:
        rows.append(("together", _together_line(result.together)))
    return rows


def recommendation_rows(result: DataProbeResult) -> list[tuple[str, str]]:
    """The setting to use, its predicted and verified throughput, what it buys, and the line to paste."""
    rows: list[tuple[str, str]] = []
    duplicated = duplication_text(result)
    if duplicated is not None:
        rows.append(("duplicated data", duplicated))
    chosen = result.recommended_settings
    if result.verdict == "compute-bound":
        rows.append(("loader tuning", "will not help: the loader already keeps up with the step, so the step is "
                                      "the bottleneck; time it with %%gputime and speed it up with "
                                      "%speedprobe"))
        if chosen is not None and chosen == result.current:
            rows.append(("recommended", f"keep your setting ({chosen.label()})"))
            return rows
    if chosen is None:
        if result.verdict != "compute-bound":
            why = "interrupted before the sweep finished" if result.interrupted else "no setting was measured"
            rows.append(("recommended", f"none: {why}"))
        return rows
    if chosen == result.current:
        rows.append(("recommended", f"{chosen.label()}: your current setting is already the best measured"
                                    + (f" ({format_rate(result.predicted)} samples/s)"
                                       if result.predicted is not None else "")))
        if result.best is not None and result.predicted is not None:
            rows.append(("of the best", _of_best_line(result)))
        return rows
    rows.append(("recommended", chosen.label()))
    if result.predicted is not None:
        rows.append(("predicted", f"{format_rate(result.predicted)} samples/s (the sweep's median over every window "
                                  "of this setting)"))
    rows.append(("verified", _verified_line(result)))
    if result.speedup is not None:
        rows.append(("speed-up", _speedup_line(result)))
    if result.best is not None and result.predicted is not None:
        rows.append(("of the best", _of_best_line(result)))
    code = result.code()
    if code is not None:
        rows.append(("code", code))
    return rows


def duplication_text(result: DataProbeResult) -> str | None:
    """What the settings whose workers each yielded the whole IterableDataset did, and the fix; None if none did."""
    copies: dict[int, float] = {}
    for trial in result.trials:
        if trial.duplicates and trial.repeats is not None:
            copies[trial.settings.num_workers] = max(trial.repeats, copies.get(trial.settings.num_workers, 0.0))
    if not copies:
        return None
    seen = ", ".join(f"{count} workers each batch came {times:.1f} times" for count, times in sorted(copies.items()))
    return (f"this IterableDataset yields every item once per worker (with {seen}, against num_workers=0): its "
            "__iter__ does not split the items between workers. Those settings are not recommended and their "
            "samples/s, duplicated data, are no gain. Fix: in __iter__, keep this worker's share of the items: "
            f"{SPLIT_FIX}")


def footer_rows(result: DataProbeResult) -> list[tuple[str, str]]:
    """What was put back, and the time the probe took against its budget."""
    # Checked, not meant: the restored line lists what compared equal after the probe; what moved is a warning.
    rows = [("warning", line) for line in result.not_restored]
    if result.restored:
        rows.append(("restored", f"{', '.join(result.restored)} exactly as before"))
    rows.append(("time", f"{format_seconds(result.seconds)} of a {format_duration(result.budget_seconds)} budget"
                         + (" (interrupted)" if result.interrupted else "")))
    return rows


def _your_loader_line(result: DataProbeResult) -> str:
    parts = [result.current.label()]
    if result.batch_size is not None:
        parts.append(f"batch size {result.batch_size}")
    if result.dataset_len is not None:
        parts.append(f"{result.dataset_len:,} samples")
    parts.append(f"{result.cpus} CPU{'s' if result.cpus != 1 else ''} usable")
    if result.step_name is not None:
        parts.append(f"step {result.step_name} on {result.device}")
    return "; ".join(parts)


def _loader_alone_line(trial: Trial) -> str:
    text = _trial_rate_line(trial)
    if trial.first_batch_seconds is not None:
        why = "worker start-up, dataset pickling" if trial.settings.num_workers else "one batch in the kernel's process"
        text += f"; first batch {format_seconds(trial.first_batch_seconds)} ({why})"
    return text


def _step_alone_line(step: StepAlone) -> str:
    if step.samples_per_second is None:
        return "not measured"
    return (f"{_rates_text(step.samples_per_second, step.rates)}; {format_seconds(step.step_seconds)} per step on "
            f"{step.device} (one cached batch: the ceiling a perfect loader would reach)")


def _together_line(trial: Trial) -> str:
    text = _trial_rate_line(trial)
    if trial.wait_fraction is not None:
        text += f"; waiting for data {trial.wait_fraction:.0%} of the loop"
    if trial.gpu_idle_fraction is not None:
        text += f"; GPU idle {trial.gpu_idle_fraction:.0%} between steps"
    return text


def _trial_rate_line(trial: Trial) -> str:
    if trial.samples_per_second is None:
        return f"failed: {trial.error}" if trial.error else "no window timed"
    text = _rates_text(trial.samples_per_second, trial.rates)
    return text + (f"; then failed: {trial.error}" if trial.error else "")


def _rates_text(median: float, rates: list[float]) -> str:
    """`1,234 samples/s median (min–max 1,100–1,400, 5 windows)`: the spread is part of the number."""
    if len(rates) < 2:
        return f"{format_rate(median)} samples/s (1 window)"
    return (f"{format_rate(median)} samples/s median (min–max {format_rate(min(rates))}–{format_rate(max(rates))}, "
            f"{len(rates)} windows)")


def _verified_line(result: DataProbeResult) -> str:
    if result.verified is None:
        failed = next((t for t in reversed(result.trials) if t.stage == VERIFY and t.error), None)
        if failed is not None:
            return f"the check failed: {failed.error}"
        return "not checked (" + ("interrupted" if result.interrupted else "no time left in the budget") + ")"
    text = f"{format_rate(result.verified)} samples/s when checked by running it"
    if result.predicted is None:
        return text
    change = result.verified / result.predicted - 1
    if decide.prediction_holds(result.predicted, result.verified):
        return text + f": confirms the prediction ({change:+.0%})"
    return (text + f": does not confirm the prediction ({change:+.0%}, more than "
            f"{decide.PREDICTION_TOLERANCE:.0%} off); the machine's load changed between runs or the spread is large")


def _speedup_line(result: DataProbeResult) -> str:
    text = f"{result.speedup:.2f}x over your current setting"
    current = _current_trial(result)
    if current is not None and current.samples_per_second is not None and result.verified is not None:
        text += f" ({format_rate(result.verified)} against {format_rate(current.samples_per_second)} samples/s)"
    return text


def _of_best_line(result: DataProbeResult) -> str:
    assert result.best is not None and result.predicted is not None
    text = f"{result.predicted / result.best:.0%} of the best the sweep saw ({format_rate(result.best)} samples/s"
    best = _best_settings(result)
    if best is not None and best != result.recommended_settings:
        checked = next((trial for trial in result.trials if trial.stage == VERIFY and trial.settings == best
                        and trial.samples_per_second is not None), None)
        if checked is not None:  # the check fell behind, and the runner-up was measured again
            text += (f", {best.label()}, which measured {format_rate(checked.samples_per_second)} when checked: the "
                     "setting measured better when checked was chosen")
        else:
            text += f", {best.label()}; the cheaper setting was chosen, it is within {decide.CHEAPER_WITHIN:.0%}"
    return text + ")"


def _current_trial(result: DataProbeResult) -> Trial | None:
    """The user's own setting timed the way the speed-up compares: the loop with a step, else the loader alone."""
    return result.together if result.mode == LOOP else result.loader_alone


def _best_settings(result: DataProbeResult) -> LoaderSettings | None:
    ranked = decide.ranking(_sweep_trials(result))
    if ranked and result.best is not None and abs(ranked[0][1] - result.best) <= 1e-9 * max(result.best, 1.0):
        return ranked[0][0]
    return None


# -- the table of trials ------------------------------------------------------------------------------------------

def trial_rows(result: DataProbeResult) -> list[tuple[str, ...]]:
    """One row per trial in the order run, shaped like TABLE_HEADINGS; the current and recommended marked."""
    both_modes = len({trial.mode for trial in result.trials}) > 1
    rows = []
    for trial in result.trials:
        stage = trial.stage + (", loader alone" if both_modes and trial.mode != LOOP else "")
        spread = trial.spread
        marks = [mark for mark, settings in (("current", result.current), ("recommended", result.recommended_settings))
                 if trial.settings == settings]
        note = ("◀ " + ", ".join(marks)) if marks else ""
        if trial.duplicates and trial.repeats is not None:
            note = f"{note}  duplicated: each batch {trial.repeats:.1f}x".strip()
        if trial.error:
            note = f"{note}  failed: {trial.error}".strip()
        rows.append((
            trial.settings.label(), stage, format_rate(trial.samples_per_second) if trial.rates else "",
            f"{format_rate(spread[0])}–{format_rate(spread[1])}" if spread and len(trial.rates) > 1 else "",
            str(len(trial.rates)) if trial.rates else "",
            format_seconds(trial.first_batch_seconds) if trial.first_batch_seconds is not None else "",
            _worker_memory_text(trial),
            f"{trial.wait_fraction:.0%}" if trial.wait_fraction is not None else "",
            note,
        ))
    return rows


def _worker_memory_text(trial: Trial) -> str:
    memory = trial.worker_memory
    if memory is None:
        return ""
    text = f"{format_bytes(memory.rss_bytes)} RSS"
    if memory.private_bytes is not None:
        text += f", {format_bytes(memory.private_bytes)} private"
    return text + (f" (largest of {memory.workers})" if memory.workers > 1 else "")


def _table(result: DataProbeResult) -> list[tuple[str, ...]]:
    """Headings and rows, without the columns no trial filled (no wait without a step, no memory without workers)."""
    rows = trial_rows(result)
    keep = [i for i in range(len(TABLE_HEADINGS)) if i < 2 or any(row[i] for row in rows)]
    return [tuple(row[i] for i in keep) for row in [TABLE_HEADINGS, *rows]]


# -- throughput against num_workers -------------------------------------------------------------------------------

def _sweep_trials(result: DataProbeResult) -> list[Trial]:
    """What the recommendation was chosen from: trials timed the way the sweep timed them (a loader-alone rate
    never mixes with a loop rate), before the check of the recommendation (shown apart, as "verified")."""
    mode = next((trial.mode for trial in result.trials if trial.stage == SWEEP), result.mode)
    return [trial for trial in decide.of_mode(result.trials, mode) if trial.stage != VERIFY]


def _best_per_worker_count(result: DataProbeResult) -> list[tuple[int, LoaderSettings, float, list[float]]]:
    """(num_workers, its best setting, that setting's median, its windows) for each worker count measured."""
    best: dict[int, tuple[LoaderSettings, float, list[float]]] = {}
    for settings, windows in decide.pooled(_sweep_trials(result)).items():
        rate = decide.median(windows)
        held = best.get(settings.num_workers)
        # Ties go to the cheaper setting, as in decide.ranking.
        if held is None or rate > held[1] or (rate == held[1] and settings.cost < held[0].cost):
            best[settings.num_workers] = (settings, rate, windows)
    return [(count, *best[count]) for count in sorted(best)]


def text_bars(result: DataProbeResult) -> list[str]:
    """Samples/s against num_workers as bars: █ up to the slowest window, ▒ up to the fastest, ┃ at the median."""
    points = _best_per_worker_count(result)
    if len(points) < 2:  # one worker count is no curve (a compute-bound probe does not sweep)
        return []
    full = max(max(windows) for *_, windows in points)
    width = max(len(str(count)) for count, *_ in points)
    lines = ["samples/s by num_workers (the best setting at each count; █ to the slowest window, ▒ to the fastest, "
             "┃ the median):"]
    for count, settings, rate, windows in points:
        marks = [mark for mark, chosen in (("current", result.current), ("recommended", result.recommended_settings))
                 if settings == chosen]
        for mark, chosen in (("current", result.current), ("recommended", result.recommended_settings)):
            if chosen is not None and chosen != settings and chosen.num_workers == count:
                marks.append(f"{mark}: {chosen.label()}")  # another variant at this count
        spread = (f" ({format_rate(min(windows))}–{format_rate(max(windows))})" if len(windows) > 1 else "")
        lines.append(f"  {count:>{width}}  {_range_bar(min(windows), rate, max(windows), full)}  "
                     f"{format_rate(rate):>9}{spread}  {settings.label()}"
                     + (f"  ◀ {', '.join(marks)}" if marks else ""))
    return lines


def _range_bar(low: float, middle: float, high: float, full: float) -> str:
    if full <= 0:
        return " " * BAR_WIDTH
    cells = [" "] * BAR_WIDTH
    high_cells = max(1, round(BAR_WIDTH * high / full))
    low_cells = min(high_cells, round(BAR_WIDTH * low / full))
    for index in range(high_cells):
        cells[index] = "█" if index < low_cells else "▒"
    cells[min(high_cells, max(1, round(BAR_WIDTH * middle / full))) - 1] = "┃"
    return "".join(cells)


def plot_png(result: DataProbeResult) -> bytes | None:
    """Samples/s against num_workers as a PNG; None without matplotlib or with fewer than two worker counts.

    One line: the best setting at each worker count, its median with the min–max as error bars. Every other
    setting is a grey dot, so the variants (prefetch, persistent, pinned) show without a legend entry each.
    """
    try:
        from matplotlib.figure import Figure  # no pyplot: no global figure state, no GUI backend
    except ImportError:
        return None
    points = _best_per_worker_count(result)
    if len(points) < 2:
        return None
    counts = [count for count, *_ in points]
    position = {count: index for index, count in enumerate(counts)}  # evenly spaced: 0, 1, 2, 4, 8, 16
    figure = Figure(figsize=(6.4, 3.2), dpi=100, layout="constrained")
    axis = figure.add_subplot()
    medians = [rate for _, _, rate, _ in points]
    axis.errorbar(range(len(points)), medians,
                  yerr=[[rate - min(windows) for *_, rate, windows in points],
                        [max(windows) - rate for *_, rate, windows in points]],
                  fmt="o-", color="#1565c0", capsize=3, label="best setting per count (median, min–max)")
    bests = {settings for _, settings, _, _ in points}
    others = [(settings, decide.median(windows)) for settings, windows in decide.pooled(_sweep_trials(result)).items()
              if settings not in bests]
    if others:
        axis.plot([position[s.num_workers] for s, _ in others], [rate for _, rate in others], ".", color="#999",
                  label="other settings")
    rates = {settings: decide.median(windows) for settings, windows in decide.pooled(_sweep_trials(result)).items()}
    for settings, label, marker, colour in ((result.current, "current", "s", COLOUR["warn"]),
                                            (result.recommended_settings, "recommended", "*", COLOUR["ok"])):
        if settings is not None and settings in rates:
            axis.plot([position[settings.num_workers]], [rates[settings]], marker, markersize=12, color=colour,
                      markerfacecolor="none" if marker == "s" else colour, label=f"{label}: {settings.label()}")
    axis.set_xticks(range(len(counts)), [str(count) for count in counts])
    axis.set_xlabel("num_workers")
    axis.set_ylabel("samples/s")
    axis.set_ylim(bottom=0)
    axis.legend(loc="best", fontsize=8)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


# -- the renderings -----------------------------------------------------------------------------------------------

def render_text(result: DataProbeResult) -> str:
    lines = [headline(result)]
    lines.extend(rows_text(measurement_rows(result)))
    recommendation = recommendation_rows(result)
    if recommendation:
        lines.append("recommendation:")
        lines.extend(rows_text(recommendation))
    if result.trials:
        lines.append("settings measured:")
        lines.extend(table_text(_table(result), NUMERIC_HEADINGS))
    lines.extend(text_bars(result))
    if result.pitfalls:
        lines.append("pitfalls (checked before any worker started):")
        lines.extend(findings_text(result.pitfalls))
    lines.extend(f"  not tried: {skipped}" for skipped in result.skipped)
    lines.extend(f"  note: {note}" for note in _notes(result))
    lines.extend(rows_text(footer_rows(result)))
    return "\n".join(lines)


def render_html(result: DataProbeResult) -> str:
    colour = COLOUR["warn"] if result.interrupted else VERDICT_COLOUR.get(result.verdict or "", COLOUR["info"])
    cell = 'style="text-align:left;padding-right:1em"'
    parts = [
        '<div class="jupyter-gpu-dataprobe" style="font-family:var(--jp-ui-font-family,sans-serif);line-height:1.4">',
        f'<div style="font-weight:600;color:{colour}">{escape(headline(result))}</div>',
        rows_html(measurement_rows(result)),
    ]
    recommendation = recommendation_rows(result)
    shown = [(heading, text) for heading, text in recommendation if heading != "code"]
    if shown:
        parts.append('<div style="font-weight:600;margin-top:.4em">Recommendation</div>')
        parts.append(rows_html(shown))
    code = result.code()
    if code is not None and any(heading == "code" for heading, _ in recommendation):
        parts.append(code_block_html(code))
    if result.trials:
        table = _table(result)
        parts.append('<table style="margin:.4em 0;font-size:.92em;font-variant-numeric:tabular-nums">')
        parts.append("<tr>" + "".join(f"<th {cell}>{escape(heading)}</th>" for heading in table[0]) + "</tr>")
        parts.extend("<tr>" + "".join(f"<td {cell}>{escape(value)}</td>" for value in row) + "</tr>"
                     for row in table[1:])
        parts.append("</table>")
    parts.append(_plot_html(result))
    if result.pitfalls:
        parts.append('<div style="font-weight:600;margin-top:.4em">Pitfalls (checked before any worker started)</div>')
        parts.append(findings_html(result.pitfalls))
    parts.extend(f'<div style="opacity:.8">not tried: {escape(skipped)}</div>' for skipped in result.skipped)
    parts.extend(f'<div style="opacity:.8">note: {escape(note)}</div>' for note in _notes(result))
    parts.append(rows_html(footer_rows(result)))
    parts.append("</div>")
    return "".join(parts)


def _plot_html(result: DataProbeResult) -> str:
    png = plot_png(result)
    if png is not None:
        encoded = base64.b64encode(png).decode("ascii")
        return (f'<img src="data:image/png;base64,{encoded}" alt="samples/s against num_workers" '
                'style="max-width:100%">')
    bars = text_bars(result)
    if not bars:
        return ""
    return f'<pre style="margin:.2em 0;font-size:.9em">{escape(chr(10).join(bars))}</pre>'


def _notes(result: DataProbeResult) -> list[str]:
    notes = list(result.notes)
    if result.interrupted:
        notes.insert(0, "Interrupted: these are the trials finished so far.")
    return notes

