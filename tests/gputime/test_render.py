"""`GpuTimeResult` and its text and HTML (every value escaped)."""

from __future__ import annotations

import pytest
from timing_results import XSS, repeated, single

from jupyter_gpu.gputime.render import render_html, render_text
from jupyter_gpu.gputime.result import GpuBusy, GpuTimeResult, OpCounts
from jupyter_gpu.models import Finding
from jupyter_gpu.probekit.device_memory import DeviceMemory


def test_single_run_text() -> None:
    text = render_text(single(seconds=0.00123))
    assert "1.23 ms wall (1 run, synchronised)" in text
    assert "median" not in text and "first run" not in text


def test_repeated_text() -> None:
    text = render_text(repeated(times=(0.001, 0.002, 0.003, 0.004), loops=10))
    assert "2.50 ms median, min 1.00 ms, IQR 1.50 ms, n=4 runs × 10 loops" in text
    assert "first run" in text and "500 ms" in text


def test_one_timed_run_of_several_loops_gives_its_mean_per_loop_not_a_spread_of_one() -> None:
    # %%gputime -n 5: one run of 5 loops; "median, min, IQR 0 s" would claim a spread it never measured.
    text = render_text(repeated(times=(0.0331,), loops=5))
    assert "33.1 ms per loop, 1 run × 5 loops (wall, synchronised; one run has no spread: add -r N)" in text
    assert "IQR" not in text and "median" not in text.split("first run")[0]


def test_gpu_times_shown_when_measured() -> None:
    result = repeated(times=(0.001, 0.002, 0.003), gpu_times=[0.0005, 0.0006, 0.0007])
    assert "GPU 600 µs median (CUDA events)" in render_text(result)


def test_no_gpu_times_no_gpu_clock() -> None:
    assert "CUDA events" not in render_text(repeated())


def test_memory_rows() -> None:
    gib, mib = 1 << 30, 1 << 20
    memory = [DeviceMemory("cuda:0", peak_allocated=2 * gib, peak_reserved=3 * gib,
                           allocated_before=gib, allocated_after=2 * gib),
              DeviceMemory("cuda:1", peak_allocated=mib, peak_reserved=2 * mib,
                           allocated_before=512 * mib, allocated_after=0)]
    text = render_text(single(memory=memory))
    assert "peak 2.0 GiB allocated, 3.0 GiB reserved; allocated +1.0 GiB after the cell" in text
    assert "peak 1.0 MiB allocated, 2.0 MiB reserved; allocated -512.0 MiB after the cell" in text


def test_simulated_label() -> None:
    assert "[simulated]" in render_text(single(context={"simulated": True}))
    assert "[simulated]" in render_html(single(context={"simulated": True}))
    assert "[simulated]" not in render_text(single())


def test_findings_rendered_in_text() -> None:
    finding = Finding("GPU_MOSTLY_IDLE", "warn", "GPU busy 23% of the cell.", fix=["use bigger batches"])
    text = render_text(single(findings=[finding]))
    assert "[warn] GPU_MOSTLY_IDLE: GPU busy 23% of the cell." in text and "use bigger batches" in text


@pytest.mark.parametrize("result", [
    single(label=XSS),
    single(findings=[Finding("X", "warn", XSS, evidence={"where": XSS}, fix=[XSS])]),
    single(busy=GpuBusy(percent=40.0, samples=3, devices=[XSS])),
    single(busy_note=XSS),
    single(ops_note=XSS),
    single(memory=[DeviceMemory(XSS, 1, 1, 0, 1)]),
], ids=["label", "finding", "busy-device", "busy-note", "ops-note", "memory-device"])
def test_html_escapes_every_value(result: GpuTimeResult) -> None:
    html = render_html(result)
    assert XSS not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


@pytest.mark.parametrize(("result", "expected"), [
    (repeated(label="mm", times=(0.001, 0.002, 0.003)), "<GpuTimeResult: mm: 2.00 ms median, n=3>"),
    (single(label="mm", seconds=0.5), "<GpuTimeResult: mm: 500 ms wall, n=1>"),
])
def test_repr(result: GpuTimeResult, expected: str) -> None:
    assert repr(result) == expected


def test_result_statistics() -> None:
    result = repeated(times=(0.003, 0.001, 0.002), gpu_times=[None, 0.0004, None])
    assert (result.median, result.best, result.n, result.gpu_median) == (0.002, 0.001, 3, 0.0004)


def test_op_counts_properties() -> None:
    counts = OpCounts(by_device={"cuda": 7, "cpu": 3, "meta": 2}, by_name={"mm": 5, "add": 5, "sum": 2},
                      syncs={".item()": 2, "print": 1})
    assert (counts.total, counts.accelerator_ops, counts.sync_count) == (12, 7, 3)
    assert counts.top_ops == [("add", 5), ("mm", 5), ("sum", 2)]


def test_device_memory_delta_in_dict() -> None:
    assert DeviceMemory("cuda:0", 10, 20, 8, 3).to_dict()["allocated_delta"] == -5
