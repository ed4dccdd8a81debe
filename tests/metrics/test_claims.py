"""Simulated GPU memory held by real processes: how demos and browser tests make a notebook hold a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_gpu.metrics.backends.claims import CLAIMS_ENV, claim_memory, release_memory
from jupyter_gpu.metrics.backends.simulated import SimulatedBackend
from jupyter_gpu.rendering.units import parse_bytes


def test_a_claim_adds_the_process_and_its_memory_to_the_simulated_gpu(tmp_path: Path) -> None:
    backend = SimulatedBackend("a100x8-mig", clock=lambda: 0.0, claims_dir=str(tmp_path))
    before = backend.read().devices[4]
    claim_memory("22GB", device=4, directory=tmp_path)
    after = backend.read().devices[4]
    assert after.memory_used == before.memory_used + 22 * 10**9
    mine = [p for p in after.processes or () if p.pid == __import__("os").getpid()]
    assert [p.memory_used for p in mine] == [22 * 10**9]
    release_memory(directory=tmp_path)
    assert backend.read().devices[4] == before


def test_claims_of_a_process_that_ended_are_ignored(tmp_path: Path) -> None:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                           check=True)
    claim_memory(10**9, device=0, directory=tmp_path, pid=int(child.stdout))
    backend = SimulatedBackend("h200", clock=lambda: 0.0, claims_dir=str(tmp_path))
    assert backend.read().devices[0].processes == ()


def test_a_claim_never_fills_a_gpu_past_its_total_and_skips_missing_devices(tmp_path: Path) -> None:
    claim_memory("1TiB", device=0, directory=tmp_path)
    claim_memory("1GiB", device=3, directory=tmp_path)  # the H200 scenario has one GPU: nothing to add to
    device = SimulatedBackend("h200", clock=lambda: 0.0, claims_dir=str(tmp_path)).read().devices[0]
    assert device.memory_used == device.memory_total


def test_the_environment_variable_names_the_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CLAIMS_ENV, str(tmp_path / "claims"))
    path = claim_memory(parse_bytes("512MiB"), device=0)
    assert path.parent == tmp_path / "claims"
    assert SimulatedBackend("h200", clock=lambda: 0.0).read().devices[0].processes[0].memory_used == 512 * 1024**2


def test_claiming_without_a_directory_or_with_a_negative_amount_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CLAIMS_ENV, raising=False)
    with pytest.raises(ValueError, match=CLAIMS_ENV):
        claim_memory(1)
    with pytest.raises(ValueError, match="non-negative"):
        claim_memory(-1, directory="/tmp")
