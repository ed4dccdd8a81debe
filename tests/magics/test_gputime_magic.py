"""%%gputime and %gputime in a real IPython shell, timing real work (sleeps, PyTorch on the CPU)."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from jupyter_gpu.gputime.compiled import LOOP_COUNT, LOOP_INDEX
from jupyter_gpu.metrics.sampler import THREAD_NAME

# Every test here times real work (sleeps of known length) and checks the figures: they run alone.
pytestmark = pytest.mark.timing

# Sleeps overshoot on a loaded CI machine, never undershoot: the upper tolerance is generous.
SLEEP_SLACK = 0.04


def cell(ip, line: str, body: str):
    """Run `%%gputime line` with `body` and return the GpuTimeResult (-o), failing on any error."""
    outcome = ip.run_cell(f"%%gputime -o {line}\n{body}")
    outcome.raise_error()
    return outcome.result


def findings(result) -> dict[str, object]:
    return {f.code: f for f in result.findings}


def no_sampler_thread() -> bool:
    return not [t for t in threading.enumerate() if t.name == THREAD_NAME]


def test_single_run_times_a_known_sleep_like_time(ip):
    ip.run_cell("import time")
    with capture_output() as captured:
        outcome = ip.run_cell("%%gputime\ntime.sleep(0.05)\nanswer = 42\nanswer + 1")
    outcome.raise_error()
    assert outcome.result == 43  # the last expression is the cell's value, as with %%time
    assert ip.user_ns["answer"] == 42
    shown = captured.outputs[0].data
    assert "wall (1 run, synchronised)" in shown["text/plain"]
    assert "jupyter-gpu-time" in shown["text/html"]

    result = cell(ip, "", "time.sleep(0.05)")
    assert len(result.times) == 1 and result.n == 1
    assert 0.05 <= result.median <= 0.05 + SLEEP_SLACK
    assert result.first_time == result.times[0]  # the single run is the first run
    assert result.gpu_times == [None]  # no CUDA clock on a machine without a GPU
    assert not result.repeated


def test_repeats_report_first_run_apart_and_each_run_is_timed(ip):
    ip.run_cell("import time\nruns = 0")
    result = cell(ip, "-n 3 -r 4", "runs += 1\ntime.sleep(0.02)")
    assert ip.user_ns["runs"] == 1 + 3 * 4  # first run, then 4 repeats of 3 loops
    assert result.loops == 3 and result.repeat == 4 and len(result.times) == 4
    assert all(0.02 <= t <= 0.02 + SLEEP_SLACK for t in result.times)
    assert 0.02 <= result.first_time <= 0.02 + SLEEP_SLACK
    assert result.stats.minimum <= result.median <= result.stats.maximum
    text = str(result)
    assert "median" in text and "IQR" in text and "n=4 runs × 3 loops" in text and "first run" in text
    assert LOOP_COUNT not in ip.user_ns and LOOP_INDEX not in ip.user_ns


def test_warmup_runs_are_run_but_not_counted(ip):
    ip.run_cell("runs = 0")
    result = cell(ip, "-w 2 -r 3", "runs += 1")
    assert ip.user_ns["runs"] == 1 + 2 + 3
    assert len(result.times) == 3 and result.warmup == 2
    assert "2 warm-up runs not counted" in str(result)


def test_first_run_is_reported_apart_from_the_steady_state(ip):
    # A cell whose first execution is slow (like compile or cuDNN autotuning) must not move the median.
    ip.run_cell("import time\nseen = 0")
    result = cell(ip, "-n 2 -r 3", "seen += 1\ntime.sleep(0.2 if seen == 1 else 0.005)")
    assert result.first_time >= 0.2
    assert result.median <= 0.005 + SLEEP_SLACK / 2


def test_auto_spends_about_the_budget_on_timed_runs(ip):
    ip.run_cell("import time")
    result = ip.run_line_magic("gputime", "--auto --budget 0.4 -q -o time.sleep(0.004)")
    timed = sum(result.times) * result.loops
    assert result.repeat == 7 and result.loops >= 5
    assert 0.2 <= timed <= 0.8
    assert all(0.004 <= t <= 0.004 + SLEEP_SLACK for t in result.times)


def test_line_magic_keeps_the_statement_verbatim(ip):
    ip.run_cell("a, b = 10, 3")
    result = ip.run_line_magic("gputime", "-q -o difference = a - b")
    assert ip.user_ns["difference"] == 7
    assert result.label == "difference = a - b"


def test_namespace_effects_are_kept(ip):
    cell(ip, "-q", "def helper(x):\n    return x * 2\nvalue = helper(21)\nimport math")
    assert ip.user_ns["value"] == 42 and ip.user_ns["helper"](1) == 2 and "math" in ip.user_ns
    cell(ip, "-q -n 5 -r 2", "value += 1")
    assert ip.user_ns["value"] == 42 + 1 + 10


def test_operators_counted_per_device_on_real_cpu_work(ip):
    ip.run_cell("import torch\nmodel = torch.nn.Linear(64, 32)\nx = torch.randn(128, 64)")
    result = cell(ip, "", "loss = model(x).relu().sum()\nloss.backward()\nvalue = loss.item()")
    ops = result.ops
    assert set(result.ops_by_device) == {"cpu"}
    assert result.ops_by_device["cpu"] == ops.total >= 8  # addmm, relu, sum, item, and the backward ops
    names = dict(ops.top_ops)
    assert {"addmm", "relu", "sum", "_local_scalar_dense"} <= set(names)
    assert ops.copies == {} and ops.syncs == {}  # .item() on a CPU tensor waits for nothing
    assert ops.cpu_bytes_allocated >= 128 * 32 * 4  # the activations, at least
    assert ops.overhead_seconds is not None and ops.overhead_seconds > 0
    assert "counting added ≈" in str(result)
    assert not torch.cuda.is_initialized()


def test_timed_runs_run_without_the_counter(ip):
    # The counted run is the first one only; every timed run executes with no dispatch mode active.
    ip.run_cell("import torch\nmodes = []")
    cell(ip, "-q -n 2 -r 3 -w 1", "modes.append(torch._C._len_torch_dispatch_stack())\ntorch.ones(2) + 1")
    assert ip.user_ns["modes"][0] == 1
    assert ip.user_ns["modes"][1:] == [0] * (1 + 2 * 3)


def test_no_ops_skips_counting(ip):
    ip.run_cell("import torch")
    result = cell(ip, "-q --no-ops", "torch.ones(3) * 2")
    assert result.ops is None and result.ops_by_device == {}
    assert "not counted (--no-ops)" in str(result)


def test_cpu_tensor_memory_allocated_peak_and_held(ip):
    ip.run_cell("import torch")
    body = ("kept = torch.empty(4 * 2**20, dtype=torch.uint8)\n"
            "scratch = torch.empty(8 * 2**20, dtype=torch.uint8)\n"
            "del scratch")
    ops = cell(ip, "-q", body).ops
    assert ops.cpu_bytes_allocated >= 12 * 2**20
    assert ops.cpu_peak_bytes >= 12 * 2**20
    assert 4 * 2**20 <= ops.cpu_bytes_held < 12 * 2**20


def test_no_gpu_work_warning_when_a_simulated_gpu_is_available(ip, monkeypatch):
    monkeypatch.setenv("JUPYTER_GPU_BACKEND", "simulated:h200")
    ip.run_cell("import torch\nmodel = torch.nn.Linear(16, 4)\nx = torch.randn(8, 16)")
    with capture_output() as captured:
        outcome = ip.run_cell("%%gputime\nmodel(x).sum().backward()")
    outcome.raise_error()
    text, html = captured.outputs[0].data["text/plain"], captured.outputs[0].data["text/html"]
    assert "[simulated]" in text and "[simulated]" in html
    assert "NO_GPU_WORK" in text and "none of them on the GPU" in text
    assert "NVIDIA H200 (simulated)" in text
    assert "model = model.to(device)" in text and "pin_memory=True" in text
    result = cell(ip, "-q", "model(x).sum()")
    warning = findings(result)["NO_GPU_WORK"]
    assert warning.severity == "warn" and result.simulated and result.context["gpu_available"]
    assert no_sampler_thread()


def test_cell_without_pytorch_work_says_nothing_could_use_the_gpu(ip, monkeypatch):
    monkeypatch.setenv("JUPYTER_GPU_BACKEND", "simulated:h200")
    ip.run_cell("import torch")
    result = cell(ip, "-q", "total = sum(i * i for i in range(1000))")
    assert "NO_TORCH_WORK" in findings(result) and "NO_GPU_WORK" not in findings(result)


def test_this_machine_without_a_gpu_gets_no_gpu_warning(ip, monkeypatch):
    monkeypatch.delenv("JUPYTER_GPU_BACKEND", raising=False)
    ip.run_cell("import torch")
    result = cell(ip, "-q", "torch.ones(3) * 2")
    assert not result.context["gpu_available"] and not result.simulated
    assert not {"NO_GPU_WORK", "NO_TORCH_WORK"} & set(findings(result))
    assert result.busy is None and result.busy_note is None  # no driver: nothing to sample


def test_gpu_busy_fraction_is_sampled_while_the_cell_runs(ip, monkeypatch):
    monkeypatch.setenv("JUPYTER_GPU_BACKEND", "simulated:h200-busy")
    ip.run_cell("import time")
    result = cell(ip, "-q", "time.sleep(0.5)")
    assert result.busy is not None and result.busy.samples >= 3
    assert result.busy.percent >= 90 and result.busy.devices == ["NVIDIA H200"]
    assert "GPU busy" in str(result) and "% of the cell" in str(result)
    assert no_sampler_thread()

    monkeypatch.setenv("JUPYTER_GPU_BACKEND", "simulated:h200")
    short = cell(ip, "-q", "pass")
    assert short.busy is None and "too short to sample" in short.busy_note


def test_throttling_seen_by_nvml_is_a_warning(ip, monkeypatch):
    monkeypatch.setenv("JUPYTER_GPU_BACKEND", "simulated:h200-hot")
    ip.run_cell("import time")
    result = cell(ip, "-q", "time.sleep(0.4)")
    warning = findings(result)["GPU_THROTTLED"]
    assert "thermal" in warning.evidence["throttle reasons"]
    assert "gpu_idle" not in result.throttle_reasons


def test_large_spread_is_flagged(ip):
    ip.run_cell("import time\nstep = 0")
    result = cell(ip, "-q -r 4", "step += 1\ntime.sleep(0.002 if step < 4 else 0.03)")
    assert result.stats.spread_ratio > 4
    assert findings(result)["LARGE_SPREAD"].severity == "warn"


def test_exception_propagates_with_the_cells_own_traceback(ip):
    with capture_output() as captured:
        outcome = ip.run_cell("%%gputime\nbefore = 1\nfactor = 0\nratio = before / factor\nafter = 2")
    assert isinstance(outcome.error_in_exec, ZeroDivisionError)
    assert ip.user_ns["before"] == 1 and "after" not in ip.user_ns
    shown = captured.stdout
    assert "ratio = before / factor" in shown and "line 4" in shown
    assert "runner.py" not in shown and "gputime_magic.py" not in shown  # our frames stay hidden


def test_exception_in_a_repeated_run_keeps_its_cause(ip, monkeypatch):
    monkeypatch.setenv("JUPYTER_GPU_BACKEND", "simulated:h200")
    ip.run_cell("calls = 0")
    body = ("calls += 1\n"
            "if calls == 3:\n"
            "    raise ValueError('third run') from KeyError('why')")
    with capture_output():
        outcome = ip.run_cell(f"%%gputime -n 2 -r 2\n{body}")
    error = outcome.error_in_exec
    assert isinstance(error, ValueError) and str(error) == "third run"
    assert isinstance(error.__cause__, KeyError)
    assert LOOP_COUNT not in ip.user_ns and no_sampler_thread()


@pytest.mark.parametrize(("line", "words"), [
    ("-n 0", "-n must be at least 1"),
    ("-n many", "-n needs a whole number"),
    ("-r 0", "-r must be at least 1"),
    ("-w -1", "-w must be at least 0"),
    ("--auto -n 5", "cannot be combined with -n"),
    ("--budget 1", "add --auto"),
    ("--auto --budget 0", "--budget must be a positive number"),
    ("--bogus", "Unrecognized arguments: --bogus."),
    ("x = 1", "takes only options on its first line"),
])
def test_bad_options_are_one_sentence_usage_errors(ip, line, words):
    with pytest.raises(UsageError, match=words.replace("(", r"\(")):
        ip.run_cell_magic("gputime", line, "pass")


def test_line_magic_needs_a_statement_and_cell_needs_a_body(ip):
    with pytest.raises(UsageError, match="needs a statement"):
        ip.run_line_magic("gputime", "-n 3")
    with pytest.raises(UsageError, match="empty cell"):
        ip.run_cell_magic("gputime", "", "\n  \n")


@pytest.mark.parametrize("magic", ["gputime", "gpuprofile"])
def test_a_syntax_error_in_the_cell_points_at_its_line_and_a_line_form_that_is_not_python_is_one_sentence(
        ip, magic):
    import linecache

    with capture_output():
        run = ip.run_cell(f"%%{magic}\nx = 1\nfor i in range(3)\n    pass\n")
    error = run.error_in_exec
    assert isinstance(error, SyntaxError) and error.msg == "expected ':'"
    # The line the notebook shows under the magic's own line, not `%%gputime`.
    assert error.lineno == 3 and linecache.getline(error.filename, error.lineno) == "for i in range(3)\n"
    with pytest.raises(UsageError, match=rf"%{magic}: 'train model loader' is not a Python statement "
                                         rf"\(invalid syntax\); write it as in a cell, e\.g\. %{magic} "):
        ip.run_line_magic(magic, "train model loader")


def test_unknown_backend_is_a_usage_error(ip, monkeypatch):
    monkeypatch.setenv("JUPYTER_GPU_BACKEND", "simulated:nonesuch")
    with pytest.raises(UsageError, match="nonesuch"):
        ip.run_cell_magic("gputime", "", "pass")


def test_quiet_and_return(ip):
    with capture_output() as captured:
        assert ip.run_cell_magic("gputime", "-q", "1 + 1") is None
        result = ip.run_cell_magic("gputime", "-q -o", "1 + 1")
    assert not captured.outputs and captured.stdout == ""
    assert result.n == 1
    with capture_output() as captured:
        ip.run_cell("%%gputime -o\n1 + 1")
    assert not captured.outputs  # the cell's value shows the result once, not twice


def test_result_serialises_and_escapes_html(ip):
    ip.run_cell("import torch")
    result = cell(ip, "-q -l <b>mine</b> -r 2", "torch.ones(4) @ torch.ones(4)")
    data = json.loads(json.dumps(result.to_dict()))
    assert data["label"] == "<b>mine</b>" and len(data["times"]) == 2 and data["ops"]["by_device"] == {"cpu": 3}
    assert data["stats"]["median"] == result.median
    html = result._repr_html_()
    assert "<b>mine</b>" not in html and "&lt;b&gt;mine&lt;/b&gt;" in html
    assert repr(result).startswith("<GpuTimeResult: <b>mine</b>:")


def test_compare_shows_speedups(ip):
    import jupyter_gpu

    ip.run_cell("import time")
    slow = cell(ip, "-q -n 2 -r 3 -l slow", "time.sleep(0.02)")
    fast = cell(ip, "-q -n 2 -r 3 -l fast", "time.sleep(0.01)")
    table = jupyter_gpu.Comparison([slow, fast], ["slow", "fast"])
    assert table.speedups[0] == 1.0
    assert 1.4 <= table.speedups[1] <= 2.1
    with capture_output() as captured:
        jupyter_gpu.compare(slow, fast)
    text = captured.outputs[0].data["text/plain"]
    assert "baseline" in text and "x faster" in text
    assert text.splitlines()[2].startswith("slow") and text.splitlines()[3].startswith("fast")
    with pytest.raises(TypeError, match="GpuTimeResult"):
        jupyter_gpu.compare(slow, 3.0)


def test_long_repeats_show_progress_then_clear_it(ip, monkeypatch):
    from jupyter_gpu.gputime import runner

    monkeypatch.setattr(runner, "PROGRESS_AFTER_SECONDS", 0.01)  # what counts as "long" on this machine
    ip.run_cell("import time")
    with capture_output() as captured:
        ip.run_cell("%%gputime -r 3\ntime.sleep(0.03)").raise_error()
    lines = [o.data["text/plain"] for o in captured.outputs if "text/html" not in o.data]
    assert lines[0].startswith("gputime: repeat 1/3 done") and "left" in lines[0]
    assert lines[-1] == ""  # the progress line is emptied once the result is shown
    assert "n=3 runs" in captured.outputs[-1].data["text/plain"]


def test_interrupt_keeps_the_finished_repeats_and_still_stops(ip):
    ip.run_cell("import time\nexecutions = 0")
    body = ("executions += 1\n"
            "if executions == 4:\n"
            "    raise KeyboardInterrupt\n"
            "time.sleep(0.01)")
    with capture_output() as captured:
        outcome = ip.run_cell(f"%%gputime -r 5\n{body}")
    assert isinstance(outcome.error_in_exec, KeyboardInterrupt)  # "Run all" stops here
    shown = captured.outputs[0].data["text/plain"]
    assert "n=2 runs" in shown and "interrupted after 2 of 5 repeats" in shown
    assert LOOP_COUNT not in ip.user_ns and no_sampler_thread()
