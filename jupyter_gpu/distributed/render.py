"""Text and HTML renderings of a `ReadinessReport`: verdict, the stack at a glance, the topology matrix, how to
launch from here, the findings with their fixes, and the checked all-reduce when one ran."""

from __future__ import annotations

from collections import Counter
from html import escape

from jupyter_gpu.distributed.readiness import NCCL_DEBUG_ADVICE, gpu_view
from jupyter_gpu.distributed.report import ReadinessReport
from jupyter_gpu.distributed.topology import Topology
from jupyter_gpu.distributed.topology_render import matrix_html, matrix_text
from jupyter_gpu.rendering.kit import (
    COLOUR,
    SIMULATED_HTML,
    SIMULATED_TEXT,
    STATUS_MARK,
    code_html,
    findings_html,
    findings_text,
    rows_html,
    rows_text,
    table_text,
)
from jupyter_gpu.rendering.units import format_bytes

SEP = " · "
WORKS = {True: "works", False: "fails", None: "not checked here"}


def _torch_row(torch: dict) -> str:
    if torch.get("probe_error"):
        return f"could not be read: {torch['probe_error']}"
    backends = [name for name in ("nccl", "gloo", "mpi") if torch.get(f"{name}_available")]
    nccl = f"NCCL {torch['nccl_version']}" if torch.get("nccl_version") else "no NCCL"
    return SEP.join([f"torch {torch.get('torch_version')}", nccl,
                     f"backends: {', '.join(backends) if backends else 'none'}"])


def _shm_row(shm: dict) -> str:
    if not shm.get("exists"):
        return "missing"
    size = format_bytes(shm["size_bytes"]) if shm.get("size_bytes") is not None else "size unknown"
    free = f" ({format_bytes(shm['free_bytes'])} free)" if shm.get("free_bytes") is not None else ""
    writable = {True: "writable", False: "NOT writable", None: "writability unknown"}[shm.get("writable")]
    return SEP.join([f"{size}{free}", f"mode {shm.get('mode')}", writable])


def _variables_row(variables: dict[str, str]) -> str:
    return "  ".join(f"{name}={value}" for name, value in variables.items()) or "none set"


def _infiniband_row(devices: list[dict]) -> str:
    if not devices:
        return "none"
    return "; ".join(f"{d['name']} port {p['port']}: {p.get('state') or '?'}"
                     + (f", {p['rate']}" if p.get("rate") else "") for d in devices for p in d["ports"]) \
        or ", ".join(d["name"] for d in devices)


def glance_rows(report: ReadinessReport) -> list[tuple[str, str]]:
    facts = report.facts
    host = facts["host"]
    view = gpu_view(facts)
    counts = Counter(view.names)  # eight identical boards read as "8 x NVIDIA A100", not eight times the name
    gpus = ", ".join(f"{count} x {name}" if count > 1 else name for name, count in counts.items())
    rows = [("torch", _torch_row(facts.get("torch") or {})),
            ("GPUs visible", f"{view.count}" + (f" ({gpus})" if view.names else "")
             + (SIMULATED_TEXT if view.simulated else "")),
            ("/dev/shm", _shm_row(host["shm"])),
            ("torchrun", _variables_row(host["variables"]["torchrun"])),
            ("NCCL_*", _variables_row(host["variables"]["nccl"])),
            ("InfiniBand", _infiniband_row(host["infiniband"])),
            ("interfaces", ", ".join(f"{i['name']} ({i.get('state') or '?'})" for i in host["interfaces"]) or "none")]
    if host["variables"]["debug"]:
        rows.append(("also set", _variables_row(host["variables"]["debug"])))
    return rows


def _launch_table(report: ReadinessReport) -> list[tuple[str, ...]]:
    return [("launch", "from here", "example", "why"),
            *((m.name, WORKS[m.works], m.example, m.why) for m in report.launches)]


def _topology(report: ReadinessReport) -> Topology:
    return Topology.from_dict(report.facts["topology"])


def render_text(report: ReadinessReport) -> str:
    lines = [f"{STATUS_MARK[report.status]} {report.verdict}" + (SIMULATED_TEXT if report.simulated else "")]
    lines.extend(rows_text(glance_rows(report)))
    topology = _topology(report)
    if topology.gpus:
        lines.append("")
        lines.append("Topology (like nvidia-smi topo -m):")
        lines.extend("  " + line for line in matrix_text(topology).splitlines())
    lines.append("")
    lines.append("How to launch one process per GPU:")
    lines.extend(table_text(_launch_table(report)))
    lines.extend(findings_text(report.findings))
    if report.bench is not None:
        lines.append("")
        lines.extend(str(report.bench).splitlines())
    if report.bench_error:
        lines.append("")
        lines.append(f"All-reduce: {report.bench_error}")
    lines.extend(["", NCCL_DEBUG_ADVICE])
    return "\n".join(lines)


def render_html(report: ReadinessReport) -> str:
    colour = COLOUR[report.status]
    parts = ['<div class="jupyter-gpu-distributed" style="font-family:var(--jp-ui-font-family,sans-serif);'
             'line-height:1.4">',
             f'<div style="font-weight:600;color:{colour};font-size:1.05em">{STATUS_MARK[report.status]} '
             f"{escape(report.verdict)}{SIMULATED_HTML if report.simulated else ''}</div>",
             rows_html(glance_rows(report))]
    topology = _topology(report)
    if topology.gpus:
        parts.append('<div style="margin-top:.4em;font-weight:600">Topology</div>')
        parts.append(matrix_html(topology))
    parts.append('<div style="margin-top:.4em;font-weight:600">How to launch one process per GPU</div>'
                 '<table style="font-size:.9em"><tr>'
                 + "".join(f'<th style="text-align:left">{escape(h)}</th>' for h in _launch_table(report)[0])
                 + "</tr>")
    for method in report.launches:
        mark = COLOUR["ok"] if method.works else COLOUR["fail"] if method.works is False else COLOUR["info"]
        parts.append(f'<tr><td style="text-align:left">{escape(method.name)}</td>'
                     f'<td style="text-align:left;color:{mark}">{escape(WORKS[method.works])}</td>'
                     f'<td style="text-align:left">{code_html(method.example)}</td>'
                     f'<td style="text-align:left">{escape(method.why)}</td></tr>')
    parts.append("</table>")
    parts.append(findings_html(report.findings))
    if report.bench is not None:
        parts.append(report.bench._repr_html_())
    if report.bench_error:
        parts.append(f'<div style="color:{COLOUR["fail"]}">All-reduce: {escape(report.bench_error)}</div>')
    parts.append(f"<div>{escape(NCCL_DEBUG_ADVICE)}</div>")
    parts.append("</div>")
    return "".join(parts)
