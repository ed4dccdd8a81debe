"""%batchprobe and %%batchprobe in a real IPython shell, probing real CPU torch training steps under a budget."""

from __future__ import annotations

import gc

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from jupyter_gpu.batchprobe.estimate import MemoryEstimate
from jupyter_gpu.batchprobe.result import BatchProbeResult

GiB = 2**30

SETUP = """
import torch, weakref
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Linear(128, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
not_a_step = 3

def step(batch_size):
    x = torch.randn(batch_size, 16)
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def define_training(ip: InteractiveShell) -> None:
    ip.run_cell(SETUP).raise_error()


def weights(ip: InteractiveShell) -> list[torch.Tensor]:
    return [p.detach().clone() for p in ip.user_ns["model"].parameters()]


def plain_texts(captured: capture_output) -> list[str]:
    return [output.data.get("text/plain", "") for output in captured.outputs]


def test_line_form_returns_the_result_and_shows_it_with_a_progress_line(ip: InteractiveShell) -> None:
    define_training(ip)
    with capture_output() as captured:
        result = ip.run_line_magic("batchprobe", "step --max-memory 8MiB -o")
    assert isinstance(result, BatchProbeResult)
    assert result.max_batch_size > 0 and result.trial(result.max_batch_size + 1) is not None
    texts = plain_texts(captured)
    shown = [output.data for output in captured.outputs if output.data.get("text/plain", "").startswith("batchprobe:")]
    assert len(shown) == 1
    assert shown[0]["text/plain"].startswith(f"batchprobe: max batch size {result.max_batch_size}")
    assert "jupyter-gpu-batchprobe" in shown[0]["text/html"]
    progress = [output for output in captured.outputs if output.data.get("text/plain", "").startswith("%batchprobe")]
    assert progress and any(output.update for output in progress), texts  # one line, updated in place
    assert any("trial 1: batch 2" in text for text in texts)


def test_quiet_shows_nothing_not_even_progress(ip: InteractiveShell) -> None:
    define_training(ip)
    with capture_output() as captured:
        result = ip.run_line_magic("batchprobe", "step --max-memory 8MiB -q -o")
        nothing = ip.run_line_magic("batchprobe", "step --max-memory 8MiB --max 8 -q")
    assert isinstance(result, BatchProbeResult) and result.max_batch_size > 0
    assert nothing is None
    assert captured.outputs == [] and captured.stdout == "" and captured.stderr == ""


def test_cell_form_runs_the_body_as_the_step_without_leaking_its_variables(ip: InteractiveShell) -> None:
    define_training(ip)
    before = weights(ip)
    cell = (
        "%%batchprobe --max-memory 16MiB -o\n"
        "inputs = torch.randn(batch_size, 16)\n"
        "body_loss = model(inputs).square().mean()\n"
        "opt.zero_grad()\n"
        "body_loss.backward()\n"
        "opt.step()\n"
    )
    with capture_output() as captured:
        outcome = ip.run_cell(cell)
    outcome.raise_error()
    result = outcome.result
    assert isinstance(result, BatchProbeResult) and result.max_batch_size > 0
    assert not any(name in ip.user_ns for name in ("inputs", "body_loss", "batch_size"))
    assert all(torch.equal(old, new) for old, new in zip(before, weights(ip), strict=True))
    assert ip.user_ns["opt"].state == {}
    headline = "batchprobe: max batch size"
    shown = captured.stdout.count(headline) + sum(text.count(headline) for text in plain_texts(captured))
    assert shown == 1  # the cell's value only, not displayed a second time


def test_an_oom_in_a_previous_cell_is_freed_by_the_probe_and_variables_stay(ip: InteractiveShell) -> None:
    define_training(ip)
    ip.run_cell(
        "REFS = []\n"
        "def fails(n):\n"
        "    activations = torch.empty(n, 1024)\n"
        "    REFS.append(weakref.ref(activations))\n"
        "    raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')\n"
    ).raise_error()
    with capture_output():
        failed = ip.run_cell("fails(256)")
    assert isinstance(failed.error_in_exec, torch.OutOfMemoryError)
    gc.collect()
    assert ip.user_ns["REFS"][0]() is not None  # the failed cell's traceback really holds the tensor
    kept_model, kept_opt = ip.user_ns["model"], ip.user_ns["opt"]

    result = ip.run_line_magic("batchprobe", "step --max-memory 8MiB -q -o")

    assert ip.user_ns["REFS"][0]() is None
    assert ip.user_ns["model"] is kept_model and ip.user_ns["opt"] is kept_opt and ip.user_ns["not_a_step"] == 3
    assert result.memory_after == result.memory_before


def test_an_error_in_the_step_is_one_sentence_naming_its_line(ip: InteractiveShell) -> None:
    define_training(ip)
    ip.run_cell(
        "def broken(batch_size):\n"
        "    step(batch_size)\n"
        "    if batch_size >= 8:\n"
        "        raise ValueError(f'shape mismatch at {batch_size}')\n"
    ).raise_error()
    before = weights(ip)
    with capture_output() as captured:
        outcome = ip.run_cell("%batchprobe broken --max-memory 8MiB")
    assert isinstance(outcome.error_in_exec, UsageError)
    message = str(outcome.error_in_exec)
    assert message.startswith("%batchprobe: the step raised ValueError: shape mismatch at ")
    assert "line 4, in broken: `raise ValueError(f'shape mismatch at {batch_size}')`" in message
    assert "Traceback" not in captured.stdout + captured.stderr and "runner.py" not in captured.stdout + captured.stderr
    assert all(torch.equal(old, new) for old, new in zip(before, weights(ip), strict=True))


def test_a_step_without_the_batch_size_argument_is_refused_in_one_sentence(ip: InteractiveShell) -> None:
    define_training(ip)
    ip.run_cell("def whole_step():\n    step(8)\n").raise_error()
    outcome = ip.run_cell("%batchprobe whole_step --max-memory 8MiB")
    assert isinstance(outcome.error_in_exec, UsageError)
    assert str(outcome.error_in_exec).startswith(
        "%batchprobe: `whole_step` takes no arguments, and %batchprobe calls it with one argument, the batch size")


@pytest.mark.parametrize(
    ("line", "cell"),
    [
        ("", None),
        ("missing_step", None),
        ("not_a_step", None),
        ("step other", None),
        ("step --margin 2", None),
        ("step --max-memory 6Gibs", None),
        ("step --start 0", None),
        ("step --max 1 --start 4", None),
        ("step --for 24GiB", None),
        ("step --amp fp8", None),
        ("step", "x = torch.ones(batch_size)\n"),
        ("--max-memory 8MiB", "   \n"),
    ],
    ids=["no-name", "unknown-name", "not-callable", "two-names", "margin", "bad-size", "start-0", "max-below-start",
         "for-without-estimate", "amp-fp8", "name-on-cell-line", "empty-cell"],
)
def test_bad_input_is_a_one_sentence_usage_error(ip: InteractiveShell, line: str, cell: str | None) -> None:
    define_training(ip)
    before = weights(ip)
    with capture_output() as captured, pytest.raises(UsageError) as caught:
        if cell is None:
            ip.run_line_magic("batchprobe", line)
        else:
            ip.run_cell_magic("batchprobe", line, cell)
    message = str(caught.value)
    assert message and "\n" not in message.strip() and "Traceback" not in message
    assert "batchprobe" in message
    assert captured.outputs == []  # nothing probed, nothing shown
    assert all(torch.equal(old, new) for old, new in zip(before, weights(ip), strict=True))


def test_a_usage_error_in_a_cell_shows_no_traceback(ip: InteractiveShell) -> None:
    define_training(ip)
    with capture_output() as captured:
        outcome = ip.run_cell("%batchprobe step --margin 2")
    assert isinstance(outcome.error_in_exec, UsageError)
    assert "Traceback" not in captured.stdout + captured.stderr
    assert "--margin" in captured.stdout + captured.stderr


def test_estimate_predicts_for_each_memory_size_and_leaves_the_model_untouched(ip: InteractiveShell) -> None:
    define_training(ip)
    before = weights(ip)
    with capture_output() as captured:
        estimate = ip.run_line_magic("batchprobe", "step --estimate --for 1GiB,2GiB -o")
    assert isinstance(estimate, MemoryEstimate)
    assert set(estimate.fits) == {GiB, 2 * GiB}
    # 1 GiB is all reserve (CUDA context, workspaces): no batch size fits there, which is an answer, not an error.
    assert estimate.budget_for(GiB) == 0 and estimate.fits[GiB] == 0
    assert estimate.fits[2 * GiB] > 0
    assert all(torch.equal(old, new) for old, new in zip(before, weights(ip), strict=True))
    assert ip.user_ns["opt"].state == {} and all(p.grad is None for p in ip.user_ns["model"].parameters())
    assert any("--estimate" in text for text in plain_texts(captured))
