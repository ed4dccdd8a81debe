"""Text and HTML renderings of a `GpuCheckReport`, built with the shared kit (`rendering/kit.py`)."""

from __future__ import annotations

import json
from html import escape

from jupyter_gpu.gpucheck.diagnose.stack import GpuLine, LastCell, Stack
from jupyter_gpu.gpucheck.report import GpuCheckReport
from jupyter_gpu.gpucheck.surface import TERMINAL, for_terminal
from jupyter_gpu.rendering.kit import (
    COLOUR,
    SIMULATED_HTML,
    SIMULATED_TEXT,
    STATUS_MARK,
    findings_html,
    findings_text,
    rows_html,
    rows_text,
)
from jupyter_gpu.rendering.units import format_bytes, format_duration

SEP = " · "


def _simulated(report: GpuCheckReport) -> bool:
    return bool((report.facts.get("context") or {}).get("simulated"))


def _gpu_text(gpu: GpuLine) -> str:
    parts = [gpu.name or "unnamed GPU"]
    if gpu.memory_total is not None:
        free = f" ({format_bytes(gpu.memory_free)} free)" if gpu.memory_free is not None else ""
        parts.append(f"{format_bytes(gpu.memory_total)}{free}")
    if gpu.capability:
        parts.append(f"compute {gpu.capability}")
    if gpu.mig_enabled is not None:
        instances = f", {gpu.mig_instances} instance{'' if gpu.mig_instances == 1 else 's'}" if (
            gpu.mig_enabled and gpu.mig_instances is not None) else ""
        parts.append(f"MIG {'on' if gpu.mig_enabled else 'off'}{instances}")
    return SEP.join(parts)


def _last_cell_text(cell: LastCell) -> str:
    where = f"In [{cell.execution_count}]" if cell.execution_count is not None else "the last long cell"
    return (f"{where}, {format_duration(cell.seconds)}: {', '.join(cell.devices)} busy "
            f"{cell.utilization_percent:.0f}% on average ({cell.samples} readings)"
            + (SIMULATED_TEXT if cell.simulated else ""))


def stack_rows(stack: Stack) -> list[tuple[str, str]]:
    """The stack as (heading, text) rows: one compact block, the same in text and HTML."""
    torch = "not installed"
    if stack.torch:
        built = [p for p in (stack.build and f"{stack.build} build", stack.cudnn and f"cuDNN {stack.cudnn}",
                             stack.nccl and f"NCCL {stack.nccl}") if p]
        torch = SEP.join([stack.torch, *built])
    rows = [("torch", torch)]
    rows += [(name, version) for name, version in stack.companions.items()]
    if stack.python:
        rows.append(("Python", f"{stack.python} on {stack.platform}" if stack.platform else stack.python))
    driver = "none found"
    if stack.driver:
        driver = stack.driver + (f"{SEP}supports CUDA {stack.driver_cuda}" if stack.driver_cuda else "")
    rows.append(("driver", driver))
    rows += [(f"GPU {gpu.index}", _gpu_text(gpu)) for gpu in stack.gpus] or [("GPUs", "none visible")]
    if stack.last_cell is not None:
        rows.append(("last long cell", _last_cell_text(stack.last_cell)))
    return rows


def torch_probe_line(facts: dict) -> str:
    """How the torch facts were obtained, for -v: a child run now, the cache (from when, which file), or neither."""
    record = (facts.get("probe") or {}).get("torch") or {}
    if record.get("cache_status") == "hit":
        return (f"torch probe: reused from the cache (written {record.get('cache_created')}, "
                f"{record.get('cache_file')}); --refresh probes again")
    if not record.get("ran"):
        return f"torch probe: not run ({record.get('reason')})"
    took = f" in {record['wall_s']:.2f} s" if isinstance(record.get("wall_s"), (int, float)) else ""
    cached = {"miss": ", now cached", "refresh": " (--refresh), cache rewritten", "stale": ", the cache entry was "
              "stale (NVML or the install changed)"}.get(record.get("cache_status") or "", "")
    return f"torch probe: ran{took}{cached}: {record.get('reason')}"


def render_text(report: GpuCheckReport) -> str:
    terminal = report.surface == TERMINAL  # `jupyter-gpu check`: worded for a terminal (gpucheck/surface.py)
    verdict = for_terminal(report.verdict, report.python) if terminal else report.verdict
    lines = [f"{STATUS_MARK[report.status]} {verdict}"]
    if _simulated(report):
        lines[0] += SIMULATED_TEXT
    if report.panels_note:
        lines.append(f"  {report.panels_note}")
    if report.stack is not None:
        lines.extend(rows_text(stack_rows(report.stack)))
    lines.extend(findings_text(report.terminal_findings if terminal else report.findings))
    if report.verbose:
        lines.append("")
        lines.append(torch_probe_line(report.facts))
        lines.append("Facts:")
        lines.append(json.dumps(report.facts, indent=2, sort_keys=True, default=str))
    return "\n".join(lines)


def render_html(report: GpuCheckReport) -> str:
    colour = COLOUR[report.status]
    simulated = SIMULATED_HTML if _simulated(report) else ""
    parts = [
        '<div class="jupyter-gpu-check" style="font-family:var(--jp-ui-font-family,sans-serif);line-height:1.4">',
        f'<div style="font-weight:600;color:{colour};font-size:1.05em">'
        f"{STATUS_MARK[report.status]} {escape(report.verdict)}{simulated}</div>",
    ]
    if report.panels_note:
        parts.append(f"<div>{escape(report.panels_note)}</div>")
    if report.stack is not None:
        parts.append(rows_html(stack_rows(report.stack)))
    parts.append(findings_html(report.findings))
    if report.verbose:
        facts = json.dumps(report.facts, indent=2, sort_keys=True, default=str)
        parts.append(f"<div>{escape(torch_probe_line(report.facts))}</div>")
        parts.append(f"<details><summary>Facts</summary><pre>{escape(facts)}</pre></details>")
    parts.append("</div>")
    return "".join(parts)


