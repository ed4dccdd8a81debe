"""What the step writes from threads other than its own, and what it warns, while a probe calls it.

On CUDA, autograd runs the backward of CUDA nodes on a device thread its engine started (engine.cpp,
`device_ready_queues_`): a backward hook's print came from there, and the sink kept the step's own thread only, so
those lines reached the notebook on every probe call. FakeCuda.device_autograd runs backward the same way here.
"""

from __future__ import annotations

import sys
import threading
import warnings

import torch
from fake_cuda import FakeCuda
from torch import nn

from jupyter_gpu.probekit.step_output import StepOutput
from jupyter_gpu.probekit.ticker import Ticker
from jupyter_gpu.speedprobe.runner import probe_speed


def hooked_training() -> dict:
    """A tutorial MLP whose gradient hook logs, as gradient-monitoring code writes it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    model[0].weight.register_hook(lambda grad: print(f"grad norm {grad.norm():.3f}") or None)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))

    def train_step() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return {"model": model, "opt": opt, "x": x, "y": y, "train_step": train_step, "torch": torch, "nn": nn}


def test_a_backward_hook_printing_from_autograds_device_thread_is_the_steps(capsys) -> None:
    ns = hooked_training()
    with FakeCuda().device_autograd():
        output = StepOutput()
        with output.hidden():
            ns["train_step"]()
    assert output.lines == 1 and output.first.startswith("grad norm"), "the hook ran on the device thread"
    assert capsys.readouterr().out == ""


def test_speedprobe_on_a_step_whose_hook_prints_from_the_device_thread_keeps_the_notebook_clean(capsys) -> None:
    ns = hooked_training()
    with FakeCuda().device_autograd():
        speed = probe_speed(ns["train_step"], options=("fused-optimizer",), steps=3, namespace=ns)
    assert "grad norm" not in capsys.readouterr().out
    [printed] = [note for note in speed.notes if "printed" in note]
    assert "(the first: 'grad norm" in printed


def test_the_probes_own_ticker_still_writes_while_a_step_runs_on_the_device_thread(capsys) -> None:
    shown = threading.Event()
    ticker = Ticker(lambda text: (print(text), shown.set()))
    output = StepOutput()
    with output.hidden():
        ticker.resume("speedprobe train_step: baseline, 1.0 s")
        assert shown.wait(5)
        ticker.stop()
    assert "speedprobe train_step: baseline" in capsys.readouterr().out and output.lines == 0


def test_a_warning_is_kept_apart_from_the_printed_lines_and_named_once(capsys) -> None:
    # Inductor warns once a process on its first compile on sm >= 8.0 without TF32; stderr is the sink, so the
    # warning had been counted as "printed 2 lines" and never seen.
    output = StepOutput()
    for _ in range(3):
        with output.hidden():
            warnings.warn("TensorFloat32 tensor cores for float32 matrix multiplication available but not enabled",
                          UserWarning, stacklevel=1)
            print("step done")
    assert output.lines == 3
    assert output.warning_notes() == [
        "warned while the probe ran (3 times): UserWarning: TensorFloat32 tensor cores for float32 matrix "
        "multiplication available but not enabled"]
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_speedprobe_names_what_the_step_warned_in_its_notes() -> None:
    ns = hooked_training()
    exec("def warning_step():\n    import warnings\n    warnings.warn('lr_scheduler.step() before optimizer.step()')"
         "\n    return train_step()\n", ns)
    speed = probe_speed(ns["warning_step"], options=("fused-optimizer",), steps=3, namespace=ns)
    assert any(note.startswith("warned while the probe ran") and "lr_scheduler.step()" in note
               for note in speed.notes), speed.notes
    assert not any("printed" in note and "lr_scheduler" in note for note in speed.notes)


def test_a_ticker_writing_while_sinks_come_and_go_never_raises_in_its_thread() -> None:
    # Seen once in about ten runs: AttributeError: '_Sink' object has no attribute '_thread', raised in the
    # progress thread while the sink was being set up or torn down.
    errors: list[BaseException] = []
    previous = threading.excepthook
    threading.excepthook = lambda args: errors.append(args.exc_value)
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            sys.stdout.write("")
            sys.stdout.flush()
            sys.stderr.flush()

    writer = threading.Thread(target=tick, daemon=True)
    writer.start()
    try:
        output = StepOutput()
        for _ in range(2000):
            with output.hidden():
                pass
    finally:
        stop.set()
        writer.join(5)
        threading.excepthook = previous
    assert errors == [] and not writer.is_alive()
