"""The topology matrix as `nvidia-smi topo -m` prints it, in text and in escaped HTML."""

from __future__ import annotations

import re

from fake_topology import nvlink_down, nvml_missing, nvswitch_box, pcie_pair, two_socket_box

from jupyter_gpu.distributed.nvml_topology import read_nvml_topology
from jupyter_gpu.distributed.simulated_topology import simulated_topology
from jupyter_gpu.distributed.topology_render import matrix_html, matrix_text


def cells(text: str) -> dict[tuple[str, str], str]:
    """(row, column) -> cell of the matrix at the top of `text`, read by column position like a person would."""
    lines = text.splitlines()
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"GPU\d+", header)]
    names = [header[s:].split()[0] for s in starts]
    found = {}
    for line in lines[1:]:
        if not re.match(r"GPU\d+ ", line):
            break  # the legend: the matrix has ended
        row = line.split()[0]
        for column, start, end in zip(names, starts, [*starts[1:], None], strict=True):
            found[(row, column)] = line[start:end].strip()
    return found


def test_an_nvswitch_box_prints_nv12_everywhere_and_x_on_the_diagonal():
    text = matrix_text(simulated_topology("a100x8-mig"))
    matrix = cells(text)
    assert len(matrix) == 64
    assert all(matrix[(f"GPU{i}", f"GPU{i}")] == "X" for i in range(8))
    assert {cell for (row, column), cell in matrix.items() if row != column} == {"NV12"}
    assert text.splitlines()[0].endswith("[simulated]")
    assert "NV# = a bonded set of # NVLink links" in text and "PHB" not in text
    assert text.count("NVLink 12/12 active, PCIe Gen4 x16") == 8
    assert "300 GB/s per GPU and direction (12 NVLink links x 25 GB/s (Ampere))" in text
    assert "source: simulated:a100x8-mig" in text


def test_a_pcie_pair_without_p2p_is_marked_in_the_cell_and_the_legend():
    text = matrix_text(read_nvml_topology(pcie_pair()))
    matrix = cells(text)
    assert matrix[("GPU0", "GPU1")] == matrix[("GPU1", "GPU0")] == "PHB, no P2P"
    legend = next(line for line in text.splitlines() if line.startswith("Legend: "))
    assert "PHB = PCIe and a PCIe host bridge" in legend and "no P2P = " in legend and "NV#" not in legend
    assert "no NVLink, PCIe Gen4 x16" in text and "31.5 GB/s" in text
    assert "simulated" not in text


def test_two_sockets_print_pix_and_sys():
    matrix = cells(matrix_text(read_nvml_topology(two_socket_box())))
    assert (matrix[("GPU0", "GPU1")], matrix[("GPU2", "GPU3")], matrix[("GPU1", "GPU2")]) == ("PIX", "PIX", "SYS")


def test_links_down_show_in_the_cells_and_the_gpu_line():
    text = matrix_text(read_nvml_topology(nvlink_down(gpu=3, down=(4, 7))))
    matrix = cells(text)
    assert matrix[("GPU3", "GPU5")] == "NV10" and matrix[("GPU0", "GPU1")] == "NV12"
    assert "NVLink 10/12 active" in text and "250 GB/s" in text


def test_an_unread_link_and_an_unread_level_are_shown_as_unread():
    nvml = nvswitch_box(2)
    nvml.boards[0].link_errors[5] = 999
    assert "NVLink 11/12 active (1 unread)" in matrix_text(read_nvml_topology(nvml))
    nvml = pcie_pair()
    nvml.ancestor_errors[(0, 1)] = 3
    nvml.boards[1].errors["pcie_width"] = 3
    text = matrix_text(read_nvml_topology(nvml))
    assert cells(text)[("GPU0", "GPU1")] == "?, no P2P" and "? = not read" in text
    assert "PCIe link not read" in text and "link peak  unknown" in text


def test_an_unread_topology_says_why():
    text = matrix_text(read_nvml_topology(nvml_missing()))
    assert text.startswith("Topology not read: NVML could not start: NVML Shared Library Not Found")
    assert "[simulated]" in matrix_text(simulated_topology("nodriver"))
    assert "NVML Shared Library Not Found" in matrix_html(read_nvml_topology(nvml_missing()))


def test_html_has_the_same_cells_and_escapes_names():
    nvml = pcie_pair()
    nvml.boards[0].name = "<script>alert(1)</script> & co"
    html = matrix_html(read_nvml_topology(nvml))
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; co" in html
    assert html.count(">PHB, no P2P</td>") == 2 and html.count(">X</td>") == 2
    assert "#b26a00" in html  # the cells without P2P are coloured as a warning
    assert "[simulated]" not in html
    simulated = matrix_html(simulated_topology("a100x8-mig"))
    assert "[simulated]" in simulated and simulated.count(">NV12</td>") == 56
