"""The distributed profile as text (terminals) and escaped HTML (notebooks), from one set of rows."""

from __future__ import annotations

from html import escape

from jupyter_gpu.ddpprofile.analyse import bucket_title
from jupyter_gpu.ddpprofile.result import DistributedProfile
from jupyter_gpu.gpuprofile.result import BACKWARD, DATA, FORWARD, OPTIMIZER
from jupyter_gpu.rendering.kit import code_block_html, findings_html, findings_text, table_html, table_text
from jupyter_gpu.rendering.units import format_bytes, format_seconds

NUMERIC = ("step", "data wait", "forward", "backward", "optimizer", "other", "all-reduce", "reduce-scatter",
           "overlapped", "exposed", "buckets", "collectives", "all-gather", "seconds/step")


def headline(profile: DistributedProfile) -> str:
    if profile.failure is not None and not profile.ranks:
        return f"Distributed profile of {profile.command}: it did not run."
    ranks = profile.ranks
    step = max(r.step for r in ranks)
    who = (f"{len(ranks)} ranks" if len(ranks) >= profile.world else
           f"rank {', '.join(str(r.rank) for r in ranks)} of {profile.world} (this machine's)")
    backend = profile.backend or "no DDP"
    line = f"Distributed profile: {who} ({backend}, {profile.device}), {format_seconds(step)} a step"
    scaling = profile.scaling
    if scaling is not None:
        line += (f"; scaling {scaling.speedup:.2f}x on {scaling.processes} ({scaling.efficiency:.0%})"
                 + (f": {parts_sentence(profile)}" if scaling.lost > 0 else ""))
    return line


def parts_sentence(profile: DistributedProfile) -> str:
    """"25% exposed all-reduce, 10% rank 3's data wait, 5% other": the lost part, each as a share of the N-rank
    step (they add up to 1 - efficiency)."""
    scaling = profile.scaling
    if scaling is None:
        return ""
    late = profile.straggler
    words = []
    for name, seconds in scaling.parts:
        if abs(seconds) < 0.005 * scaling.n_step:
            continue
        if name.startswith("rank ") and late is not None:
            name = f"rank {late.rank}'s {bucket_title(late.bucket)} (the others wait for it)"
        elif name == "exposed communication":
            name = "exposed all-reduce"
        words.append(f"{seconds / scaling.n_step:.0%} {name}")
    return ", ".join(words)


def rank_table(profile: DistributedProfile) -> list[tuple[str, ...]]:
    fsdp = any(r.kind == "reduce_scatter" or r.gather for r in profile.ranks)
    comm, pieces = ("reduce-scatter", "collectives") if fsdp else ("all-reduce", "buckets")
    rows: list[tuple[str, ...]] = [("rank", "host", "step", "data wait", "forward", "backward", "optimizer", "other",
                                    comm, "overlapped", "exposed", pieces, *(("all-gather",) if fsdp else ()))]
    late = profile.straggler.rank if profile.straggler is not None else None
    for r in profile.ranks:
        b = r.buckets
        rows.append((f"{r.rank}{' (slowest)' if r.rank == late else ''}", r.host, format_seconds(r.step),
                     format_seconds(b.get(DATA, 0.0)), format_seconds(b.get(FORWARD, 0.0)),
                     format_seconds(b.get(BACKWARD, 0.0)), format_seconds(b.get(OPTIMIZER, 0.0)),
                     format_seconds(sum(v for k, v in b.items()
                                        if k not in (DATA, FORWARD, BACKWARD, OPTIMIZER))),
                     format_seconds(r.comm), format_seconds(r.overlapped), format_seconds(r.exposed),
                     f"{r.buckets_per_step:.3g}", *((format_seconds(r.gather),) if fsdp else ())))
    return rows


def scaling_rows(profile: DistributedProfile) -> list[tuple[str, ...]]:
    scaling = profile.scaling
    if scaling is None:
        return []
    rows: list[tuple[str, ...]] = [("the lost part", "seconds/step", "share")]
    for name, seconds in scaling.parts:
        share = seconds / scaling.n_step
        rows.append((name, format_seconds(seconds), "0%" if abs(share) < 0.005 else f"{share:.0%}"))
    return rows


def facts(profile: DistributedProfile) -> list[str]:
    lines = []
    ranks = profile.ranks
    if ranks and ranks[0].bucket_bytes and ranks[0].kind == "reduce_scatter":
        sizes = ", ".join(format_bytes(b) for b in ranks[0].bucket_bytes[:6])
        lines.append(f"FSDP: {ranks[0].buckets_per_step:.3g} reduce-scatter(s) a step ({sizes}), all-gathers "
                     f"{format_seconds(ranks[0].gather)} a step")
    elif ranks and ranks[0].bucket_bytes:
        sizes = ", ".join(format_bytes(b) for b in ranks[0].bucket_bytes[:6])
        settings = ranks[0].settings
        lines.append(f"DDP: {ranks[0].buckets_per_step:.3g} bucket(s) a step ({sizes}); bucket_cap_mb="
                     f"{settings.get('bucket_cap_mb')}, find_unused_parameters={settings.get('find_unused_parameters')}"
                     f", gradient_as_bucket_view={settings.get('gradient_as_bucket_view')}, static_graph="
                     f"{settings.get('static_graph')}")
    if profile.scaling is not None:
        s = profile.scaling
        lines.append(f"Scaling: {format_seconds(s.one_step)} a step with 1 process, {format_seconds(s.n_step)} with "
                     f"{s.processes}, the same batch per rank: {s.processes} x {s.efficiency:.0%} = {s.speedup:.2f}x "
                     "the throughput")
    late = profile.straggler
    if late is not None:
        lines.append(f"Slowest rank: {late.rank} in {late.slowest_steps} of {late.steps} steps "
                     f"(step by step: {' '.join(map(str, late.by_step))}), "
                     f"{format_seconds(late.lead)} a step behind the others' mean; its {bucket_title(late.bucket)}: "
                     f"{format_seconds(late.its_seconds)} against {format_seconds(late.others_seconds)}")
    if profile.clock_line:
        lines.append(profile.clock_line[:1].upper() + profile.clock_line[1:])
    if profile.clock_finding:
        lines.append(profile.clock_finding)
    lines.append(f"Each rank ran {profile.warmup} warm-up and {ranks[0].steps if ranks else 0} profiled optimizer "
                 "steps, then stopped (the script's objects end with its processes: nothing to put back).")
    return lines


def applied_rows(profile: DistributedProfile) -> list[tuple[str, ...]]:
    applied = profile.applied
    if applied is None or applied.failure is not None:
        return []
    rows: list[tuple[str, ...]] = [("", "before", "after")]
    rows.append(("seconds per step", format_seconds(applied.before_step), format_seconds(applied.after_step)))
    rows.append(("all-reduces per step", f"{applied.before_allreduces:.3g}", f"{applied.after_allreduces:.3g}"))
    if applied.before_batches and applied.after_batches:
        rows.append(("steps per epoch, each rank", str(applied.before_batches), str(applied.after_batches)))
    return rows


def applied_lines(profile: DistributedProfile) -> list[str]:
    applied = profile.applied
    if applied is None:
        return []
    lines = ["Applied without editing the script (--apply), the same run again:"]
    lines += [f"  {change}" for _, change in applied.fixes]
    if applied.failure is not None:
        return [*lines, f"The run with them failed: {applied.failure}"]
    verdict = f"{applied.step_speedup:.2f}x per step"
    if applied.epoch_speedup is not None and abs(applied.epoch_speedup - applied.step_speedup) > 0.05:
        verdict += f", {applied.epoch_speedup:.2f}x per epoch"
    gone = f"; gone from the findings: {', '.join(applied.gone)}" if applied.gone else ""
    return [*lines, f"Measured: {verdict}{gone}."]


def render_text(profile: DistributedProfile) -> str:
    lines = [headline(profile)]
    if profile.failure is not None:
        lines += ["", profile.failure]
    if profile.ranks:
        lines += ["", "Per rank, seconds per step (backward without its wait for the communication):"]
        lines += table_text(rank_table(profile), NUMERIC)
        lines += ["", *facts(profile)]
    rows = scaling_rows(profile)
    if rows:
        lines += ["", "What scaling lost:", *table_text(rows, (*NUMERIC, "share"))]
    if profile.plan:
        lines += ["", "Plan, the costliest first:"]
        for number, item in enumerate(profile.plan, 1):
            cost = f" ({format_seconds(item.seconds)}/step)" if item.seconds is not None else ""
            lines += [f"  {number}. {item.cause}{cost}", f"       {item.change}"]
    if profile.applied is not None:
        lines += ["", *applied_lines(profile)]
        if applied_rows(profile):
            lines += table_text(applied_rows(profile), ("before", "after"))
    if profile.findings:
        lines += ["", "Found in the ranks' records:", *findings_text(profile.findings)]
    if profile.notes:
        lines += [""] + [f"Note: {note}" for note in profile.notes]
    return "\n".join(lines)


def render_html(profile: DistributedProfile) -> str:
    parts = [f'<div class="jupyter-gpu-ddpprofile"><p style="font-weight:600">{escape(headline(profile))}</p>']
    if profile.failure is not None:
        parts.append(code_block_html(profile.failure))
    if profile.ranks:
        parts.append("<p>Per rank, seconds per step (backward without the all-reduce it waited for):</p>")
        parts.append(table_html(rank_table(profile), NUMERIC))
        parts.append("<ul>" + "".join(f"<li>{escape(line)}</li>" for line in facts(profile)) + "</ul>")
    rows = scaling_rows(profile)
    if rows:
        parts.append("<p>What scaling lost:</p>" + table_html(rows, (*NUMERIC, "share")))
    if profile.plan:
        items = "".join(
            f"<li>{escape(item.cause)}"
            f"{escape(f' ({format_seconds(item.seconds)}/step)') if item.seconds is not None else ''}"
            f"{code_block_html(item.change)}</li>" for item in profile.plan)
        parts.append(f"<p>Plan, the costliest first:</p><ol>{items}</ol>")
    if profile.applied is not None:
        said = applied_lines(profile)
        parts.append(f"<p>{escape(said[0])}</p>" + code_block_html("\n".join(c for _, c in profile.applied.fixes)))
        parts.append("".join(f"<p>{escape(line)}</p>" for line in said[1 + len(profile.applied.fixes):]))
        if applied_rows(profile):
            parts.append(table_html(applied_rows(profile), ("before", "after")))
    if profile.findings:
        parts.append("<p>Found in the ranks' records:</p>" + findings_html(profile.findings))
    if profile.notes:
        parts.append("".join(f"<p>Note: {escape(note)}</p>" for note in profile.notes))
    parts.append("</div>")
    return "".join(parts)
