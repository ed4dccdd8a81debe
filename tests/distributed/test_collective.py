"""The all-reduce result: nccl-tests' bandwidth formulas, the ratio to a link's peak, the wrong-count verdict, the
size syntax, and the text and escaped HTML a user reads."""

from __future__ import annotations

import json

import pytest

from jupyter_gpu.distributed.collective import (
    DEFAULT_SIZES,
    MIB,
    AllReduceResult,
    PeerCopy,
    SizeResult,
    bandwidths,
    parse_sizes,
)
from jupyter_gpu.distributed.links import nvlink_peak, pcie_peak

A100_PEAK = nvlink_peak(12, "ampere")  # 300 GB/s per GPU and direction


def row(size: int, time_s: float, world: int, wrong: int = 0, peak=None) -> SizeResult:
    return SizeResult.measured(size_bytes=size, elements=size // 4, dtype="float32", iterations=5, time_s=time_s,
                               wrong=wrong, world_size=world, peak=peak)


def result(rows, *, world: int = 8, backend: str = "nccl", p2p=(), peak=A100_PEAK, devices=None, **extra):
    devices = devices or tuple(f"cuda:{i} NVIDIA A100-SXM4-80GB" for i in range(world))
    return AllReduceResult(backend=backend, world_size=world, devices=devices, rows=tuple(rows), p2p=tuple(p2p),
                           peak=peak, init_s=2.5, wall_s=9.0, **extra)


@pytest.mark.parametrize(("world", "factor"), [(2, 1.0), (4, 1.5), (8, 1.75)])
def test_bus_bandwidth_is_algorithm_bandwidth_times_2_n_minus_1_over_n(world, factor):
    algbw, busbw = bandwidths(64 * MIB, 0.001, world)
    assert algbw == pytest.approx(64 * MIB / 0.001)
    assert busbw == pytest.approx(algbw * factor)


def test_one_process_has_no_bus_bandwidth_and_says_so():
    single = result([row(MIB, 0.001, 1)], world=1)
    assert single.rows[0].algbw > 0 and single.rows[0].busbw == 0
    assert single.rows[0].ratio is None  # 0 % of a link no data crosses would read as a broken link
    text = str(single)
    assert "one process, so no bus bandwidth" in text.splitlines()[0]
    assert "bus bandwidth is 0 by nccl-tests' formula" in text


def test_ratio_to_the_links_peak_is_shown_as_a_percentage():
    # 8 ranks, 64 MiB in 0.4 ms: algbw 167.8 GB/s, busbw 293.6 GB/s = 97.9 % of 12 NVLink links x 25 GB/s.
    measured = row(64 * MIB, 0.0004, 8, peak=A100_PEAK)
    assert measured.busbw == pytest.approx(64 * MIB / 0.0004 * 1.75)
    assert measured.ratio == pytest.approx(measured.busbw / 300e9)
    text = str(result([measured]))
    assert "12 NVLink links x 25 GB/s (Ampere) = 300 GB/s per GPU and direction" in text
    line = next(line for line in text.splitlines() if line.strip().startswith("64.0 MiB"))
    assert line.split()[-3:] == ["293.60", "0", "97.9"]  # busbw, #wrong, % of peak
    pcie = row(64 * MIB, 0.01, 2, peak=pcie_peak(4, 16))
    assert pcie.ratio == pytest.approx(64 * MIB / 0.01 / (1.969e9 * 16))


def test_all_correct_verdict_names_the_largest_sizes_bus_bandwidth():
    rows = [row(size, size / 1e9, 2) for size in DEFAULT_SIZES]  # algbw = busbw = 1 GB/s at every size
    good = result(rows, world=2, backend="gloo", peak=None, devices=("cpu", "cpu"))
    assert good.ok and good.status == "ok" and good.exit_code == 0
    assert good.verdict == "all 8 sizes correct; busbw 1 GB/s at 16.0 MiB"
    text = str(good)
    assert text.startswith("✓ all-reduce: all 8 sizes correct")
    assert "gloo, 2 processes (cpu)" in text
    assert "not compared: gloo reduces through the CPU" in text
    assert "Fix:" not in text
    assert repr(good) == "<AllReduceResult: all 8 sizes correct; busbw 1 GB/s at 16.0 MiB>"


def test_wrong_elements_fail_with_the_count_the_size_and_the_p2p_fix():
    rows = [row(MIB, 0.001, 2), row(64 * MIB, 0.01, 2, wrong=1024), row(128 * MIB, 0.02, 2, wrong=7)]
    bad = result(rows, world=2)
    assert not bad.ok and bad.status == "fail" and bad.exit_code == 1
    # Every rank's elements are checked: 2 ranks x 16,777,216 elements at 64 MiB.
    assert bad.verdict == "WRONG: 1,024 of 33,554,432 elements wrong at 64.0 MiB (and at 1 more size)"
    text = str(bad)
    assert text.startswith("✗ all-reduce: WRONG: 1,024 of 33,554,432")
    assert "NCCL_P2P_DISABLE=1 jupyter-gpu allreduce" in text
    assert "NCCL_DEBUG=WARN jupyter-gpu allreduce" in text
    assert "#wrong" in text


def test_a_p2p_copy_that_returned_zeros_fails_the_result():
    copies = [PeerCopy("cuda:0", "cuda:1", 64 * MIB, 0, 40e9), PeerCopy("cuda:1", "cuda:0", 64 * MIB, 16 * MIB, 40e9)]
    bad = result([row(MIB, 0.001, 2)], world=2, p2p=copies)
    assert not bad.ok
    assert bad.verdict == "WRONG: the copy cuda:1 -> cuda:0 returned 16,777,216 of 16,777,216 elements wrong"
    text = str(bad)
    assert "cuda:0 -> cuda:1" in text and "40.00" in text
    assert "NCCL_P2P_DISABLE=1 jupyter-gpu allreduce" in text
    good = result([row(MIB, 0.001, 2)], world=2, p2p=copies[:1])
    assert good.ok and good.verdict.startswith("the one size correct, 1 P2P copy correct; busbw")


def test_html_escapes_every_name_and_marks_wrong_counts():
    devices = ("cuda:0 <script>alert(1)</script>", "cuda:1 A&B")
    bad = result([row(MIB, 0.001, 2, wrong=3)], world=2, devices=devices, notes=("<b>note</b>",))
    html = bad._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "A&amp;B" in html and "&lt;b&gt;note&lt;/b&gt;" in html
    assert "#c62828" in html  # the fail colour, on the verdict and the non-zero #wrong cell
    assert "NCCL_P2P_DISABLE=1 jupyter-gpu allreduce" in html


def test_simulated_results_and_peaks_are_labelled():
    simulated = result([row(MIB, 0.001, 2)], world=2, peak=nvlink_peak(12, "ampere", simulated=True), simulated=True)
    text = str(simulated)
    assert text.splitlines()[0].endswith("[simulated]")
    assert "per GPU and direction [simulated]" in text
    assert "[simulated]" in simulated._repr_html_()


def test_to_dict_is_json_with_the_figures_and_the_verdict():
    data = json.loads(json.dumps(result([row(MIB, 0.001, 4, wrong=2, peak=A100_PEAK)], world=4).to_dict()))
    assert data["ok"] is False and data["verdict"].startswith("WRONG: 2 of 1,048,576")
    assert data["rows"][0]["busbw"] == pytest.approx(MIB / 0.001 * 1.5)
    assert data["peak"]["kind"] == "nvlink" and len(data["devices"]) == 4


def test_sizes_are_lists_or_ranges_with_binary_k_m_g():
    assert parse_sizes("1K,64K,16M") == [1024, 65536, 16 * MIB]
    assert parse_sizes("8:64M")[:3] == [8, 16, 32] and parse_sizes("8:64M")[-1] == 64 * MIB
    assert len(parse_sizes("8:64M")) == 24
    assert tuple(parse_sizes("1K:16M:4")) == DEFAULT_SIZES
    assert parse_sizes("64MB") == [64_000_000]  # SI when written so, as everywhere else in jupyter-gpu
    assert parse_sizes("1.5K, 2MiB") == [1536, 2 * MIB]


@pytest.mark.parametrize(("text", "message"), [
    ("1X", "'1X' is not a size"),
    ("64M:8", "ends below where it starts"),
    ("8:64M:1", "factor must be a whole number of at least 2"),
    ("1:2:3:4", "is not a size range"),
    (",", "no sizes given"),
    ("0", "'0' is not a size"),
])
def test_bad_sizes_are_one_sentence(text, message):
    with pytest.raises(ValueError, match=message):
        parse_sizes(text)
