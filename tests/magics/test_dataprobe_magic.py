"""%dataprobe in a real IPython shell: real DataLoaders, real training steps on the CPU, real worker processes."""

from __future__ import annotations

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from processes import child_pids

from jupyter_gpu.dataprobe.result import DataProbeResult

# A small CNN with BatchNorm trained by Adam, as a notebook would define it; each image takes 1 ms to load.
SETUP = """
import time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

class Images(Dataset):
    def __len__(self):
        return 2048
    def __getitem__(self, index):
        time.sleep(0.001)
        return torch.randn(3, 16, 16), index % 10

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                      nn.Flatten(), nn.Linear(8, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
loader = DataLoader(Images(), batch_size=16, shuffle=True)

def train_step(batch):
    x, y = batch
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss
"""




def plain_texts(captured: capture_output) -> list[str]:
    return [output.data.get("text/plain", "") for output in captured.outputs]


def test_probe_a_notebook_loader_and_step_shows_the_verdict_the_table_and_the_code(ip: InteractiveShell) -> None:
    ip.run_cell(SETUP).raise_error()
    weights = [p.detach().clone() for p in ip.user_ns["model"].parameters()]
    children = child_pids()
    with capture_output() as captured:
        result = ip.run_line_magic("dataprobe", "loader --step train_step --workers 0,1,2 --seconds 6 -o")
    assert isinstance(result, DataProbeResult)
    assert result.verdict in ("input-bound", "balanced", "compute-bound")
    assert result.step_alone is not None and result.together is not None
    assert 0.0 <= result.wait_fraction <= 1.0
    shown = [output.data for output in captured.outputs
             if output.data.get("text/plain", "").startswith("dataprobe loader")]
    assert len(shown) == 1
    assert result.verdict in shown[0]["text/plain"]
    assert "text/html" in shown[0]
    if result.code() is not None:
        assert result.code() in shown[0]["text/plain"]
    progress = [output for output in captured.outputs if output.data.get("text/plain", "").startswith("dataprobe:")]
    assert progress and any(output.update for output in progress)  # one progress line, updated in place
    assert all(torch.equal(a, b) for a, b in zip(ip.user_ns["model"].parameters(), weights, strict=True))
    assert ip.user_ns["loader"]._iterator is None
    assert child_pids() == children


def test_quiet_prints_nothing_and_without_o_nothing_is_returned(ip: InteractiveShell) -> None:
    ip.run_cell(SETUP).raise_error()
    with capture_output() as captured:
        nothing = ip.run_line_magic("dataprobe", "loader --workers 0 --seconds 1 -q")
    assert nothing is None
    assert captured.outputs == [] and captured.stdout == "" and captured.stderr == ""


@pytest.mark.parametrize(("line", "message"), [
    ("", "needs the name of a DataLoader"),
    ("missing", "there is no DataLoader 'missing' in the notebook"),
    ("model", "cannot be probed: it is a Sequential, not a torch.utils.data.DataLoader"),
    ("loader --step nothing", "there is no step function 'nothing'"),
    ("loader --step opt", "'opt' is a Adam, not a function"),
    ("loader --workers two", "--workers takes worker counts like 0,2 or 0-3"),
    ("loader --seconds -1", "--seconds"),
    ("loader other", "takes one DataLoader name"),
])
def test_bad_input_is_one_clear_sentence(ip: InteractiveShell, line: str, message: str) -> None:
    ip.run_cell(SETUP).raise_error()
    with pytest.raises(UsageError, match=message):
        ip.run_line_magic("dataprobe", line)


def test_a_notebook_dataset_under_spawn_is_named_before_any_worker_starts(ip: InteractiveShell) -> None:
    ip.run_cell(SETUP).raise_error()
    ip.run_cell("spawn_loader = DataLoader(Images(), batch_size=16, num_workers=2, multiprocessing_context='spawn')"
                ).raise_error()
    children = child_pids()
    with capture_output() as captured:
        result = ip.run_line_magic("dataprobe", "spawn_loader --workers 0,1,2 --seconds 3 -o")
    codes = [finding.code for finding in result.pitfalls]
    assert "NOTEBOOK_SPAWN_PICKLING" in codes
    assert {trial.settings.num_workers for trial in result.trials} == {0}  # no worker was started
    assert any("spawn" in text or "Images" in text for text in result.skipped)
    assert any("current figures are for num_workers=0" in note for note in result.notes)
    shown = "\n".join(plain_texts(captured))
    assert "NOTEBOOK_SPAWN_PICKLING" in shown and "datasets.py" in shown  # the fix: move the class to a file
    assert child_pids() == children


def test_a_notebook_collate_fn_under_spawn_is_named_even_with_a_library_dataset(ip: InteractiveShell) -> None:
    ip.run_cell("import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
                "def pad_batch(items):\n    return torch.stack([x for (x,) in items])\n"
                "loader = DataLoader(TensorDataset(torch.zeros(256, 4)), batch_size=16, collate_fn=pad_batch,\n"
                "                    num_workers=1, multiprocessing_context='spawn')").raise_error()
    children = child_pids()
    result = ip.run_line_magic("dataprobe", "loader --workers 0,1 --seconds 2 -q -o")
    (finding,) = [finding for finding in result.pitfalls if finding.code == "NOTEBOOK_SPAWN_PICKLING"]
    assert "the collate_fn `pad_batch`" in finding.headline
    assert {trial.settings.num_workers for trial in result.trials} == {0}
    assert child_pids() == children
