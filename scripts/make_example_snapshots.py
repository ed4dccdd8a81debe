"""Regenerate the facts snapshots used by example_notebooks/01_gpucheck.ipynb.

They come from fake machines (tests/fixtures/fake_machine.py) gathered by the real code, and are marked
simulated, so the notebook can show GPU diagnoses on a machine without a GPU. Run with the project's venv:
    .venv/bin/python scripts/make_example_snapshots.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "fixtures"))

from fake_machine import Machine  # noqa: E402

from jupyter_gpu.facts.gather import gather_facts  # noqa: E402
from jupyter_gpu.facts.notebook import gather_notebook_facts  # noqa: E402

TOO_OLD = ("CUDA initialization: The NVIDIA driver on your system is too old (found version 12080). Please update "
           "your GPU driver by downloading and installing a new version from the URL: "
           "http://www.nvidia.com/Download/index.aspx Alternatively, go to: https://pytorch.org to install a PyTorch "
           "version that has been compiled with your version of the CUDA driver.")


def notebook_with_slow_settings() -> dict:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    namespace = {
        "model": torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)),
        "loader": DataLoader(TensorDataset(torch.zeros(256, 512)), batch_size=64),
    }
    return gather_notebook_facts(namespace)


NMS = "RuntimeError: operator torchvision::nms does not exist"

SCENARIOS = {
    "h100-cpu-wheel": (Machine().nvidia_host(cuda=12080).cpu_torch("2.13.0+cpu"), None),
    "driver-too-old": (Machine().nvidia_host(cuda=12080).cuda_torch(
        "2.11.0+cu130", "13.0", devices=[], device_count=0, warnings=[TOO_OLD]), None),
    "h100-notebook-audit": (Machine().nvidia_host().cuda_torch(), notebook_with_slow_settings),
    # torch from the cu128 index, then `pip install torchvision` from PyPI, whose 0.24.1 is a CUDA 12.8 build
    # too but was built for torch 2.9.1: the probe imports it beside torch and quotes its error.
    "h100-torchvision-mismatch": (Machine().nvidia_host().cuda_torch("2.8.0+cu128").companion(
        "torchvision", "0.24.1", requires_torch="2.9.1", import_error=NMS), None),
}


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        bare = Path(scratch) / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
        for name, (machine, notebook) in SCENARIOS.items():
            ctx = machine.build(Path(scratch) / name, str(bare / "bin" / "python"))
            snapshot = gather_facts(ctx, notebook=notebook() if notebook else None)
            snapshot["context"]["simulated"] = f"fake machine '{name}' (scripts/make_example_snapshots.py)"
            text = json.dumps(snapshot, indent=2, sort_keys=True).replace(scratch, "/fake")
            (REPO / "example_notebooks" / "snapshots" / f"{name}.json").write_text(text + "\n")
            print("wrote", name)


if __name__ == "__main__":
    main()
