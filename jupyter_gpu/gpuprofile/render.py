"""Text and HTML renderings of a `ProfileResult`. Every value in the HTML is escaped.

The verdict line comes first ("412 ms/step: 46% waiting for data, 18% in 3 syncs (line 14), MFU 12% of H200 bf16"),
then the breakdown as a stacked bar per step, the ranked plan with the commands to type, the operators' roofline
table, the ready steps, and what was not measured and why.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from html import escape
from typing import Any

from jupyter_gpu.gpuprofile.commands import needs_first, step_name
from jupyter_gpu.gpuprofile.result import (
    BUCKET_TITLES,
    BUCKETS,
    DATA,
    ONE_RUN,
    STALL_FACTOR,
    SYNC,
    AppliedFixes,
    Bucket,
    ProfileResult,
    RunFigures,
    how_often,
)
from jupyter_gpu.rendering.kit import code_block_html, code_html, rows_html, rows_text, table_html, table_text
from jupyter_gpu.rendering.units import format_bytes, format_count, format_rate, format_seconds

BAR_WIDTH = 50
# One colour per bucket, the same in every bar: the eye follows "data" across steps.
COLOURS = {"data": "#e53935", "copies": "#fb8c00", "forward": "#1e88e5", "backward": "#3949ab",
           "optimizer": "#00897b", "sync": "#8e24aa", "gc": "#6d4c41", "other": "#9e9e9e"}
LETTERS = {"data": "D", "copies": "C", "forward": "F", "backward": "B", "optimizer": "O", "sync": "S", "gc": "G",
           "other": "."}
OPERATOR_HEADINGS = ("operator", "calls", "time/step", "GFLOP", "MB moved", "FLOP/B", "bound")


def verdict_line(result: ProfileResult) -> str:
    if not result.step_seconds:
        start = "gpuprofile: no step was profiled"
        return start + (f" ({result.error})" if result.error else "")
    parts = []
    data = result.bucket(DATA)
    if data is not None and data.share >= 0.01:
        parts.append(f"{data.share:.0%} waiting for data")
    sync = result.bucket(SYNC)
    if result.syncs:
        lines = ", ".join(s.where for s in result.syncs[:3])
        share = f"{sync.share:.0%} in " if sync is not None and sync.share >= 0.01 else ""
        count = sum(s.per_step for s in result.syncs)
        parts.append(f"{share}{how_often(count, 'sync')} ({lines})")
    if result.gpu_busy is not None:
        parts.append(f"GPU busy {result.gpu_busy:.0%}")
    if result.mfu is not None and result.ceiling is not None:
        parts.append(f"MFU {result.mfu:.0%} of {result.ceiling.datasheet_name} {result.compute}")
    elif result.of_ceiling is not None:
        parts.append(f"{result.of_ceiling:.0%} of this {_device_word(result)}'s {result.compute} matmul ceiling")
    if not parts:
        biggest = max(result.breakdown, key=lambda b: b.seconds, default=None)
        if biggest is not None:
            parts.append(f"{biggest.share:.0%} {biggest.title}")
    status = " (interrupted)" if result.interrupted else " (the cell raised)" if result.error else ""
    cause = result.stall_cause()
    if cause is not None and result.mean_seconds:
        status += (f" (mean {format_seconds(result.mean_seconds)}: {len(result.stalled_steps)} of {result.steps} "
                   f"steps stalled, {BUCKET_TITLES[cause]})")
    return f"gpuprofile: {format_seconds(result.seconds)}/step{status}: " + ", ".join(parts)


def _device_word(result: ProfileResult) -> str:
    return "GPU" if result.device.startswith("cuda") else "CPU"


def _counted(result: ProfileResult) -> str:
    if not result.step_seconds:
        return "nothing: the cell stopped before its first step"
    if result.counted == ONE_RUN:
        return "the cell's one run (no DataLoader batches or optimizer steps to count)"
    counted = f"{result.steps} profiled {result.counted} after {len(result.warmup_seconds)} warm-up"
    if result.batches_per_step > 1:
        counted += f", {result.batches_per_step} DataLoader batches each (gradient accumulation)"
    return counted


SPARK_LEVELS = "▁▂▃▄▅▆▇█"
SPARK_MOST = 60  # characters: more steps than this are shown in groups, each by its slowest step


def _sparkline(seconds: list[float]) -> str:
    """The steps' times in the order they ran, one character each, from 0 to the slowest: a stall every few steps
    (a slow sample, workers at an epoch's start) shows as its pattern."""
    size = -(-len(seconds) // SPARK_MOST)
    groups = [max(seconds[i:i + size]) for i in range(0, len(seconds), size)]
    slowest = max(groups) or 1.0
    return "".join(SPARK_LEVELS[min(len(SPARK_LEVELS) - 1, int(value / slowest * len(SPARK_LEVELS)))]
                   for value in groups)


def _slowest_step(result: ProfileResult) -> str | None:
    """"step 16, 86.3 ms: 32.7 ms waiting for data, 31.4 ms other host time" for an outlier, else None."""
    if not result.step_buckets or not result.seconds:
        return None
    index = max(range(result.steps), key=lambda i: result.step_seconds[i])
    seconds = result.step_seconds[index]
    if seconds < STALL_FACTOR * result.seconds:
        return None
    buckets = result.step_buckets[index]
    # Where it spent more than a typical step does, largest first: what made it slow.
    extra = sorted(((over, key, buckets[key]) for key, over in result.over_typical(buckets).items() if key in buckets),
                   reverse=True)
    parts = [f"{format_seconds(value)} {BUCKET_TITLES[key].split(' (')[0]}" for over, key, value in extra[:2]
             if over > 0.1 * (seconds - result.seconds)]
    return (f"step {index + 1}, {format_seconds(seconds)} ({seconds / result.seconds:.1f}x the typical step)"
            + (f": {', '.join(parts)}" if parts else ""))


def _flop_amount(flops: int) -> str:
    """GFLOP from 0.1 GFLOP up, below that MFLOP: a small MLP's 311,296 FLOPs read "0.000 GFLOP"."""
    if flops >= 1e8:
        return f"{flops / 1e9:,.3f} GFLOP"
    return f"{flops / 1e6:.3g} MFLOP"


def _facts(result: ProfileResult, glyphs: bool = True) -> list[tuple[str, str]]:
    """The report's facts rows. `glyphs`: the steps' sparkline in block characters, for text; a browser's default
    monospace font draws ▁▂▃▄▅▆▇█ as one solid bar, so the HTML shows the per-step chart (CSS bars) instead."""
    rows = [("device", f"{result.device} ({result.device_name})"), ("counted", _counted(result))]
    if result.warmup_seconds and result.seconds:
        extra = sum(result.warmup_seconds) - len(result.warmup_seconds) * result.seconds
        rows.append(("one-time costs", f"{format_seconds(max(extra, 0.0))} in the warm-up steps (first step "
                                       f"{format_seconds(result.warmup_seconds[0])}), where compilation, "
                                       "autotuning, workers starting and the allocator growing land"))
    if result.step_seconds:
        fastest, slowest = min(result.step_seconds), max(result.step_seconds)
        rows.append(("step", f"typical {format_seconds(result.seconds)} (median "
                              f"{format_seconds(statistics.median(result.step_seconds))}), "
                              f"{format_seconds(fastest)} - {format_seconds(slowest)}"
                              + (f", in order {_sparkline(result.step_seconds)}" if glyphs and result.steps > 2
                                 else "")))
        slowest_row = _slowest_step(result)
        if slowest_row is not None:
            rows.append(("slowest step", slowest_row))
    if result.samples_per_second is not None:
        per_step = (f"{result.batches_per_step} batches of {result.batch_size} per step"
                    if result.batches_per_step > 1 else f"batch of {result.batch_size}")
        over_all = ""
        if result.recurring_stalls and result.mean_samples_per_second is not None:
            over_all = f"; {format_rate(result.mean_samples_per_second)} over the profiled steps, stalls included"
        rows.append(("throughput", f"{format_rate(result.samples_per_second)} samples/s ({per_step}){over_all}"))
    if result.flops:
        counted = "forward and backward" if "backward" in result.compute_phases else "forward only: no backward ran"
        rows.append(("FLOPs", f"{_flop_amount(result.flops)} per step ({counted}, "
                              f"torch.utils.flop_counter formulas), {result.compute}"))
    if result.achieved_flops:
        achieved = f"{result.achieved_flops / 1e12:.3g} TFLOP/s"
        if result.mfu is not None and result.ceiling is not None:
            achieved += (f"; MFU {result.mfu:.1%} of the {result.ceiling.datasheet_name} dense {result.compute} "
                         f"peak ({result.ceiling.datasheet_flops / 1e12:g} TFLOP/s)")
        rows.append(("achieved", achieved))
    ceiling = result.ceiling
    if ceiling is not None:
        text = f"{ceiling.matmul_flops / 1e12:.3g} TFLOP/s on a big {ceiling.compute} matmul"
        if ceiling.bandwidth:
            text += f", {ceiling.bandwidth / 1e9:.3g} GB/s on a big copy"
        if result.of_ceiling is not None:
            text += f"; the step reaches {result.of_ceiling:.0%} of it"
        elif result.beyond_ceiling:
            text += (f"; the step ran faster than that, so it is no ceiling: this {_device_word(result)} has no fast "
                     f"{ceiling.compute} matmul for big matrices")
        rows.append(("measured ceiling", text + f" (measured in {format_seconds(ceiling.seconds)})"))
    timeline = result.gpu_timeline
    if timeline is not None:
        traced = "" if timeline.traced_step is None else (
            f" (traced over {timeline.steps} steps under torch.profiler, {format_seconds(timeline.traced_step)} "
            "per step there: it slows the host, not the kernels)")
        rows.append(("GPU timeline", f"busy {timeline.busy:.0%} of a typical step, "
                                     f"{format_seconds(timeline.kernel_seconds)} of kernels per step; idle per step: "
                                     f"{format_seconds(timeline.host_wait)} waiting for the host "
                                     f"({format_seconds(timeline.launch_wait)} of it between back-to-back launches, "
                                     f"{format_seconds(timeline.outside_launches)} while it did other work), "
                                     f"{format_seconds(timeline.kernel_wait)} between kernels, "
                                     f"{format_seconds(timeline.other_wait)} other; {timeline.kernels_per_step:.0f} "
                                     f"kernels per step, median {format_seconds(timeline.median_kernel)}{traced}"))
    if result.copies is not None:
        c = result.copies
        rows.append(("host→device", f"{how_often(c.count, 'copy', 'copies')}, {format_bytes(c.bytes)}/step, "
                                    f"{c.pageable:.3g} from pageable memory, {c.blocking:.3g} blocking"))
    if result.peak_memory is not None:
        rows.append(("peak memory", format_bytes(result.peak_memory)))
    if result.overhead_seconds is not None and result.seconds:
        rows.append(("profiling cost", f"about {format_seconds(result.overhead_seconds)} per step "
                                       f"({result.overhead_seconds / result.seconds:.1%}), measured: the hooks' cost "
                                       "per bucket and per module call, times those in a step"))
    return rows


def _breakdown_rows(result: ProfileResult) -> list[tuple[str, ...]]:
    # The GPU-time column only where CUDA events timed a phase: on the CPU it would stand empty.
    gpu = any(bucket.gpu_seconds is not None for bucket in result.breakdown)
    rows: list[tuple[str, ...]] = [("", "typical step", "share", "spread", *(("GPU time",) if gpu else ()))]
    for bucket in result.breakdown:
        timed = format_seconds(bucket.gpu_seconds) if bucket.gpu_seconds is not None else ""
        rows.append((bucket.title, format_seconds(bucket.seconds), f"{bucket.share:.0%}",
                     f"{format_seconds(bucket.low)} - {format_seconds(bucket.high)}", *((timed,) if gpu else ())))
    return rows


def _gpu_span_note(result: ProfileResult) -> str | None:
    """What the GPU-time column measures. On the H200 a host-bound transformer's forward showed 14.9 ms of host and
    15.0 ms of GPU time while its kernels ran 7 ms of the whole step: a CUDA-event span waits with the host."""
    if not any(bucket.gpu_seconds is not None for bucket in result.breakdown):
        return None
    note = "GPU time: each phase's span on the GPU (CUDA events around it), idle gaps included"
    timeline = result.gpu_timeline
    if timeline is None:
        return note
    return (f"{note}; its kernels ran {format_seconds(timeline.kernel_seconds)} of the whole step "
            f"({timeline.busy:.0%}, kernel timeline)")


def _bar_text(buckets: list[Bucket]) -> str:
    total = sum(b.seconds for b in buckets) or 1.0
    cells = "".join(LETTERS[b.key] * round(BAR_WIDTH * b.seconds / total) for b in buckets)
    legend = " ".join(f"{LETTERS[b.key]}={b.key}" for b in buckets if b.seconds)
    return f"  [{cells:<{BAR_WIDTH}}]  {legend}"


def _on_gpu_time(result: ProfileResult) -> bool:
    return any(op.gpu_seconds is not None for op in result.operators)


def _operator_rows(result: ProfileResult) -> list[tuple[str, ...]]:
    headings = OPERATOR_HEADINGS if not _on_gpu_time(result) else (
        OPERATOR_HEADINGS[0], OPERATOR_HEADINGS[1], "GPU time/step", *OPERATOR_HEADINGS[3:])
    rows: list[tuple[str, ...]] = [headings]
    for op in result.operators:
        rows.append((op.label, format_count(op.calls), format_seconds(op.time), f"{op.flops / 1e9:.3g}",
                     f"{op.bytes / 1e6:.3g}", f"{op.intensity:.3g}" if op.intensity is not None else "",
                     op.bound or "?"))
    return rows


def _whose(result: ProfileResult) -> str:
    """Whose operator time the memory-bound share is of: the model's, where the optimizer's is kept apart."""
    return "the model's " if result.optimizer_share is not None else ""


def _operators_title(result: ProfileResult) -> str:
    if _on_gpu_time(result):
        return ("Top operators by their kernels' time per step (the kernel timeline's steps; calls, FLOPs and bytes "
                "from one counted step)")
    return "Top operators over one counted step"


def render_text(result: ProfileResult) -> str:
    lines = [verdict_line(result)]
    if result.error:
        lines.append(f"  the cell raised {result.error}; its traceback follows")
    lines += [f"  {note}" for note in result.notes]
    lines += rows_text(_facts(result))
    if not result.step_seconds:
        return "\n".join(lines)  # nothing ran: no breakdown, plan or ready steps to show
    if result.breakdown:
        lines += ["", "Where each step goes (a typical step: the mean of the middle half of the profiled steps; "
                      "the buckets add up to it):"]
        lines.append(_bar_text(result.breakdown))
        lines += table_text(_breakdown_rows(result), ("typical step", "share", "GPU time"))
        span = _gpu_span_note(result)
        if span:
            lines.append(f"  {span}")
    if result.syncs:
        lines += ["", "Syncs (the host read a tensor's value, so it waits for the device to catch up):"]
        for sync in result.syncs:
            lines.append(f"  {sync.where} `{sync.source}`: {', '.join(sync.kinds)}, {how_often(sync.per_step)}, "
                         f"{format_seconds(sync.seconds)}/step blocked")
    if result.plan:
        lines += ["", "What to fix first (time lost per step; the most that fixing it can buy):"]
        for number, item in enumerate(result.plan, 1):
            gain = f", up to {item.ceiling:.2f}x" if item.ceiling else ""
            lines.append(f"  {number}. {item.cause} ({_lost(item.seconds)}{gain})")
            if item.detail:
                lines.append(f"     {item.detail}")
            lines.append(f"     → {item.command}")
    if result.operators:
        why = ("the models the loop called are already compiled" if result.all_models_compiled
               else "candidates for torch.compile")
        share = "" if result.memory_bound_share is None else \
            f"; {result.memory_bound_share:.0%} of {_whose(result)}operator time is memory-bound ({why})"
        lines += ["", f"{_operators_title(result)}{share}:"]
        rows = _operator_rows(result)
        lines += table_text(rows, rows[0][1:6])
    if result.applied is not None:
        lines += ["", "--apply: the loop again with the fixes that need no edit of your code:"]
        lines += _applied_text(result.applied)
    if result.ready_steps:
        lines += ["", "Ready steps for the probes:"]
        for ready in result.ready_steps:
            if ready.name:
                lines.append(f"  {ready.command}   ({ready.name} is defined in {result.defined_in})")
            else:
                # The command fails until its wrapper is filled in: the line says so first, with the name to define.
                lines.append(f"  {needs_first(ready, ready.command)}   (not lifted: {ready.reason}; the wrapper:)")
                lines += [f"      {code_line}" for code_line in ready.code.splitlines()]
    if result.not_measured:
        lines += ["", "Not measured:"] + [f"  {item}" for item in result.not_measured]
    return "\n".join(lines)


def _applied_rows(applied: AppliedFixes) -> list[tuple[str, ...]]:
    def row(title: str, value: Callable[[RunFigures], str]) -> tuple[str, ...]:
        return (title, value(applied.before), value(applied.after) if applied.after else "")

    def share(value: float | None) -> str:
        return f"{value:.0%}" if value is not None else "n/a"

    # Both runs' mean loss with the same decimals (4 significant digits of the larger), so 2.320 and 2.305 line up.
    means = [statistics.fmean(f.losses) for f in (applied.before, applied.after) if f is not None and f.losses]
    decimals = max(0, 3 - math.floor(math.log10(max(map(abs, means))))) if means and any(means) else 4

    def mean_loss(f: RunFigures) -> str:
        return f"{statistics.fmean(f.losses):.{decimals}f}" if f.losses else "n/a"

    stalls = any(f is not None and f.stalls_included for f in (applied.before, applied.after))
    rows = [row("step (mean: stalls recur)" if stalls else "step", lambda f: format_seconds(f.seconds)),
            row("samples/s", lambda f: format_rate(f.samples_per_second)),
            *_against_rows(applied),
            row("peak memory", lambda f: format_bytes(f.peak_memory)),
            row("waiting for data", lambda f: share(f.data_share)),
            row("syncs", lambda f: share(f.sync_share)),
            row("loss (mean of the steps)", mean_loss)]
    # A figure neither run has (MFU on a CPU, a loss in an evaluation loop) is left out, not shown as n/a twice.
    return [("", "before", "after"), *(r for r in rows if any(value not in ("n/a", "") for value in r[1:]))]


def _against_rows(applied: AppliedFixes) -> list[tuple[str, ...]]:
    """MFU and the share of the matmul ceiling, one yardstick per row, named in the row, with both runs set against
    it: a run in bf16 has its own ceiling and peak, and "of the matmul ceiling 34% → 18%" beside a 2.1x speed-up had
    set the run before against a re-measured fp32 ceiling and the run after against the bf16 one. A row per format
    the runs computed in; the run before's measurement of a format both share (one number, not two re-measured)."""
    runs = [f for f in (applied.before, applied.after) if f is not None]

    def cells(value: Callable[[RunFigures], str]) -> tuple[str, str]:
        return value(applied.before), value(applied.after) if applied.after is not None else ""

    def share(value: float | None) -> str:
        return f"{value:.0%}" if value is not None else "n/a"

    if not any(f.achieved_flops for f in runs):  # figures that do not say what they are against: as they were
        return [("MFU", *cells(lambda f: share(f.mfu))),
                ("of the matmul ceiling", *cells(lambda f: share(f.of_ceiling)))]

    def against(label: str, yardstick: float) -> tuple[str, ...]:
        return (label, *cells(lambda f: share(f.achieved_flops / yardstick if f.achieved_flops else None)))

    rows: list[tuple[str, ...]] = []
    peaks = {(f.peak_name, f.compute): f.peak_flops for f in reversed(runs) if f.peak_flops and f.compute}
    for (name, compute), peak in peaks.items():
        rows.append(against(f"MFU of the {name} {compute} peak ({peak / 1e12:.3g} TFLOP/s)", peak))
    ceilings = {f.compute: f.ceiling_flops for f in reversed(runs) if f.ceiling_flops and f.compute}
    for compute, ceiling in ceilings.items():
        rows.append(against(f"of the {compute} matmul ceiling ({ceiling / 1e12:.3g} TFLOP/s)", ceiling))
    return rows


def _fixes_rows(applied: AppliedFixes) -> list[tuple[str, str]]:
    """Every fix --apply considered and what became of it: applied, left out (measured, and why not), or not tried
    (and why it could not be): a table that said only "nothing: no fix could be measured" left the reader to guess."""
    rows = [(name, "applied") for name in applied.applied]
    rows += [(name, f"left out: {why}") for name, why in applied.left_out]
    rows += [(name, f"not tried: {why}") for name, why in applied.not_tried]
    return rows


def _applied_blocks(applied: AppliedFixes) -> list[tuple[str, Any]]:
    """--apply's section once, for both renderings: ("line", sentence), ("table", (rows, numeric headings)),
    ("code", lines to keep) and ("command", a probe command it measured with)."""
    if applied.interrupted:
        blocks: list[tuple[str, Any]] = [
            ("line", f"interrupted (Ctrl-C) during {applied.interrupted}: nothing applied, the state put back")]
    else:
        # "No fix helped" only when some fix was measured; else nothing could be, for the reasons left out below.
        nothing = ("nothing (no fix helped and agreed)" if applied.checked else
                   "nothing: no fix could be measured (why, below)")
        blocks = [("line", f"applied: {'; '.join(applied.applied) or nothing}")]
    if applied.after is not None:
        blocks.append(("table", (_applied_rows(applied), ("before", "after"))))
        if applied.speedup is not None and applied.reproducible:
            blocks.append(("line", f"{applied.speedup:.2f}x per step, measured on your loop"))
        elif applied.speedup is not None:
            low, high = min(applied.pair_speedups), max(applied.pair_speedups)
            blocks.append(("line", f"not reproducible: the pairs of runs gave {low:.2f}x to {high:.2f}x, so this "
                                   "machine's speed changed while they ran (other work on it?); run --apply again "
                                   "when it is idle before keeping the fixes for their speed"))
        if applied.runs_each > 1:
            pairs = " and ".join(f"{speedup:.2f}x" for speedup in applied.pair_speedups)
            steps = len(applied.before.step_seconds) // applied.runs_each
            blocks.append(("line", f"each measured {applied.runs_each} times ({steps} steps each), back to back "
                                   f"(before, after, after, before), from the same state, and its faster run "
                                   f"compared; the two pairs gave {pairs}"))
        if applied.loss_difference is not None:
            blocks.append(("line", f"the losses of the two runs (same state, same batches) differ by at most "
                                   f"{applied.loss_difference:.2%} step by step"))
    fixes = _fixes_rows(applied)
    if fixes:
        blocks.append(("table", ([("fix", "what became of it"), *fixes], ())))
    if applied.code:
        blocks += [("line", "to keep them, in your code:"), ("code", applied.code)]
    blocks += [("command", command) for command in applied.checked]
    return blocks


def _applied_text(applied: AppliedFixes) -> list[str]:
    lines = []
    for kind, value in _applied_blocks(applied):
        if kind == "table":
            lines += table_text(*value)
        elif kind == "code":
            lines += [f"    {line}" for line in value]
        elif kind == "command":
            lines.append(f"  measured with: {value}")
        else:
            lines.append(f"  {value}")
    return lines


def _applied_html(applied: AppliedFixes) -> str:
    """The same section as HTML: its tables as tables (numbers right-aligned), the code to keep as a code block."""
    parts = []
    for kind, value in _applied_blocks(applied):
        if kind == "table":
            parts.append(table_html(*value))
        elif kind == "code":
            parts.append(code_block_html("\n".join(value)))
        elif kind == "command":
            parts.append(f"<div>measured with: {code_html(value)}</div>")
        else:
            parts.append(f"<div>{escape(value)}</div>")
    return "".join(parts)


# The per-step chart's tallest column and its width, in pixels: columns narrow as steps grow, 4 px at the least.
STEP_CHART_HEIGHT = 96
STEP_CHART_WIDTH = 400


def _steps_chart_html(result: ProfileResult) -> str:
    """One stacked column per profiled step, in the order they ran, its height the step's time: the typical bar
    above hides what this shows, a first batch of each epoch waiting for the workers, a step with a collection."""
    if len(result.step_buckets) < 2:
        return ""
    tallest = max(result.step_seconds) or 1.0
    width = max(4, min(20, STEP_CHART_WIDTH // len(result.step_buckets)))
    columns = []
    for number, (seconds, buckets) in enumerate(zip(result.step_seconds, result.step_buckets, strict=True), 1):
        parts = "".join(
            f'<div title="step {number}: {escape(BUCKET_TITLES[key])} {escape(format_seconds(buckets[key]))}" '
            f'style="height:{STEP_CHART_HEIGHT * buckets[key] / tallest:.1f}px;background:{COLOURS[key]}"></div>'
            for key in reversed(BUCKETS) if buckets.get(key))
        columns.append(f'<div title="step {number}: {escape(format_seconds(seconds))}" style="display:flex;'
                       f'flex-direction:column;justify-content:flex-end;width:{width}px;'
                       f'height:{STEP_CHART_HEIGHT}px">{parts}</div>')
    return (f'<div style="font-size:.85em;opacity:.85">each profiled step in the order it ran (the tallest '
            f'{escape(format_seconds(tallest))}; hover for its parts)</div>'
            f'<div style="display:flex;gap:1px;align-items:flex-end;margin-bottom:.3em">{"".join(columns)}</div>')


def _bar_html(buckets: list[Bucket], steps: int) -> str:
    total = sum(b.seconds for b in buckets) or 1.0
    parts = "".join(
        f'<span title="{escape(b.title)}: {escape(format_seconds(b.seconds))}" style="display:inline-block;'
        f'height:1.1em;width:{100 * b.seconds / total:.2f}%;background:{COLOURS[b.key]}"></span>'
        for b in buckets if b.seconds > 0)
    legend = " ".join(f'<span style="color:{COLOURS[b.key]}">■</span> {escape(b.title)} {b.share:.0%}'
                      for b in buckets if b.seconds > 0)
    return (f'<div style="width:100%;max-width:48em;white-space:nowrap;overflow:hidden;border-radius:3px">{parts}'
            f'</div><div style="font-size:.85em;opacity:.85">{legend}</div>')


def _lost(seconds: float) -> str:
    return f"{format_seconds(seconds)}/step" if seconds else "not timed"


def render_html(result: ProfileResult) -> str:
    parts = [f"<div><b>{escape(verdict_line(result))}</b></div>"]
    if result.error:
        parts.append(f"<div>the cell raised {code_html(result.error)}; its traceback follows</div>")
    parts += [f"<div>{escape(note)}</div>" for note in result.notes]
    parts.append(rows_html(_facts(result, glyphs=not _steps_chart_html(result))))
    if not result.step_seconds:
        return "\n".join(parts)  # nothing ran: no breakdown, plan or ready steps to show
    if result.breakdown:
        parts.append("<div><b>Where each step goes</b> (a typical step: the mean of the middle half of the "
                     "profiled steps)</div>")
        parts.append(_bar_html(result.breakdown, result.steps))
        parts.append(_steps_chart_html(result))
        parts.append(table_html(_breakdown_rows(result), ("typical step", "share", "GPU time")))
        span = _gpu_span_note(result)
        if span:
            parts.append(f"<div>{escape(span)}</div>")
    if result.syncs:
        items = "".join(f"<li>{escape(s.where)} {code_html(s.source)}: {escape(', '.join(s.kinds))}, "
                        f"{how_often(s.per_step)}, {escape(format_seconds(s.seconds))}/step blocked</li>"
                        for s in result.syncs)
        parts.append(f"<div><b>Syncs</b></div><ul>{items}</ul>")
    if result.plan:
        items = "".join(
            f"<li>{escape(item.cause)} ({escape(_lost(item.seconds))}"
            f"{escape(f', up to {item.ceiling:.2f}x') if item.ceiling else ''})"
            f"{'<br>' + escape(item.detail) if item.detail else ''}<br>→ {code_html(item.command)}</li>"
            for item in result.plan)
        parts.append(f"<div><b>What to fix first</b></div><ol>{items}</ol>")
    if result.operators:
        parts.append(f"<div><b>{escape(_operators_title(result))}</b></div>")
        operators = _operator_rows(result)
        parts.append(table_html(operators, operators[0][1:6]))
    if result.applied is not None:
        parts.append("<div><b>--apply: before and after</b></div>")
        parts.append(_applied_html(result.applied))
    if result.ready_steps:
        items = "".join(
            f"<li>{code_html(r.command)} ({escape(r.name)} is defined in {escape(result.defined_in)})</li>"
            if r.name else
            f"<li>first define {code_html(step_name(r) + '()')} (fill in the wrapper below), then: "
            f"{code_html(r.command)} (not lifted: {escape(r.reason or '')}){code_block_html(r.code)}</li>"
            for r in result.ready_steps)
        parts.append(f"<div><b>Ready steps</b></div><ul>{items}</ul>")
    if result.not_measured:
        items = "".join(f"<li>{escape(item)}</li>" for item in result.not_measured)
        parts.append(f"<div><b>Not measured</b></div><ul>{items}</ul>")
    return "\n".join(parts)

