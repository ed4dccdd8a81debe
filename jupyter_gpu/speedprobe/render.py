"""Text and HTML renderings of a `SpeedProbeResult`. Every value in the HTML is escaped.

The verdict comes first: the configuration to adopt and what it buys, or that nothing tried beats the step as it
is. An option that is faster but whose numbers do not agree is said to be wrong, with why, and never recommended.
"""

from __future__ import annotations

from html import escape

from jupyter_gpu.rendering.kit import COLOUR, code_block_html, rows_html, rows_text, table_text
from jupyter_gpu.rendering.units import format_bytes, format_count, format_rate, format_seconds
from jupyter_gpu.speedprobe.decide import LOSS_DRIFT_LIMIT, helped
from jupyter_gpu.speedprobe.result import Agreement, LaunchProfile, OptionTrial, SpeedProbeResult

AGREES_MARK, WRONG_MARK = "✓", "✗"
FASTER_BUT_WRONG = "faster but wrong"
RECOMMENDED_MARK = "◀ recommended"
# Columns a text table right-aligns: numbers line up on their last digit.
NUMERIC_HEADINGS = ("median step", "speed-up", "samples/s")


# -- the headline -------------------------------------------------------------------------------------------------

def headline(result: SpeedProbeResult) -> str:
    """One line: the configuration to adopt (or that there is none), then the compiled options and their cost."""
    start = f"speedprobe {result.step_name}: "
    others = [_clause(trial) for trial in _mentioned(result)]
    if result.interrupted:
        # Nothing is concluded from a partial run: the best so far is what was measured, not a verdict.
        so_far = [f"so far {_verdict(result)}"] if result.best is not None else []
        stopped = f"interrupted after {format_seconds(result.seconds)}; what follows is what was measured"
        return start + "; ".join([stopped, *so_far, *others])
    return start + "; ".join([_verdict(result), *others])


def _verdict(result: SpeedProbeResult) -> str:
    if result.shared_cpu is not None:
        return f"no recommendation: {result.shared_cpu}"
    best = result.best
    if best is not None:
        return f"{best.title}: {_factor(best.speedup)} faster, agrees{_compile_cost(best)}"
    if not any(trial.measured for trial in result.options):
        return "no option could run on this step; keep the step as it is"
    return "nothing tried is faster and agrees; keep the step as it is"


def _mentioned(result: SpeedProbeResult) -> list[OptionTrial]:
    """Besides the best: each compiled option that ran (its compile time matters), then each that is fast but wrong."""
    others = [trial for trial in _configurations(result)[1:]
              if trial != result.best and trial.skipped is None and (trial.times or trial.error is not None)]
    compiled = [trial for trial in others if _is_compiled(trial) and len(trial.members) == 1]
    wrong = [trial for trial in others if faster_but_wrong(trial) and trial not in compiled]
    return [*compiled, *wrong]


def _clause(trial: OptionTrial) -> str:
    """`torch.compile: 1.1x after 48.0 s of compilation`, `fp16 autocast + GradScaler: 2.3x faster but wrong`."""
    if trial.error is not None:
        return f"{trial.title}: failed"
    if trial.speedup is None:
        return f"{trial.title}: not timed"
    if faster_but_wrong(trial):
        return f"{trial.title}: {_factor(trial.speedup)} {FASTER_BUT_WRONG}{_compile_cost(trial)}"
    wrong = " but wrong" if trial.agrees is False else ""
    return f"{trial.title}: {_factor(trial.speedup)}{wrong}{_compile_cost(trial)}"


def _compile_cost(trial: OptionTrial) -> str:
    return f" after {format_seconds(trial.compile_seconds)} of compilation" if trial.compile_seconds else ""


def _is_compiled(trial: OptionTrial) -> bool:
    return any(member.startswith("compile") for member in trial.members)


def faster_but_wrong(trial: OptionTrial) -> bool:
    """Fast enough to count as helping, but its numbers do not agree with the step as it is."""
    return helped(trial) and trial.agrees is False


def _factor(speedup: float | None) -> str:
    """`1.9x`; two decimals near 1, where one would round a 4% gain or loss to nothing."""
    if speedup is None:
        return "n/a"
    return f"{speedup:.2f}x" if abs(speedup - 1) < 0.1 else f"{speedup:.1f}x"


# -- (heading, text) rows -----------------------------------------------------------------------------------------

def warning_rows(result: SpeedProbeResult) -> list[tuple[str, str]]:
    """Each configuration that is faster but wrong, with what went wrong: the reason it is not recommended."""
    return [(FASTER_BUT_WRONG, f"{trial.title} ({_factor(trial.speedup)}): {_failure(trial.agreement)}; "
                               "not recommended")
            for trial in _configurations(result) if faster_but_wrong(trial)]


def launch_paragraph(result: SpeedProbeResult) -> str | None:
    """Why the step is slow when per-operator overhead, not arithmetic, takes its time; None when it does not."""
    launch = result.launch
    if launch is None or not launch.launch_bound:
        return None
    measured = f"{format_count(launch.ops)} operators per step at {format_seconds(launch.seconds_per_op)} each"
    if _on_cpu(launch):
        # Where this probe measured compile and it did not help, it is not offered as the cure beside its own row.
        compiled = [trial for trial in result.options if trial.name == "compile" and trial.measured]
        cure = ("a bigger batch cuts it (torch.compile, measured above, did not)"
                if compiled and not (compiled[0].speedup or 0) > 1 else "a bigger batch or torch.compile cuts it")
        yardstick = (f" (this host dispatches a one-element operator in {format_seconds(launch.op_floor)})"
                     if launch.op_floor else "")
        return (f"overhead-bound: {measured}{yardstick}: Python and PyTorch's dispatcher, not arithmetic, take the "
                f"time; {cure}.")
    if launch.gpu_busy is not None:
        return (f"launch-bound: {measured}, and the GPU ran kernels for {launch.gpu_busy:.0%} of the step "
                f"({_kernels(launch)}, traced): it waits on Python. A bigger batch, compile-reduce-overhead (CUDA "
                "graphs) or, for a tiny model, the CPU may be faster.")
    return (f"launch-bound: {measured}, near the few-µs launch cost: the GPU waits on Python. A bigger batch, "
            "compile-reduce-overhead (CUDA graphs) or, for a tiny model, the CPU may be faster.")


def _kernels(launch: LaunchProfile) -> str:
    return f"{format_count(round(launch.kernels))} kernels" if launch.kernels is not None else "kernels"


def _on_cpu(launch: LaunchProfile) -> bool:
    return launch.device.split(":")[0] == "cpu"


def footer_rows(result: SpeedProbeResult) -> list[tuple[str, str]]:
    """How far the numbers can be trusted (operators, repeatability, steps), the notes, what was put back, time."""
    rows = []
    operators = _operators_line(result.launch)
    if operators is not None:
        rows.append(("operators", operators))
    if result.repeatability is not None:
        rows.append(("repeatability", _repeatability_line(result.repeatability)))
    rows.append(("steps compared", f"{result.steps} per configuration, from the same weights and batch"))
    if result.batch_size and result.batches_per_step > 1:
        rows.append(("samples", f"{result.batches_per_step} batches of {result.batch_size} per step (the model was "
                                f"called {result.batches_per_step} times a step: gradient accumulation), counted "
                                "in samples/s"))
    rows.extend(("note", note) for note in result.notes)
    # Checked, not meant: the restored line lists what compared equal after the probe; what moved is a warning.
    rows.extend(("warning", line) for line in result.not_restored)
    if result.restored:
        rows.append(("restored", f"{', '.join(result.restored)} exactly as before"))
    rows.append(("time", format_seconds(result.seconds) + (" (interrupted)" if result.interrupted else "")))
    return rows


def _operators_line(launch: LaunchProfile | None) -> str | None:
    """The short form of the launch paragraph, for a step that is not launch-bound."""
    if launch is None or launch.launch_bound:
        return None
    if not launch.ops:
        return f"none counted on {launch.device} in the baseline step"
    busy = "" if launch.gpu_busy is None else \
        f"; the GPU ran kernels for {launch.gpu_busy:.0%} of the step ({_kernels(launch)}, traced)"
    return (f"{format_count(launch.ops)} per step on {launch.device} at {format_seconds(launch.seconds_per_op)} "
            f"each{busy} (not launch-bound)")


def _repeatability_line(difference: float) -> str:
    if difference == 0:
        return "two baseline runs from the same state differ by 0 (bitwise repeatable)"
    return f"two baseline runs from the same state differ by {difference:.2g} (relative L2 of the first update)"


# -- the table of configurations ----------------------------------------------------------------------------------

def _configurations(result: SpeedProbeResult) -> list[OptionTrial]:
    """Baseline first, then each option in the catalogue's order (skipped ones too), then the combination."""
    return [result.baseline, *result.options, *([result.combination] if result.combination else [])]


def table_headings(result: SpeedProbeResult) -> tuple[str, ...]:
    peak = "CUDA peak" if result.device.startswith("cuda") else "CPU tensors peak"
    return ("option", "median step", "min–max", "speed-up", "samples/s", peak, "agreement", "notes")


def table_rows(result: SpeedProbeResult) -> list[tuple[str, ...]]:
    """One row per configuration, shaped like `table_headings`."""
    return [_trial_row(result, trial) for trial in _configurations(result)]


def _trial_row(result: SpeedProbeResult, trial: OptionTrial) -> tuple[str, ...]:
    spread = trial.spread
    measured = trial.measured
    rate = result.samples_per_second(trial) if measured else None
    return (
        trial.title,
        format_seconds(trial.seconds) if measured else "",
        f"{format_seconds(spread[0])}–{format_seconds(spread[1])}" if measured and spread and len(trial.times) > 1
        else "",
        f"{trial.speedup:.2f}x" if measured and trial.speedup is not None else "",
        format_rate(rate) if rate is not None else "",
        format_bytes(trial.peak_bytes) if measured and trial.peak_bytes is not None else "",
        _agreement_text(trial),
        _notes_text(result, trial),
    )


def _agreement_text(trial: OptionTrial) -> str:
    if not trial.members:
        return "the reference"
    agreement = trial.agreement
    if agreement is None or not trial.measured:
        return ""
    if agreement.agrees is True:
        return f"{AGREES_MARK} agrees" + (f": {_evidence(agreement)}" if _evidence(agreement) else "")
    if agreement.agrees is False:
        wrong = f"{FASTER_BUT_WRONG}: " if faster_but_wrong(trial) else ""
        return f"{WRONG_MARK} {wrong}{_failure(agreement)}"
    return "not judged" + (f": {agreement.note}" if agreement.note else "")


def _evidence(agreement: Agreement) -> str:
    """`update Δ 3.1e-03 ≤ 1.6e-02, loss drift 0.04%` (`outputs Δ` for a forward-only step): what the verdict rests
    on."""
    parts = []
    if agreement.update_rel_l2 is not None:
        bound = f" ≤ {agreement.tolerance:.1e}" if agreement.tolerance is not None else ""
        what = "outputs" if agreement.compared == "outputs" else "update"
        parts.append(f"{what} Δ {agreement.update_rel_l2:.1e}{bound}")
    if agreement.loss_drift is not None:
        # The limit is said only where training amplifies rounding enough to raise it above 1%.
        limit = f" ≤ {agreement.loss_limit:.1%}" if agreement.loss_limit > LOSS_DRIFT_LIMIT else ""
        parts.append(f"loss drift {agreement.loss_drift:.2%}{limit}")
    return ", ".join(parts)


def _failure(agreement: Agreement | None) -> str:
    if agreement is None:
        return "no agreement measured"
    return agreement.failure or "the numbers differ from the baseline's"


def _notes_text(result: SpeedProbeResult, trial: OptionTrial) -> str:
    notes = []
    if trial == result.best:
        notes.append(RECOMMENDED_MARK)
    if trial.skipped is not None:
        notes.append(f"skipped: {trial.skipped}")
    if trial.error is not None:
        notes.append(f"failed: {trial.error}")
    if trial.compile_seconds is not None:
        notes.append(f"{format_seconds(trial.compile_seconds)} of compilation")
    if trial.agreement is not None and trial.agreement.agrees is True and trial.agreement.note:
        notes.append(trial.agreement.note)  # agreed, but on less than usual (the loss alone decided)
    if not trial.times and trial.skipped is None and trial.error is None:
        notes.append("not measured")  # interrupted before it ran
    return "; ".join(notes)


def _table(result: SpeedProbeResult) -> list[tuple[str, ...]]:
    """Headings and rows, without the columns no configuration filled (samples/s without a known batch size)."""
    rows = table_rows(result)
    headings = table_headings(result)
    keep = [i for i in range(len(headings)) if i < 2 or any(row[i] for row in rows)]
    return [tuple(row[i] for i in keep) for row in [headings, *rows]]


# -- the renderings -----------------------------------------------------------------------------------------------

def render_text(result: SpeedProbeResult) -> str:
    lines = [headline(result)]
    warnings = warning_rows(result)
    if warnings:  # rows_text needs at least one row
        lines.extend(rows_text(warnings))
    lines.append("configurations measured:")
    lines.extend(table_text(_table(result), NUMERIC_HEADINGS))
    paragraph = launch_paragraph(result)
    if paragraph is not None:
        lines.append(paragraph)
    code = result.code()
    if code:
        lines.append("code to adopt:")
        lines.extend(f"    {line}" for line in code)
    lines.extend(rows_text(footer_rows(result)))
    return "\n".join(lines)


def render_html(result: SpeedProbeResult) -> str:
    parts = [
        '<div class="jupyter-gpu-speedprobe" style="font-family:var(--jp-ui-font-family,sans-serif);line-height:1.4">',
        f'<div style="font-weight:600;color:{_headline_colour(result)}">{escape(headline(result))}</div>',
    ]
    warnings = warning_rows(result)
    if warnings:
        parts.append(f'<div style="color:{COLOUR["fail"]}">{rows_html(warnings)}</div>')
    parts.append(_table_html(result))
    paragraph = launch_paragraph(result)
    if paragraph is not None:
        parts.append(f'<div style="margin:.4em 0;color:{COLOUR["warn"]}">{escape(paragraph)}</div>')
    parts.append(_code_html(result.code()))
    parts.append(rows_html(footer_rows(result)))
    parts.append("</div>")
    return "".join(parts)


def _headline_colour(result: SpeedProbeResult) -> str:
    if result.interrupted:
        return COLOUR["warn"]
    return COLOUR["ok"] if result.best is not None else COLOUR["info"]


def _table_html(result: SpeedProbeResult) -> str:
    table = _table(result)
    cell = "text-align:left;padding-right:1em"
    agreement_column = table[0].index("agreement") if "agreement" in table[0] else None
    parts = ['<table style="margin:.4em 0;font-size:.92em;font-variant-numeric:tabular-nums">',
             "<tr>" + "".join(f'<th style="{cell}">{escape(heading)}</th>' for heading in table[0]) + "</tr>"]
    for trial, row in zip(_configurations(result), table[1:], strict=True):
        weight = ";font-weight:600" if trial == result.best else ""
        cells = [f'<td style="{cell}{weight}{_agreement_colour(trial) if i == agreement_column else ""}">'
                 f"{escape(value)}</td>" for i, value in enumerate(row)]
        parts.append("<tr>" + "".join(cells) + "</tr>")
    parts.append("</table>")
    return "".join(parts)


def _agreement_colour(trial: OptionTrial) -> str:
    if not trial.measured or trial.agrees is None:
        return ""
    return f";color:{COLOUR['ok'] if trial.agrees else COLOUR['fail']}"


def _code_html(code: list[str]) -> str:
    if not code:
        return ""
    return ('<div style="font-weight:600;margin-top:.4em">Code to adopt</div>'
            + code_block_html(chr(10).join(code)))
