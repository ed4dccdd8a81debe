"""`%dataprobe`'s pitfalls, found on real loaders before any worker process starts."""

from __future__ import annotations

import multiprocessing
import subprocess
from pathlib import Path

import pytest
import torch
from processes import child_pids
from torch.utils.data import DataLoader, Dataset, TensorDataset

from jupyter_gpu.dataprobe.pitfalls import check_pitfalls
from jupyter_gpu.dataprobe.settings import LoaderSettings
from jupyter_gpu.facts.context import ProbeContext

MIB = 1 << 20
SWEEP = [LoaderSettings(0), LoaderSettings(1), LoaderSettings(2)]


def codes(pitfalls):
    return [f.code for f in pitfalls.findings]




@pytest.fixture
def machine_root(tmp_path: Path):
    """A machine root whose /dev/shm is a real tmpfs of the size asked for (skips where mount is refused)."""
    mounted: list[Path] = []

    def with_shm(size: str) -> ProbeContext:
        target = tmp_path / size / "root" / "dev" / "shm"
        target.mkdir(parents=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(target)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(target)
        return ProbeContext(root=tmp_path / size / "root", env={})

    yield with_shm
    for target in mounted:
        subprocess.run(["umount", str(target)], check=True)


def test_a_notebook_dataset_under_spawn_blocks_workers_before_any_starts(shell):
    shell.run_cell(
        "import torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class NotebookDataset(Dataset):\n"
        "    def __len__(self):\n"
        "        return 64\n"
        "    def __getitem__(self, i):\n"
        "        return torch.tensor([float(i)])\n"
        "spawn_loader = DataLoader(NotebookDataset(), batch_size=8, num_workers=2, multiprocessing_context='spawn')\n"
    )
    loader = shell.user_ns["spawn_loader"]
    try:
        assert type(loader.dataset).__module__ == "__main__"  # what a class defined in a cell reports
        before_children, before_active = child_pids(), multiprocessing.active_children()
        pitfalls = check_pitfalls(loader, "spawn_loader", SWEEP, ctx=ProbeContext(root=Path("/nonexistent"), env={}))
        assert child_pids() == before_children and multiprocessing.active_children() == before_active
        assert loader._iterator is None  # the user's loader was not iterated either
    finally:
        for name in ("NotebookDataset", "spawn_loader"):
            shell.user_ns.pop(name, None)
    assert codes(pitfalls) == ["NOTEBOOK_SPAWN_PICKLING"]
    assert pitfalls.workers_blocked == (
        "No worker setting can run: workers started with 'spawn' cannot import the dataset class `NotebookDataset`, "
        "defined in the notebook; only num_workers=0 loads here."
    )
    assert "from datasets import NotebookDataset" in pitfalls.findings[0].fix
    assert pitfalls.shm_bytes is None  # no /dev/shm under that root


def test_a_small_shm_is_sized_from_the_sweeps_largest_setting(machine_root):
    ctx = machine_root("64m")  # Docker's default
    # One sample is 1 MiB, one batch of 16 is 16 MiB. The user's own loader has no workers at all: the rules judge
    # the 2 workers the sweep would start.
    loader = DataLoader(TensorDataset(torch.zeros(32, 256, 1024)), batch_size=16)
    pitfalls = check_pitfalls(loader, "loader", SWEEP, ctx=ctx)
    assert pitfalls.shm_bytes == 64 * MIB and pitfalls.batch_bytes == 16 * MIB
    assert codes(pitfalls) == ["SHM_TOO_SMALL"] and pitfalls.workers_blocked is None
    (shm,) = pitfalls.findings
    assert shm.evidence["batches_in_flight"] == [
        "`loader`: 2 workers x prefetch_factor 2 x batch_size 16 x 1.0 MiB per sample = 64.0 MiB"]
    # 2 workers x 2 batches x 16 MiB, doubled, is 128 MiB: over the 64 MiB there.
    assert not pitfalls.fits_shm(LoaderSettings(2))
    assert not pitfalls.fits_shm(LoaderSettings(1, prefetch_factor=4))
    assert pitfalls.fits_shm(LoaderSettings(1))  # 1 x 2 x 16 MiB, doubled: 64 MiB fits
    assert pitfalls.fits_shm(LoaderSettings(2), 4 * MIB)  # the same setting with small batches
    assert pitfalls.fits_shm(LoaderSettings(0))  # no workers, nothing in /dev/shm


def test_a_measured_batch_size_replaces_the_sample_estimate(machine_root):
    ctx = machine_root("64m")
    loader = DataLoader(TensorDataset(torch.zeros(32, 4)), batch_size=16)
    pitfalls = check_pitfalls(loader, "loader", [LoaderSettings(2, prefetch_factor=4)], ctx=ctx,
                              batch_bytes=8 * MIB)
    (shm,) = pitfalls.findings
    assert shm.evidence["batches_in_flight"] == [
        "`loader`: 2 workers x prefetch_factor 4 x 8.0 MiB per batch (measured) = 64.0 MiB"]
    assert pitfalls.batch_bytes == 8 * MIB and not pitfalls.fits_shm(LoaderSettings(2, prefetch_factor=4))


class RecordsDataset(Dataset):
    def __init__(self) -> None:
        self.records = [f"image_{i:07d}.jpg" for i in range(200_000)]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.zeros(3)


def test_a_large_python_list_gives_copy_on_read_for_the_workers_the_sweep_starts():
    loader = DataLoader(RecordsDataset(), batch_size=32)
    pitfalls = check_pitfalls(loader, "loader", SWEEP, ctx=ProbeContext(root=Path("/nonexistent"), env={}))
    assert codes(pitfalls) == ["DATASET_COPY_ON_READ"] and pitfalls.workers_blocked is None
    (f,) = pitfalls.findings
    assert "`dataset.records` (list, 200,000 items)" in f.headline and "each of its 2 workers" in f.headline
    # A sweep that starts no worker has no worker pitfall.
    assert check_pitfalls(loader, "loader", [LoaderSettings(0)],
                          ctx=ProbeContext(root=Path("/nonexistent"), env={})).findings == []


def test_a_plain_fork_loader_on_the_cpu_has_no_pitfalls(machine_root):
    ctx = machine_root("2g")
    loader = DataLoader(TensorDataset(torch.zeros(256, 8), torch.zeros(256)), batch_size=32, num_workers=2,
                        multiprocessing_context="fork")
    pitfalls = check_pitfalls(loader, "loader", [*SWEEP, LoaderSettings(2, prefetch_factor=4)], ctx=ctx)
    assert pitfalls.findings == [] and pitfalls.workers_blocked is None
    assert pitfalls.shm_bytes == 2 << 30 and pitfalls.fits_shm(LoaderSettings(2, prefetch_factor=4))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_tensors_in_a_forked_dataset_block_workers_and_the_worker_fails_as_said():
    loader = DataLoader(TensorDataset(torch.zeros(64, 4, device="cuda")), batch_size=8, num_workers=1,
                        multiprocessing_context="fork")
    pitfalls = check_pitfalls(loader, "loader", SWEEP, ctx=ProbeContext(root=Path("/nonexistent"), env={}))
    assert codes(pitfalls) == ["CUDA_IN_FORKED_WORKER"]
    assert pitfalls.workers_blocked is not None and "forked workers cannot use CUDA" in pitfalls.workers_blocked
    # What the finding predicts, seen for real: the worker fails with one of the two errors the headline quotes
    # (torch 2.11 on the H200 gave the driver's, reading the parent's tensor; AcceleratorError is a RuntimeError).
    (f,) = pitfalls.findings
    with pytest.raises(RuntimeError, match=r"Cannot re-initialize CUDA in forked|CUDA error: initialization error"):
        next(iter(loader))
    assert "CUDA error: initialization error" in f.headline and "Cannot re-initialize CUDA" in f.headline
