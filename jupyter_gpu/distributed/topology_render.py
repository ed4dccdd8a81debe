"""The GPU topology as `nvidia-smi topo -m` prints it, in text and escaped HTML: GPU0..GPUn columns, X on the
diagonal, NV12/PIX/PHB/SYS cells marked where P2P is not possible, a legend for the codes used, and one line
per GPU with its NVLink and PCIe links and the link peak an all-reduce is measured against.
"""

from __future__ import annotations

from html import escape

from jupyter_gpu.distributed.links import GB
from jupyter_gpu.distributed.topology import Topology
from jupyter_gpu.rendering.kit import COLOUR, SIMULATED_HTML, SIMULATED_TEXT, rows_html, rows_text, table_text
from jupyter_gpu.rendering.units import format_rate

SELF = "X"
NO_P2P = "no P2P"
# nvidia-smi's legend, in its order.
LEGEND: dict[str, str] = {
    SELF: "self",
    "SYS": "PCIe and the interconnect between NUMA nodes (QPI/UPI)",
    "NODE": "PCIe and the interconnect between PCIe host bridges within a NUMA node",
    "PHB": "PCIe and a PCIe host bridge (typically the CPU)",
    "PXB": "multiple PCIe bridges, without a host bridge",
    "PIX": "at most a single PCIe bridge",
    "NV#": "a bonded set of # NVLink links",
    NO_P2P: "NVML reports no peer-to-peer read or write",
    "?": "not read",
}


def _cell(topology: Topology, a: int, b: int) -> str:
    if a == b:
        return SELF
    pair = topology.pair(a, b)
    if pair is None:
        return "?"
    level = pair.level or "?"
    return f"{level}, {NO_P2P}" if pair.p2p_copy_broken else level


def _matrix(topology: Topology) -> list[tuple[str, ...]]:
    indices = [gpu.index for gpu in topology.gpus]
    return [("", *(f"GPU{i}" for i in indices)),
            *((f"GPU{a}", *(_cell(topology, a, b) for b in indices)) for a in indices)]


def _legend(matrix: list[tuple[str, ...]]) -> str:
    used = set()
    for row in matrix[1:]:
        for cell in row[1:]:
            level, _, mark = cell.partition(", ")
            used.add("NV#" if level.startswith("NV") else level)
            if mark:
                used.add(mark)
    return "Legend: " + "; ".join(f"{code} = {text}" for code, text in LEGEND.items() if code in used)


def _gpu_rows(topology: Topology) -> list[tuple[str, str]]:
    rows = []
    for gpu in topology.gpus:
        if gpu.nvlinks:
            unknown = sum(1 for link in gpu.nvlinks if link.active is None)
            nvlink = f"NVLink {gpu.active_nvlinks}/{len(gpu.nvlinks)} active" + (
                f" ({unknown} unread)" if unknown else "")
        else:
            nvlink = "no NVLink"
        pcie = (f"PCIe Gen{gpu.pcie_generation} x{gpu.pcie_width}"
                if gpu.pcie_generation and gpu.pcie_width else "PCIe link not read")
        rows.append((f"GPU{gpu.index}", ", ".join(part for part in (gpu.name or "unnamed GPU", nvlink, pcie,
                                                                    gpu.bus_id) if part)))
    peak = topology.link_peak()
    if peak is not None:
        rows.append(("link peak", f"{format_rate(peak.bytes_per_s / GB)} GB/s per GPU and direction "
                                  f"({peak.description}): what all-reduce bus bandwidth is compared against"))
    elif len(topology.gpus) >= 2:
        rows.append(("link peak", "unknown (a link's generation, width or NVLink rate was not read)"))
    return rows


def _source(topology: Topology) -> str:
    return f"source: {topology.source}" + ("" if not topology.simulated else ", not this machine's GPUs")


def matrix_text(topology: Topology) -> str:
    label = SIMULATED_TEXT if topology.simulated else ""
    if topology.status != "ok":
        return f"Topology not read: {topology.message or topology.status}{label}"
    if not topology.gpus:
        return f"No GPU found ({_source(topology)}){label}"
    matrix = _matrix(topology)
    lines = table_text(matrix)
    lines[0] += label
    lines.append(_legend(matrix))
    lines.extend(rows_text(_gpu_rows(topology)))
    if topology.simulated:
        lines.append(_source(topology))
    # The kit indents its tables for a report; this block is placed (and indented) by its caller.
    return "\n".join(line.removeprefix("  ") for line in lines)


def matrix_html(topology: Topology) -> str:
    label = SIMULATED_HTML if topology.simulated else ""
    if topology.status != "ok":
        return f"<div>Topology not read: {escape(topology.message or topology.status)}{label}</div>"
    if not topology.gpus:
        return f"<div>No GPU found ({escape(_source(topology))}){label}</div>"
    matrix = _matrix(topology)
    head = "".join(f'<th style="text-align:center;padding:0 .6em">{escape(h)}</th>' for h in matrix[0])
    body = []
    for row in matrix[1:]:
        cells = [f'<th style="text-align:left;padding-right:.6em">{escape(row[0])}</th>']
        for cell in row[1:]:
            colour = f";color:{COLOUR['warn']}" if NO_P2P in cell else ""
            style = f"text-align:center;padding:0 .6em{colour}"
            cells.append(f'<td style="{style}">{escape(cell)}</td>')
        body.append(f"<tr>{''.join(cells)}</tr>")
    parts = [f'<div class="jupyter-gpu-topology">{label}',
             f'<table style="font-family:var(--jp-code-font-family,monospace);font-size:.9em">'
             f"<tr>{head}</tr>{''.join(body)}</table>",
             f'<div style="font-size:.85em;opacity:.8">{escape(_legend(matrix))}</div>',
             rows_html(_gpu_rows(topology))]
    if topology.simulated:
        parts.append(f'<div style="font-size:.85em;opacity:.8">{escape(_source(topology))}</div>')
    parts.append("</div>")
    return "".join(parts)
