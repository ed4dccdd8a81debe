"""Which launch methods work from a notebook, diagnosed without touching CUDA, checked against real fork and spawn
children started with a function defined in a real IPython shell."""

from __future__ import annotations

import multiprocessing
import sys

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

from jupyter_gpu.distributed.launch_facts import gather_launch_facts
from jupyter_gpu.distributed.readiness import launch_findings, launch_methods

CELL = """
import torch
from torch import nn

def train(rank):
    model = nn.Linear(4, 2)
    model(torch.ones(1, 4)).sum().backward()

class Net(nn.Module):
    def forward(self, x):
        return x

net = nn.DataParallel(nn.Sequential(nn.Linear(4, 4)))
helper = len  # a builtin: importable anywhere, not the notebook's own code
"""


@pytest.fixture
def notebook(shell: InteractiveShell):
    shell.run_cell(CELL)
    yield shell
    for name in ("train", "Net", "net", "helper", "nn"):
        shell.user_ns.pop(name, None)


def _exit_code(method: str, target: object) -> int | None:
    context = multiprocessing.get_context(method)
    try:
        child = context.Process(target=target, args=(0,))
        child.start()
    except Exception:  # spawn pickles the target in the parent first: a notebook function fails right there
        return None
    child.join(60)
    return child.exitcode


@pytest.mark.skipif(sys.platform != "linux", reason="fork is the Linux launcher")
def test_the_diagnosis_matches_what_fork_and_spawn_really_do(notebook: InteractiveShell) -> None:
    facts = gather_launch_facts(notebook.user_ns)
    assert facts["in_kernel"] and not facts["cuda_initialized"]
    assert facts["notebook_functions"] == ["train", "Net"]
    assert facts["data_parallel"] == [{"name": "net", "module": "Sequential", "device_ids": []}]

    methods = {m.name: m for m in launch_methods(facts, _cpu_view())}
    assert methods["fork from this kernel"].works is True
    assert methods["spawn from this kernel"].works is False
    assert "train, Net defined in the notebook" in methods["spawn from this kernel"].why
    finding = next(f for f in launch_findings(facts) if f.code == "DIST_SPAWN_NOTEBOOK_FUNCTIONS")
    assert "Can't get attribute 'train'" in finding.headline
    assert "%%writefile train_ddp.py" in finding.fix[0] and "from train_ddp import train" in finding.fix[0]

    train = notebook.user_ns["train"]
    assert _exit_code("fork", train) == 0  # the diagnosis said fork works: it does
    assert _exit_code("spawn", train) != 0  # and spawn does not (pickling in the parent, or the child's import)


def test_cuda_started_in_the_kernel_turns_fork_off(notebook: InteractiveShell) -> None:
    facts = {**gather_launch_facts(notebook.user_ns), "cuda_initialized": True}
    methods = {m.name: m for m in launch_methods(facts, _cpu_view())}
    assert methods["fork from this kernel"].works is False
    assert "Cannot re-initialize CUDA in forked subprocess" in methods["fork from this kernel"].why
    finding = next(f for f in launch_findings(facts) if f.code == "DIST_FORK_AFTER_CUDA")
    assert any("PYTORCH_NVML_BASED_CUDA_CHECK=1" in line for line in finding.fix)


def test_the_check_never_initialises_cuda(notebook: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> None:
    def poisoned(*args: object) -> None:
        raise AssertionError("the readiness check touched CUDA")

    for name in ("init", "device_count", "is_available", "current_device", "_lazy_init"):
        monkeypatch.setattr(torch.cuda, name, poisoned)
    assert gather_launch_facts(notebook.user_ns)["cuda_initialized"] is False


def test_outside_a_kernel_notebook_launchers_are_not_judged() -> None:
    facts = gather_launch_facts(None)
    methods = launch_methods(facts, _cpu_view())
    assert [m.works for m in methods] == [True, None, None]
    assert launch_findings(facts) == []


def _cpu_view():
    from jupyter_gpu.distributed.readiness import GpuView

    return GpuView(0, (), False, None)
