"""What a user reads after `%speedprobe`: the verdict line, the table of configurations, the launch-bound
paragraph, the code to adopt and the footer, in text and escaped HTML.

Results are plain data, so they are built here by hand, with the best configuration chosen by `decide` as the
runner does.
"""

from __future__ import annotations

import re
from typing import Any

from jupyter_gpu.rendering.kit import COLOUR
from jupyter_gpu.speedprobe import decide
from jupyter_gpu.speedprobe.render import render_html, render_text
from jupyter_gpu.speedprobe.result import Agreement, LaunchProfile, OptionTrial, SpeedProbeResult

HOSTILE = "<img src=x onerror=alert(1)>"
MIB = 1 << 20
BASELINE_SECONDS = 0.010


def agrees(format_name: str = "float32", update: float = 3.1e-3, tol: float = 1.6e-2,
           drift: float = 4e-4) -> Agreement:
    return Agreement(format=format_name, update_rel_l2=update, tolerance=tol, loss_drift=drift, steps=20,
                     agrees=True)


def wrong(failure: str) -> Agreement:
    return Agreement(format="float16", update_rel_l2=None, tolerance=4.9e-4, loss_drift=None, steps=3,
                     failure=failure, agrees=False)


def trial(name: str, speedup: float, agreement: Agreement | None = None, **changes: Any) -> OptionTrial:
    """An option measured at `speedup` over the baseline: 3 steps around its median."""
    members = tuple(name.split("+"))
    seconds = BASELINE_SECONDS / speedup
    fields: dict[str, Any] = dict(name=name, members=members, times=[seconds * 0.95, seconds, seconds * 1.1],
                                  peak_bytes=300 * MIB, ops=120, agreement=agreement or agrees(), speedup=speedup)
    fields.update(changes)
    return OptionTrial(**fields)


def skipped(name: str, reason: str) -> OptionTrial:
    return OptionTrial(name, (name,), skipped=reason)


BASELINE = OptionTrial("baseline", (), times=[0.0098, 0.0101, 0.0105], peak_bytes=512 * MIB, ops=400,
                       speedup=1.0)


def result(options: list[OptionTrial], *, combination: OptionTrial | None = None, **changes: Any) -> SpeedProbeResult:
    fields: dict[str, Any] = dict(
        step_name="train_step", device="cuda:0", batch_size=64, baseline=BASELINE, options=options,
        combination=combination, best=decide.choose_best(options, combination),
        launch=LaunchProfile("cuda:0", 400, BASELINE_SECONDS, launch_bound=False), repeatability=0.0, steps=20,
        notes=[], restored=["model", "opt", "RNG", "global flags"], seconds=95.0)
    fields.update(changes)
    return SpeedProbeResult(**fields)


def probe_with_a_winning_combination() -> SpeedProbeResult:
    options = [trial("amp-bf16", 1.6, agrees("bfloat16")), trial("fused-optimizer", 1.2),
               trial("compile", 1.1, compile_seconds=48.0)]
    both = trial("amp-bf16+fused-optimizer", 1.9, agrees("bfloat16"))
    return result(options, combination=both)


def probe_with_broken_fp16() -> SpeedProbeResult:
    failure = "the GradScaler's scale collapsed from 65536 to 0.25: 18 of 20 steps overflowed in fp16 and were skipped"
    options = [trial("amp-fp16", 2.4, wrong(failure)), trial("tf32", 1.3, agrees("tf32"))]
    return result(options)


def text_row(text: str, title: str) -> str:
    """The table line of a configuration."""
    return next(line for line in text.splitlines() if line.startswith(f"  {title} "))


# -- the headline -------------------------------------------------------------------------------------------------

def test_the_headline_names_the_best_combination_and_the_compile_time_separately() -> None:
    first = render_text(probe_with_a_winning_combination()).splitlines()[0]
    assert first == ("speedprobe train_step: bf16 autocast + fused optimizer: 1.9x faster, agrees; "
                     "torch.compile: 1.1x after 48.0 s of compilation")


def test_a_fast_option_that_disagrees_is_faster_but_wrong_and_never_recommended() -> None:
    probe = probe_with_broken_fp16()
    text = render_text(probe)
    first = text.splitlines()[0]
    assert first.startswith("speedprobe train_step: TF32 matmuls and convolutions: 1.3x faster, agrees")
    assert "fp16 autocast + GradScaler: 2.4x faster but wrong" in first
    assert "faster but wrong  fp16 autocast + GradScaler (2.4x): the GradScaler's scale collapsed" in text
    row = text_row(text, "fp16 autocast + GradScaler")
    assert "✗ faster but wrong: the GradScaler's scale collapsed from 65536 to 0.25" in row
    assert "recommended" not in row
    assert "◀ recommended" in text_row(text, "TF32 matmuls and convolutions")
    # The code to adopt is TF32's, not fp16's.
    assert 'torch.set_float32_matmul_precision("high")' in text
    assert "GradScaler(" not in text


def test_when_nothing_helps_the_headline_says_keep_the_step() -> None:
    options = [trial("channels-last", 0.8), trial("fused-optimizer", 1.01)]
    text = render_text(result(options))
    assert text.splitlines()[0] == ("speedprobe train_step: nothing tried is faster and agrees; keep the step as it "
                                    "is")
    assert "code to adopt" not in text
    assert "recommended" not in text


def test_an_interrupted_probe_says_so_and_shows_what_was_measured() -> None:
    options = [trial("amp-bf16", 1.6, agrees("bfloat16")), OptionTrial("tf32", ("tf32",))]
    text = render_text(result(options, interrupted=True, seconds=12.5))
    first = text.splitlines()[0]
    assert first.startswith("speedprobe train_step: interrupted after 12.5 s; what follows is what was measured")
    assert "so far bf16 autocast: 1.6x faster, agrees" in first
    assert "not measured" in text_row(text, "TF32 matmuls and convolutions")
    assert text.splitlines()[-1].endswith("12.5 s (interrupted)")


# -- the table ----------------------------------------------------------------------------------------------------

def test_the_table_lists_the_baseline_then_each_option_then_the_combination() -> None:
    text = render_text(probe_with_a_winning_combination())
    lines = text.splitlines()
    titles = ["baseline", "bf16 autocast", "fused optimizer", "torch.compile", "bf16 autocast + fused optimizer"]
    positions = [lines.index(text_row(text, title)) for title in titles]
    assert positions == sorted(positions)
    baseline = text_row(text, "baseline")
    assert "10.1 ms" in baseline and "9.80 ms–10.5 ms" in baseline and "1.00x" in baseline
    assert "512.0 MiB" in baseline
    assert "CUDA peak" in text
    combination = text_row(text, "bf16 autocast + fused optimizer")
    assert "1.90x" in combination
    assert "✓ agrees: update Δ 3.1e-03 ≤ 1.6e-02, loss drift 0.04%" in combination
    assert "48.0 s of compilation" in text_row(text, "torch.compile")


def test_a_skipped_option_shows_its_reason_in_its_row() -> None:
    options = [skipped("channels-last", "the model has no 4-D convolution"), trial("tf32", 1.3, agrees("tf32"))]
    row = text_row(render_text(result(options)), "channels_last")
    assert "skipped: the model has no 4-D convolution" in row
    assert "ms" not in row and "x " not in row  # no time or speed-up for what did not run


def test_samples_per_second_shows_only_when_the_batch_size_is_known() -> None:
    known = render_text(result([trial("tf32", 1.25, agrees("tf32"))]))
    assert "samples/s" in known
    assert "8,000" in text_row(known, "TF32 matmuls and convolutions")  # 64 samples in 8 ms
    unknown = render_text(result([trial("tf32", 1.25, agrees("tf32"))], batch_size=None))
    assert "samples/s" not in unknown


def test_cpu_memory_is_labelled_as_cpu_tensors() -> None:
    text = render_text(result([trial("fused-optimizer", 1.2)], device="cpu",
                              launch=LaunchProfile("cpu", 400, BASELINE_SECONDS, launch_bound=False)))
    assert "CPU tensors peak" in text and "CUDA peak" not in text


def test_an_option_that_cannot_be_judged_says_why() -> None:
    unjudged = Agreement(format="float32", update_rel_l2=None, tolerance=None, loss_drift=None, steps=0,
                         agrees=None, note="nothing to compare: no parameter changed and no loss returned")
    row = text_row(render_text(result([trial("fused-optimizer", 1.2, unjudged)])), "fused optimizer")
    assert "not judged: nothing to compare: no parameter changed and no loss returned" in row


# -- launch-bound -------------------------------------------------------------------------------------------------

def test_a_launch_bound_gpu_step_is_explained_with_its_numbers() -> None:
    launch = LaunchProfile("cuda:0", 1000, 0.008, launch_bound=True)
    text = render_text(result([trial("tf32", 1.3, agrees("tf32"))], launch=launch))
    assert ("launch-bound: 1,000 operators per step at 8.00 µs each, near the few-µs launch cost: the GPU waits on "
            "Python. A bigger batch, compile-reduce-overhead (CUDA graphs) or, for a tiny model, the CPU may be "
            "faster.") in text
    assert "overhead-bound" not in text


def test_a_traced_gpu_step_is_judged_by_its_kernel_trace() -> None:
    # As on the H200: a tiny MLP at batch 1 took 32 µs an operator on that machine's host, over the fixed 20 µs
    # per operator, and was called "not launch-bound" with its GPU idle most of the step. The trace's verdict
    # (GpuTimeline.launch_bound, tests/speedprobe/test_launch_bound_on_traces.py) decides where there is one.
    from jupyter_gpu.speedprobe.decide import launch_bound

    assert not launch_bound("cuda", 58, 58 * 32e-6) and launch_bound("cuda", 58, 58 * 32e-6, traced=True)
    assert not launch_bound("cuda", 215, 215 * 8e-6, traced=False)  # short per op, but the trace says otherwise
    assert not launch_bound("cuda", 5, 0.001, traced=True)  # too few operators to say
    launch = LaunchProfile("cuda:0", 58, 58 * 32e-6, launch_bound=True, gpu_busy=0.12, kernels=61)
    text = render_text(result([trial("tf32", 1.3, agrees("tf32"))], launch=launch))
    assert ("launch-bound: 58 operators per step at 32.0 µs each, and the GPU ran kernels for 12% of the step (61 "
            "kernels, traced): it waits on Python.") in text
    busy = LaunchProfile("cuda:0", 215, 0.0109, launch_bound=False, gpu_busy=0.78, kernels=306)
    text = render_text(result([trial("tf32", 1.3, agrees("tf32"))], launch=busy))
    assert ("215 per step on cuda:0 at 50.7 µs each; the GPU ran kernels for 78% of the step (306 kernels, traced) "
            "(not launch-bound)") in text


def test_an_overhead_bound_cpu_step_names_the_dispatcher() -> None:
    launch = LaunchProfile("cpu", 2000, 0.005, launch_bound=True)
    text = render_text(result([trial("fused-optimizer", 1.2)], device="cpu", launch=launch))
    assert ("overhead-bound: 2,000 operators per step at 2.50 µs each: Python and PyTorch's dispatcher, not "
            "arithmetic, take the time; a bigger batch or torch.compile cuts it.") in text
    assert "launch-bound" not in text
    # torch.compile measured slower just above: not offered as the cure.
    slower = render_text(result([trial("compile", 0.4)], device="cpu", launch=launch))
    assert "take the time; a bigger batch cuts it (torch.compile, measured above, did not)." in slower


def test_a_step_that_is_not_launch_bound_gets_one_operators_row() -> None:
    text = render_text(result([trial("tf32", 1.3, agrees("tf32"))]))
    assert "  operators       400 per step on cuda:0 at 25.0 µs each (not launch-bound)" in text
    assert "the GPU waits on Python" not in text and "overhead-bound" not in text


# -- code and footer ----------------------------------------------------------------------------------------------

def test_the_code_to_adopt_is_the_best_configurations() -> None:
    text = render_text(probe_with_a_winning_combination())
    code = text.split("code to adopt:\n")[1].splitlines()
    assert code[0] == "    opt = torch.optim.AdamW(model.parameters(), fused=True)  # keep your other arguments"
    assert code[1].startswith('    with torch.autocast("cuda", dtype=torch.bfloat16):')


def test_the_footer_says_how_repeatable_what_was_restored_and_how_long() -> None:
    text = render_text(result([trial("tf32", 1.3, agrees("tf32"))], notes=["`train_step` returns no loss"]))
    assert "two baseline runs from the same state differ by 0 (bitwise repeatable)" in text
    assert "steps compared  20 per configuration" in text
    assert "note            `train_step` returns no loss" in text
    assert "restored        model, opt, RNG, global flags exactly as before" in text
    assert text.splitlines()[-1] == "  time            1 min 35.0 s"
    noisy = render_text(result([trial("tf32", 1.3, agrees("tf32"))], repeatability=2.5e-7))
    assert "differ by 2.5e-07" in noisy


# -- HTML ---------------------------------------------------------------------------------------------------------

def test_html_escapes_a_hostile_step_name_and_failure() -> None:
    probe = result([trial("amp-fp16", 2.0, wrong(HOSTILE))], step_name="<b>x</b>")
    html = render_html(probe)
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html
    assert HOSTILE not in html and "&lt;img src=x onerror=alert(1)&gt;" in html


def test_html_colours_agreement_and_wrongness_and_shows_code_in_monospace() -> None:
    html = render_html(probe_with_broken_fp16())
    assert re.search(rf'color:{COLOUR["fail"]}">✗ faster but wrong: the GradScaler', html)
    assert re.search(rf'color:{COLOUR["ok"]}">✓ agrees', html)
    assert '<pre style="' in html and "torch.set_float32_matmul_precision(&quot;high&quot;)" in html


def test_html_has_no_code_block_when_nothing_helps() -> None:
    html = render_html(result([trial("channels-last", 0.8)]))
    assert "nothing tried is faster and agrees; keep the step as it is" in html
    assert "<pre" not in html


def test_a_compiled_option_that_failed_is_named_in_the_headline_and_its_row() -> None:
    broken = OptionTrial("compile", ("compile",), warmup_seconds=[3.0], error="BackendCompilerFailed: inductor")
    text = render_text(result([trial("tf32", 1.3, agrees("tf32")), broken]))
    assert text.splitlines()[0].endswith("; torch.compile: failed")
    assert "failed: BackendCompilerFailed: inductor" in text_row(text, "torch.compile")


def test_a_cpu_steps_overhead_is_judged_against_this_hosts_own_operator() -> None:
    # As in CI on a 2-core EPYC: a one-element add took 2.1-3.2 us there (1.4 us where the old fixed 10 us line was
    # set), and a tiny MLP at batch 1 took 11.4 us an operator: "not overhead-bound" by the fixed line.
    from jupyter_gpu.speedprobe.decide import launch_bound

    assert not launch_bound("cpu", 101, 101 * 11.4e-6)  # no floor measured: the fixed line
    assert launch_bound("cpu", 101, 101 * 11.4e-6, op_floor=2.1e-6)  # the slower host's yardstick
    assert launch_bound("cpu", 101, 101 * 15.2e-6, op_floor=1.57e-6)  # CI's timing lane, the CPU shared: 9.7x
    assert not launch_bound("cpu", 101, 101 * 20e-6, op_floor=1.4e-6)  # 14x a faster host's floor: arithmetic
    assert not launch_bound("cpu", 8, 8 * 3e-6, op_floor=2.1e-6)  # too few operators to say
    launch = LaunchProfile("cpu", 101, 101 * 11.4e-6, launch_bound=True, op_floor=2.1e-6)
    text = render_text(result([trial("tf32", 1.3, agrees("tf32"))], launch=launch))
    assert ("overhead-bound: 101 operators per step at 11.4 µs each (this host dispatches a one-element operator in "
            "2.10 µs): Python and PyTorch's dispatcher") in text
