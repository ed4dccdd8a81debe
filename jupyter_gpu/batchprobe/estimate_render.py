"""Text and HTML renderings of a `MemoryEstimate`. Every value in the HTML is escaped."""

from __future__ import annotations

from html import escape

from jupyter_gpu.batchprobe.estimate_result import MemoryEstimate
from jupyter_gpu.rendering.units import format_bytes, format_seconds


def headline(result: MemoryEstimate) -> str:
    answers = " · ".join(f"{format_bytes(memory)}: {_fit_text(fit)}" for memory, fit in result.fits.items())
    return "batchprobe --estimate (fake tensors, nothing ran on a device)" + (f": {answers}" if answers else "")


def _fit_text(fit: int) -> str:
    return f"batch {fit}" if fit else "no batch size fits"


def rows(result: MemoryEstimate) -> list[tuple[str, str]]:
    table = [("memory model", f"peak ≈ {format_bytes(result.intercept)} + {format_bytes(result.per_sample)} "
                              "per sample")]
    for memory, fit in result.fits.items():
        budget = format_bytes(result.budget_for(memory))
        table.append((format_bytes(memory), f"{_fit_text(fit)} (tensors may use {budget} = size − "
                                            f"{format_bytes(result.reserve_bytes)} reserve, {result.margin:.0%} "
                                            "kept free)"))
    table.append(("evaluated", ", ".join(f"{size}: {format_bytes(peak)}" for size, peak in result.points)))
    table.append(("time", f"{len(result.points)} fake evaluations on {result.device}, "
                          f"{format_seconds(result.seconds)} in all"))
    return table


def render_text(result: MemoryEstimate) -> str:
    lines = [headline(result)]
    lines += [f"  {label}: {value}" for label, value in rows(result)]
    lines += [f"  note: {note}" for note in result.notes]
    return "\n".join(lines)


def render_html(result: MemoryEstimate) -> str:
    body = "".join(f"<tr><th style='text-align:left'>{escape(label)}</th><td>{escape(value)}</td></tr>"
                   for label, value in rows(result))
    notes = "".join(f"<li>{escape(note)}</li>" for note in result.notes)
    return (f"<div><strong>{escape(headline(result))}</strong><table>{body}</table>"
            + (f"<ul>{notes}</ul>" if notes else "") + "</div>")
