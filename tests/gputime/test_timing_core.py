"""The pure core of `%%gputime`: statistics, device rules, advice, rendering, compare, options, units."""

from __future__ import annotations

import IPython
import IPython.display
import pytest

from jupyter_gpu.gputime.advice import GpuAvailability, timing_findings
from jupyter_gpu.gputime.compare import Comparison, compare
from jupyter_gpu.gputime.ops import (
    DEVICE_TO_DEVICE,
    DEVICE_TO_HOST,
    HOST_TO_DEVICE,
    copy_direction,
    is_accelerator,
    op_device_type,
    sync_reason,
)
from jupyter_gpu.gputime.render import render_html, render_text
from jupyter_gpu.gputime.result import DeviceMemory, GpuBusy, GpuTimeResult, OpCounts
from jupyter_gpu.gputime.stats import summarize
from jupyter_gpu.models import Finding
from jupyter_gpu.options import (
    GPUTIME_VALUE_FLAGS,
    OptionsError,
    gputime_parser,
    split_magic_line,
    validate_gputime,
)
from jupyter_gpu.units import format_bytes, format_seconds

GPU = GpuAvailability(usable=True, devices=["cuda:0"])
NO_GPU = GpuAvailability(usable=False, reason="CPU-only wheel")
XSS = "<img src=x onerror=alert(1)>"


def ops(by_device: dict[str, int] | None = None, **fields: object) -> OpCounts:
    by_device = {"cuda": 100} if by_device is None else by_device
    return OpCounts(by_device=by_device, by_name={"aten::mm": sum(by_device.values())}, **fields)


def findings(**overrides: object) -> list[Finding]:
    arguments: dict[str, object] = {"first_time": 1.0, "stats": None, "ops": None, "availability": GPU,
                                    "busy": None, "throttle_reasons": [], "cuda_initialized_by_cell": False}
    arguments.update(overrides)
    return timing_findings(**arguments)


def codes(found: list[Finding]) -> list[str]:
    return [f.code for f in found]


def single(label: str = "cell", seconds: float = 0.001, **fields: object) -> GpuTimeResult:
    arguments: dict[str, object] = {"label": label, "times": [seconds], "gpu_times": [None], "first_time": seconds,
                                    "first_gpu_time": None}
    arguments.update(fields)
    return GpuTimeResult(**arguments)


def repeated(label: str = "cell", times: tuple[float, ...] = (0.001, 0.002, 0.003), **fields: object) -> GpuTimeResult:
    arguments: dict[str, object] = {"label": label, "times": list(times), "gpu_times": [None] * len(times),
                                    "first_time": 0.5, "first_gpu_time": None, "loops": 10,
                                    "repeat": len(times), "context": {"repeated": True}}
    arguments.update(fields)
    return GpuTimeResult(**arguments)


# --- stats -------------------------------------------------------------------------------------------------


def test_summary_of_known_data() -> None:
    stats = summarize([4.0, 1.0, 3.0, 2.0])
    assert (stats.n, stats.median, stats.minimum, stats.maximum, stats.mean) == (4, 2.5, 1.0, 4.0, 2.5)


@pytest.mark.parametrize(("times", "q1", "q3"), [
    ([1.0, 2.0, 3.0, 4.0], 1.75, 3.25),
    ([1.0, 2.0, 3.0, 4.0, 5.0], 2.0, 4.0),
    ([10.0, 20.0], 12.5, 17.5),
])
def test_quartiles_interpolate_linearly(times: list[float], q1: float, q3: float) -> None:
    stats = summarize(times)
    assert (stats.q1, stats.q3, stats.iqr) == pytest.approx((q1, q3, q3 - q1))


def test_single_run_has_zero_iqr() -> None:
    stats = summarize([0.7])
    assert (stats.q1, stats.q3, stats.iqr) == (0.7, 0.7, 0.0)


@pytest.mark.parametrize(("times", "large"), [
    ([1.0, 4.1], True),
    ([1.0, 4.0], False),      # exactly 4x is the limit, not over it
    ([1.0, 1.1, 1.2], False),
    ([5.0], False),           # one run has no spread
    ([0.0, 1.0], False),      # an unmeasurably short run gives no ratio
])
def test_spread_is_large_only_over_four_times(times: list[float], large: bool) -> None:
    assert summarize(times).spread_is_large is large


def test_empty_timings_raise() -> None:
    with pytest.raises(ValueError, match="No timings"):
        summarize([])


def test_stats_to_dict_has_derived_values() -> None:
    data = summarize([1.0, 2.0, 3.0, 4.0]).to_dict()
    assert data["iqr"] == pytest.approx(1.5)
    assert data["spread_ratio"] == pytest.approx(4.0)
    assert data["median"] == 2.5


# --- ops ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("inputs", "outputs", "expected"), [
    (("cuda:0", "cpu"), ("cuda:0",), "cuda"),   # CUDA add with a CPU scalar tensor runs on the GPU
    (("cpu", "cuda:1"), (), "cuda"),             # an accelerator input wins even when listed second
    (("cuda:0",), ("cpu",), "cuda"),             # `.cpu()` is GPU work
    ((), ("cuda:0",), "cuda"),                   # factory function: the output decides
    ((), ("cpu",), "cpu"),
    (("cpu",), ("cpu",), "cpu"),
    (("mps",), ("mps",), "mps"),
    ((), (), None),
])
def test_op_device_type(inputs: tuple[str, ...], outputs: tuple[str, ...], expected: str | None) -> None:
    assert op_device_type(inputs, outputs) == expected


@pytest.mark.parametrize(("source", "destination", "expected"), [
    ("cpu", "cuda:0", HOST_TO_DEVICE),
    ("cuda", "cpu", DEVICE_TO_HOST),
    ("cuda:0", "cuda:1", DEVICE_TO_DEVICE),
    ("cuda", "cuda:0", None),
    ("cuda:0", "cuda:0", None),
    ("cpu", "cpu", None),
    ("meta", "cuda:0", None),
    ("cpu", "meta", None),
    ("cuda:0", "meta", None),
])
def test_copy_direction(source: str, destination: str, expected: str | None) -> None:
    assert copy_direction(source, destination) == expected


def test_item_on_cuda_is_a_sync() -> None:
    assert sync_reason("_local_scalar_dense", ("cuda:0",)) == ".item() / float() / bool(tensor)"


def test_item_on_cpu_is_not_a_sync() -> None:
    assert sync_reason("_local_scalar_dense", ("cpu",)) is None


def test_blocking_device_to_host_copy_is_a_sync() -> None:
    assert sync_reason("_to_copy", ("cuda:0",), copy=DEVICE_TO_HOST) is not None


def test_non_blocking_device_to_host_copy_is_not_a_sync() -> None:
    assert sync_reason("_to_copy", ("cuda:0",), copy=DEVICE_TO_HOST, non_blocking=True) is None


def test_host_to_device_copy_is_not_a_sync() -> None:
    assert sync_reason("_to_copy", ("cpu",), copy=HOST_TO_DEVICE) is None


@pytest.mark.parametrize(("device", "accelerator"), [
    ("cuda:0", True), ("cuda", True), ("mps", True), ("xpu:1", True), ("cpu", False), ("meta", False),
])
def test_is_accelerator(device: str, accelerator: bool) -> None:
    assert is_accelerator(device) is accelerator


# --- advice ------------------------------------------------------------------------------------------------


def test_cpu_only_ops_with_usable_gpu_is_no_gpu_work() -> None:
    [finding] = findings(ops=ops({"cpu": 1234}))
    assert (finding.code, finding.severity) == ("NO_GPU_WORK", "warn")
    assert "1,234" in finding.headline and "cuda:0" in finding.headline
    fix = "\n".join(finding.fix)
    assert "model.to(device)" in fix and "pin_memory" in fix


def test_zero_ops_is_no_torch_work() -> None:
    [finding] = findings(ops=ops({}))
    assert (finding.code, finding.severity) == ("NO_TORCH_WORK", "info")


@pytest.mark.parametrize("by_device", [{"cpu": 50}, {}])
def test_no_device_finding_without_usable_gpu(by_device: dict[str, int]) -> None:
    assert findings(ops=ops(by_device), availability=NO_GPU) == []


def test_gpu_ops_give_no_device_finding() -> None:
    assert findings(ops=ops({"cuda": 10, "cpu": 90})) == []


@pytest.mark.parametrize(("blocked", "first_time", "copy_bound"), [
    (0.6, 1.0, True),
    (0.5, 1.0, False),        # half is not over half
    (0.0009, 0.001, False),   # 90% but under the 1 ms floor
    (0.002, 0.003, True),
])
def test_copy_bound_when_blocked_over_half_the_first_run(blocked: float, first_time: float, copy_bound: bool) -> None:
    found = findings(ops=ops(blocking_seconds=blocked, copies={HOST_TO_DEVICE: 3}), first_time=first_time)
    assert ("COPY_BOUND" in codes(found)) is copy_bound


def test_copy_bound_needs_accelerator_ops() -> None:
    found = findings(ops=ops({"cpu": 10}, blocking_seconds=0.9), availability=NO_GPU)
    assert "COPY_BOUND" not in codes(found)


@pytest.mark.parametrize(("syncs", "heavy"), [(10, True), (9, False)])
def test_sync_heavy_from_ten_waits(syncs: int, heavy: bool) -> None:
    found = findings(ops=ops(syncs={".item()": syncs}))
    assert ("SYNC_HEAVY" in codes(found)) is heavy


def test_copy_bound_replaces_sync_heavy() -> None:
    found = findings(ops=ops(syncs={".item()": 50}, blocking_seconds=0.9))
    assert "COPY_BOUND" in codes(found) and "SYNC_HEAVY" not in codes(found)


@pytest.mark.parametrize(("times", "large"), [([1.0, 5.0], True), ([1.0, 1.5], False)])
def test_large_spread_from_stats(times: list[float], large: bool) -> None:
    assert ("LARGE_SPREAD" in codes(findings(stats=summarize(times)))) is large


def test_throttling_lists_reasons() -> None:
    [finding] = findings(throttle_reasons=["hw_slowdown", "sw_power_cap"])
    assert (finding.code, finding.severity) == ("GPU_THROTTLED", "warn")
    assert finding.evidence["throttle reasons"] == "hw_slowdown, sw_power_cap"


def test_mostly_idle_gpu_headline() -> None:
    [finding] = findings(ops=ops(), busy=GpuBusy(percent=23.0, samples=12, devices=["cuda:0"]))
    assert finding.code == "GPU_MOSTLY_IDLE"
    assert finding.headline == "GPU busy 23% of the cell: input pipeline or host-bound."


def test_busy_gpu_is_not_idle() -> None:
    assert findings(ops=ops(), busy=GpuBusy(percent=85.0, samples=12, devices=["cuda:0"])) == []


def test_idle_needs_accelerator_ops() -> None:
    found = findings(ops=ops({"cpu": 5}), availability=NO_GPU, busy=GpuBusy(percent=3.0, samples=5, devices=["0"]))
    assert "GPU_MOSTLY_IDLE" not in codes(found)


def test_cuda_initialised_by_cell_is_info() -> None:
    [finding] = findings(cuda_initialized_by_cell=True, first_time=1.5)
    assert (finding.code, finding.severity) == ("CUDA_INITIALIZED_BY_CELL", "info")
    assert finding.evidence["first run"] == "1.50 s"


def test_findings_ordered_warn_before_info() -> None:
    found = findings(ops=ops(syncs={".item()": 20}), stats=summarize([1.0, 9.0]), cuda_initialized_by_cell=True)
    assert codes(found) == ["LARGE_SPREAD", "SYNC_HEAVY", "CUDA_INITIALIZED_BY_CELL"]
    assert [f.severity for f in found] == ["warn", "info", "info"]


# --- result and render -------------------------------------------------------------------------------------


def test_single_run_text() -> None:
    text = render_text(single(seconds=0.00123))
    assert "1.23 ms wall (1 run, synchronised)" in text
    assert "median" not in text and "first run" not in text


def test_repeated_text() -> None:
    text = render_text(repeated(times=(0.001, 0.002, 0.003, 0.004), loops=10))
    assert "2.50 ms median, min 1.00 ms, IQR 1.50 ms, n=4 runs × 10 loops" in text
    assert "first run" in text and "500 ms" in text


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


# --- compare -----------------------------------------------------------------------------------------------


def test_speedups_are_baseline_median_over_median() -> None:
    table = Comparison([single("slow", 0.004), single("fast", 0.002), single("slower", 0.008)])
    assert table.speedups == pytest.approx([1.0, 2.0, 0.5])


def test_speedup_text() -> None:
    rows = Comparison([single("slow", 0.004), single("fast", 0.002), single("slower", 0.008)]).rows()
    assert [row[-1] for row in rows] == ["baseline", "2.00x faster", "2.00x slower"]


def test_other_baseline() -> None:
    table = Comparison([single("slow", 0.004), single("fast", 0.002)], baseline=1)
    assert table.speedups == pytest.approx([0.5, 1.0])
    assert [row[-1] for row in table.rows()] == ["2.00x slower", "baseline"]


def test_labels_default_to_result_labels() -> None:
    table = Comparison([single("eager", 0.004), single("compiled", 0.002)])
    assert table.labels == ["eager", "compiled"]
    assert [row[0] for row in table.rows()] == ["eager", "compiled"]


def test_given_labels_win() -> None:
    rows = Comparison([single("a"), single("b")], labels=["before", "after"]).rows()
    assert [row[0] for row in rows] == ["before", "after"]


@pytest.mark.parametrize(("arguments", "error", "message"), [
    ({"results": [single(), single()], "labels": ["only one"]}, ValueError, "1 labels for 2 results"),
    ({"results": [single(), single()], "baseline": 2}, ValueError, "baseline must be an index from 0 to 1"),
    ({"results": [single()], "baseline": -1}, ValueError, "baseline must be an index from 0 to 0"),
    ({"results": [single(), 0.5]}, TypeError, "not float"),
    ({"results": []}, ValueError, "at least one GpuTimeResult"),
])
def test_bad_comparison_raises(arguments: dict[str, object], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        Comparison(**arguments)


def test_zero_median_baseline_does_not_crash() -> None:
    # A baseline too short for the clock (median 0) cannot give a ratio: the row shows "-", not an exception.
    rows = Comparison([single("noop", 0.0), single("work", 0.002)]).rows()
    assert rows[1][-1] == "-"


def test_comparison_text_table() -> None:
    text = str(Comparison([single("eager", 0.004), single("compiled", 0.002, gpu_times=[0.0015])]))
    lines = text.splitlines()
    assert lines[0].split() == ["median", "min", "IQR", "n", "GPU", "median", "speed-up"]
    assert lines[2].split()[0] == "eager" and lines[2].endswith("baseline")
    assert "1.50 ms" in lines[3] and lines[3].endswith("2.00x faster")


def test_comparison_html_escapes_labels() -> None:
    html = Comparison([single(), single()], labels=[XSS, "b"])._repr_html_()
    assert XSS not in html and "&lt;img src=x onerror=alert(1)&gt;" in html


def test_compare_outside_ipython_prints_table(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)  # another test module may have started a shell
    compare(single("eager", 0.004), single("compiled", 0.002))
    out = capsys.readouterr().out
    assert "eager" in out and "compiled" in out and "2.00x faster" in out


def test_compare_in_ipython_displays_table(monkeypatch: pytest.MonkeyPatch) -> None:
    shown: list[object] = []
    monkeypatch.setattr(IPython, "get_ipython", lambda: object())
    monkeypatch.setattr(IPython.display, "display", shown.append)
    compare(single("eager", 0.004), single("compiled", 0.002), labels=["a", "b"], baseline=1)
    [table] = shown
    assert isinstance(table, Comparison) and table.labels == ["a", "b"] and table.baseline == 1


# --- options -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "tokens", "statement"), [
    ("-n 10 -r 3 x = a - b", ["-n", "10", "-r", "3"], "x = a - b"),
    ("-n 3 -- -x + 1", ["-n", "3"], "-x + 1"),
    ("-n10 -q y = f(x)", ["-n10", "-q"], "y = f(x)"),
    ("-1 + x", [], "-1 + x"),
    ("-n 2 -.5 * x", ["-n", "2"], "-.5 * x"),
    ("-l fast model(x)", ["-l", "fast"], "model(x)"),
    ("--label=fast model(x)", ["--label=fast"], "model(x)"),
    ("-o print('a  -n 3',  \"b\")", ["-o"], "print('a  -n 3',  \"b\")"),
    ("  x @ y  ", [], "x @ y"),
    ("-n 5 -o", ["-n", "5", "-o"], ""),
    ("", [], ""),
])
def test_split_magic_line(line: str, tokens: list[str], statement: str) -> None:
    assert split_magic_line(line, GPUTIME_VALUE_FLAGS) == (tokens, statement)


def parse(*argv: str) -> object:
    options = gputime_parser().parse_args(list(argv))
    validate_gputime(options)
    return options


def test_parser_reads_flags() -> None:
    options = parse("-n", "10", "-r", "3", "-w", "2", "-l", "fast", "-o", "--no-ops")
    assert (options.loops, options.repeat, options.warmup, options.label) == (10, 3, 2, "fast")
    assert options.return_result and not options.count_ops


def test_parser_reads_attached_value() -> None:
    assert parse("-n10").loops == 10


def test_auto_with_budget() -> None:
    options = parse("--auto", "--budget", "0.5")
    assert options.auto and options.budget == 0.5


@pytest.mark.parametrize(("argv", "message"), [
    (["-n", "0"], "-n must be at least 1"),
    (["-r", "0"], "-r must be at least 1"),
    (["-w", "-1"], "-w must be at least 0"),
    (["-n", "ten"], "-n needs a whole number"),
    (["--auto", "--budget", "0"], "--budget must be a positive number"),
    (["--budget", "2"], "add --auto"),
    (["--auto", "-n", "5"], "cannot be combined with -n"),
    (["--bogus"], "nrecognized arguments"),
])
def test_bad_options_raise(argv: list[str], message: str) -> None:
    with pytest.raises(OptionsError, match=message):
        parse(*argv)


# --- units -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("seconds", "text"), [
    (0.00123, "1.23 ms"),
    (1.5, "1.50 s"),
    (2.5e-7, "250 ns"),
    (1.5e-5, "15.0 µs"),
    (12.3, "12.3 s"),
    (None, "n/a"),
    (90.0, "1 min 30.0 s"),
    (3725.5, "62 min 5.5 s"),
])
def test_format_seconds(seconds: float | None, text: str) -> None:
    assert format_seconds(seconds) == text


@pytest.mark.parametrize(("seconds", "text"), [
    (0.0009999, "1.00 ms"),      # not "1000 µs"
    (0.9999, "1.00 s"),          # not "1000 ms"
    (119.99, "2 min 0.0 s"),     # not "1 min 60.0 s"
])
def test_format_seconds_rounding_moves_to_the_next_unit(seconds: float, text: str) -> None:
    assert format_seconds(seconds) == text


@pytest.mark.parametrize(("count", "text"), [
    (0, "0 B"),
    (1023, "1023 B"),
    (1536, "1.5 KiB"),
    (3 << 20, "3.0 MiB"),
    (1 << 30, "1.0 GiB"),
    (-1536, "-1.5 KiB"),
    (-(512 << 20), "-512.0 MiB"),
    (None, "n/a"),
])
def test_format_bytes(count: int | None, text: str) -> None:
    assert format_bytes(count) == text
