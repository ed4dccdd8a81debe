"""Text and HTML renderings of a `BatchProbeResult`, and its plot. Every value in the HTML is escaped.

The text rendering carries the per-size table with bars, so it is the plot when matplotlib is absent.
"""

from __future__ import annotations

import io
from html import escape
from typing import Any

from jupyter_gpu.batchprobe.result import RECOMMEND, VERIFY, BatchProbeResult, Trial
from jupyter_gpu.batchprobe.search import top_of_range
from jupyter_gpu.rendering.kit import COLOUR, rows_html, rows_text
from jupyter_gpu.rendering.units import format_bytes, format_rate, format_seconds

BAR_WIDTH = 12


def headline(result: BatchProbeResult) -> str:
    if result.limited_by == "leak" and result.leak is not None:
        leak = result.leak
        return (f"batchprobe: the step leaks memory: {format_bytes(leak['bytes_per_call'])} more stays alive "
                f"after every call at batch {leak['batch_size']}, so no batch size holds for long; "
                "fix what it keeps between calls, then probe again")
    if result.limited_by == "ignores batch_size":
        # The rule judges the top of the range (search.top_of_range): below it the step may still have grown.
        fitted = {t.batch_size: t.allocated_peak_bytes or t.peak_bytes or 0 for t in result.trials if t.fitted}
        top = top_of_range(list(fitted.items())) or sorted(fitted.items())
        return (f"batchprobe: the step apparently ignores batch_size: peak memory stayed flat (less than a byte "
                f"per added sample) from batch {top[0][0]} to {top[-1][0]} (the --max cap), so that cap is not a "
                "capacity; check "
                "that it really uses batch_size samples (a dataset smaller than the batch, a fixed input)")
    if result.max_batch_size == 0:
        if not result.trials:
            return "batchprobe: no trial ran"
        start = min(t.batch_size for t in result.trials)
        refused = next((t for t in result.trials if t.batch_size == start and not t.fitted), None)
        needs = (f"needs more than {format_bytes(refused.needed_bytes)}"
                 if refused is not None and refused.needed_bytes else "does not fit")
        return (f"batchprobe: nothing fits at --start {start}: batch {start} {needs}, the budget is "
                f"{format_bytes(result.budget_bytes)} with {format_bytes(result.memory_before)} in use before "
                "the probe; smaller sizes are not tried (lower --start to try them)")
    if result.limited_by == "time limit" and result.time_limit is not None:
        return _time_limit_headline(result, result.time_limit)
    text = f"batchprobe: max batch size {result.max_batch_size}"
    if result.limited_by == "--max":
        text += " (the --max cap, not memory)"
    elif result.limited_by == "size limit":
        text += f" ({result.max_batch_size + 1} hits a size limit, not memory)"
    if result.recommended:
        text += f" · recommended {result.recommended} ({result.margin:.0%} of the budget kept free)"
    elif result.interrupted:
        text += " · no recommendation (interrupted before it was tried)"
    else:
        text += " · no recommendation (the recommended size did not fit when tried)"
    if result.knee is not None:
        text += f" · throughput levels off at {result.knee}"
    return text


def _time_limit_headline(result: BatchProbeResult, limit: dict[str, Any]) -> str:
    """Stopped by --max-seconds: what ran, where the memory limit lies, and how to go on."""
    failed = limit["fails_at"]
    where = (f"the memory limit lies between {result.max_batch_size} and {failed}" if failed is not None
             else f"the memory limit is above {result.max_batch_size}")
    text = (f"batchprobe: batch {result.max_batch_size} runs; stopped at the {format_seconds(limit['seconds'])} "
            f"time limit before finding the most: {where}, and the next trial (batch {limit['next_size']}) would "
            f"take about {format_seconds(limit['predicted_seconds'])}")
    if result.recommended:
        text += f" · recommended {result.recommended} (the largest that ran with {result.margin:.0%} kept free)"
    return text + (" · to search on, raise --max-seconds, or start there with --start "
                   f"{result.max_batch_size}")


def summary_rows(result: BatchProbeResult) -> list[tuple[str, str]]:
    rows = [("budget", f"{format_bytes(result.budget_bytes)} on {result.device} ({result.budget_source}; "
                       f"counted as {result.accounting})")]
    if result.memory_model is not None:
        intercept, per_sample = result.memory_model
        rows.append(("memory model", f"peak ≈ {format_bytes(intercept)} + {format_bytes(per_sample)} per sample"))
    reruns = sum(1 for t in result.trials if t.purpose == VERIFY)
    recommendation = sum(1 for t in result.trials if t.purpose == RECOMMEND)
    # Stopped by --max-seconds, the trials did not find the limit: the line says so, as the headline does.
    found = "before the time limit" if result.limited_by == "time limit" else "to find the limit"
    rows.append(("search", f"{result.search_trials} trials {found}"
                           + (f" + {reruns} re-run of the answer after a failure" if reruns else "")
                           + (" + 1 at the recommended size" if recommendation else "")
                           + f", {result.steps} step{'s' if result.steps != 1 else ''} each"
                           + (f", autocast {result.amp}" if result.amp else "")
                           + f", {format_seconds(result.seconds)} in all"))
    rows.append(("memory", _memory_line(result)))
    if result.baseline:
        rows.append(("held before", _baseline_line(result)))
    if result.leak is not None:
        rows.append(("leak", _leak_line(result.leak)))
    elif result.leftovers:
        rows.append(("between calls", _leftover_line(result)))
    # Checked, not meant: the restored line lists what compared equal after the probe; what moved is a warning.
    rows.extend(("warning", line) for line in result.not_restored)
    rows.append(("restored", f"{', '.join(result.restored)} exactly as before "
                             f"(host copies held during the probe: {format_bytes(result.snapshot_bytes)})"))
    return rows


def trial_rows(result: BatchProbeResult) -> list[tuple[str, ...]]:
    """One row per batch size (its last trial), ascending: the table, and the text plot."""
    latest: dict[int, Trial] = {}
    for trial in result.trials:
        if trial.fitted or trial.batch_size not in latest:  # a size that ever fitted shows its fitted run
            latest[trial.batch_size] = trial
    best_rate = max((t.samples_per_second or 0.0 for t in latest.values()), default=0.0)
    rows = []
    for size in sorted(latest):
        trial = latest[size]
        marks = ", ".join(mark for mark, chosen in (("max", size == result.max_batch_size),
                                                  ("recommended", size == result.recommended),
                                                  ("knee", size == result.knee)) if chosen)
        if trial.fitted:
            rate = trial.samples_per_second or 0.0
            rows.append((str(size), "✓", format_bytes(trial.peak_bytes), _bar(trial.peak_bytes, result.budget_bytes),
                         format_seconds(trial.step_seconds), format_rate(rate), _bar(rate, best_rate), marks))
        else:
            rows.append((str(size), "✗", trial.failure or "failed", "", "", "", "", marks))
    return rows


TABLE_HEADINGS = ("batch", "fits", "peak memory", "of budget", "step", "samples/s", "", "")


def render_text(result: BatchProbeResult) -> str:
    lines = [headline(result)]
    lines.extend(rows_text(summary_rows(result)))
    table = [TABLE_HEADINGS, *trial_rows(result)]
    widths = [max(len(row[i]) for row in table if row[1] != "✗" or i < 2) for i in range(len(TABLE_HEADINGS))]
    for row in table:
        if row[1] == "✗":
            lines.append(f"  {row[0]:>{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]}"
                         + (f"  ◀ {row[7]}" if row[7] else ""))
            continue
        cells = [f"{row[0]:>{widths[0]}}", f"{row[1]:<{widths[1]}}", f"{row[2]:>{widths[2]}}",
                 f"{row[3]:<{widths[3]}}", f"{row[4]:>{widths[4]}}", f"{row[5]:>{widths[5]}}",
                 f"{row[6]:<{widths[6]}}"]
        lines.append(("  " + "  ".join(cells) + (f"  ◀ {row[7]}" if row[7] else "")).rstrip())
    lines.extend(f"  note: {note}" for note in _notes(result))
    return "\n".join(lines)


def render_html(result: BatchProbeResult) -> str:
    colour = COLOUR["fail" if result.max_batch_size == 0 or result.interrupted else "ok"]
    if result.limited_by in ("leak", "ignores batch_size"):
        colour = COLOUR["warn"]
    cell = 'style="text-align:left;padding-right:1em"'
    parts = [
        '<div class="jupyter-gpu-batchprobe" style="font-family:var(--jp-ui-font-family,sans-serif);line-height:1.4">',
        f'<div style="font-weight:600;color:{colour}">{escape(headline(result))}</div>',
        rows_html(summary_rows(result)),
        '<table style="margin:.2em 0;font-size:.92em;font-variant-numeric:tabular-nums">',
    ]
    parts.append("<tr>" + "".join(f"<th {cell}>{escape(h)}</th>" for h in TABLE_HEADINGS) + "</tr>")
    for row in trial_rows(result):
        parts.append("<tr>" + "".join(f"<td {cell}>{escape(value)}</td>" for value in row) + "</tr>")
    parts.append("</table>")
    parts.extend(f'<div style="opacity:.8">note: {escape(note)}</div>' for note in _notes(result))
    parts.append("</div>")
    return "".join(parts)


def plot_png(result: BatchProbeResult) -> bytes | None:
    """Peak memory and samples/s against batch size as a PNG; None when matplotlib is not installed."""
    try:
        from matplotlib.figure import Figure  # no pyplot: no global figure state, no GUI backend
    except ImportError:
        return None
    fitted = sorted({t.batch_size: t for t in result.trials if t.fitted}.values(), key=lambda t: t.batch_size)
    failed = sorted({t.batch_size for t in result.trials if not t.fitted})
    figure = Figure(figsize=(6.4, 3.2), dpi=100, layout="constrained")
    memory_axis = figure.add_subplot()
    sizes = [t.batch_size for t in fitted]
    memory_axis.plot(sizes, [(t.peak_bytes or 0) / 2**20 for t in fitted], "o-", color="#1565c0", label="peak memory")
    memory_axis.axhline(result.budget_bytes / 2**20, color="#c62828", linestyle="--", label="budget")
    if failed:
        memory_axis.plot(failed, [result.budget_bytes / 2**20] * len(failed), "x", color="#c62828",
                         label="did not fit")
    memory_axis.set_xlabel("batch size")
    memory_axis.set_ylabel("peak memory (MiB)")
    memory_axis.set_xscale("log", base=2)
    rate_axis = memory_axis.twinx()
    rate_axis.plot(sizes, [t.samples_per_second or 0 for t in fitted], "s-", color="#2e7d32", label="samples/s")
    rate_axis.set_ylabel("samples/s")
    for size, label in ((result.recommended, "recommended"), (result.max_batch_size, "max")):
        if size:
            memory_axis.axvline(size, color="#555", linestyle=":", linewidth=1)
            memory_axis.annotate(label, (size, 0), xycoords=("data", "axes fraction"), rotation=90, fontsize=8,
                                 va="bottom", ha="right")
    handles = memory_axis.get_legend_handles_labels()[0] + rate_axis.get_legend_handles_labels()[0]
    memory_axis.legend(handles=handles, loc="upper left", fontsize=8)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def _memory_line(result: BatchProbeResult) -> str:
    text = f"{format_bytes(result.memory_before)} in use before, {format_bytes(result.memory_after)} after"
    leftover = result.memory_after - result.memory_before
    if leftover > 0 and (result.leftovers or result.leak):
        return text + f": {format_bytes(leftover)} more than before (something the step created is still referenced)"
    if leftover > 0:
        # The storage ledger saw every tensor the trials made freed: on the H200 a ResNet's probe ended 65.0 MiB up,
        # cuBLAS's workspaces' size there, which torch allocates from its allocator and keeps for the process.
        return text + (f": {format_bytes(leftover)} more than before, held by no tensor the trials made (on CUDA, "
                       "library workspaces such as cuBLAS's, which PyTorch allocates at a first matrix product and "
                       "keeps for the process)")
    return text + ": back to the starting level"


def _holder_text(holder: dict[str, Any]) -> str:
    kind = "" if holder["kind"] == "tensors" else f" ({holder['kind']})"
    count = f", {holder['tensors']} tensors" if holder["kind"] == "tensors" and holder["tensors"] > 1 else ""
    graphs = ", with autograd graphs" if holder.get("graphs") else ""
    return f"{holder['name']} {format_bytes(holder['bytes'])}{kind}{count}{graphs}"


# A notebook tensor smaller than this share of the budget is named in "held before" without advice to move it.
HINT_SHARE = 0.01


def _baseline_line(result: BatchProbeResult) -> str:
    text = ", ".join(_holder_text(holder) for holder in result.baseline)
    others = [h for h in result.baseline if h["kind"] == "tensors"]  # the notebook's variables, not training
    if not others:
        return text
    largest = others[0]
    if largest["bytes"] < HINT_SHARE * result.budget_bytes:
        return text  # a batch left from the last cell, a few KiB: naming it is enough, moving it buys nothing
    if result.device == "cpu":
        # The CPU budget stands in for a GPU: data a GPU run would keep on the host counts here, not there.
        hint = (f"; if training keeps {largest['name']} on the host, it would not be on the GPU: give "
                f"--max-memory {format_bytes(result.budget_bytes + largest['bytes'])} (the budget plus its "
                "size) to leave it out")
    else:
        hint = (f"; if training does not need {largest['name']} on {result.device}, move it off "
                f"({largest['name']} = {largest['name']}.cpu()) or del it before probing")
    return text + hint


def _leak_line(leak: dict[str, Any]) -> str:
    holders = leak["holders"]
    where = ("; it is held by " + ", ".join(_holder_text(h) for h in holders)) if holders else ""
    return (f"{format_bytes(leak['bytes_per_call'])} per call at batch {leak['batch_size']}{where}. Keep numbers, "
            "not tensors, across steps: losses.append(loss.item()), or out.detach() for a tensor")


def _leftover_line(result: BatchProbeResult) -> str:
    last = result.leftovers[-1]
    names = ", ".join(_holder_text(h) for h in last["holders"]) or "something not reachable from the notebook"
    return (f"something outside the step holds tensors between calls: {names} "
            f"({format_bytes(last['bytes'])} after batch {last['batch_size']}); each trial is charged only "
            "what it makes itself" + (" (the CUDA allocator still counts it)"
                                       if result.accounting != "live tensor bytes" else ""))


def _notes(result: BatchProbeResult) -> list[str]:
    notes = list(result.notes)
    if result.interrupted:
        notes.insert(0, "Interrupted: these are the trials finished so far; the state was put back.")
    batches = max((t.batches for t in result.trials if t.fitted), default=1)
    if batches > 1:
        notes.append(f"Each call of the step trains {batches} batches of the size tried (the model ran {batches} "
                     "times per optimizer step: gradient accumulation); memory is that of one such batch, and "
                     "samples/s counts all of them.")
    return notes


def _bar(value: Any, full: float) -> str:
    if not value or full <= 0:
        return ""
    filled = max(1, round(BAR_WIDTH * min(value / full, 1.0)))
    return "█" * filled
