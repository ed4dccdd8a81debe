"""Checks that need a real NVIDIA GPU. Not part of the default run (`-m "not gpu"`); scripts/gpu-check.sh runs them."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


def test_cli_verdict_on_a_real_gpu():
    done = subprocess.run([sys.executable, "-m", "jupyter_gpu", "check", "-v"], capture_output=True, text=True,
                          timeout=180)
    print(done.stdout)
    assert done.stdout.startswith(("✓ PyTorch can use", "! PyTorch can use")), done.stdout[:2000]
    assert done.returncode == 0


def test_magic_never_initialises_cuda_in_the_kernel(fresh_kernel):
    # In a process of its own: in this one, an earlier test or the GPU check's own steps may have initialised CUDA.
    out = fresh_kernel("""
        import torch
        report = ip.run_line_magic("gpucheck", "-q -o")
        before = {"usable": report.gpu_usable, "text": str(report), "initialised": torch.cuda.is_initialized()}
        # Once the user has initialised CUDA, the in-kernel facts are read too.
        torch.ones(1, device="cuda")
        report = ip.run_line_magic("gpucheck", "-q -o --refresh")
        print(json.dumps({**before, "in_kernel": report.facts["in_kernel"], "device_count": torch.cuda.device_count()}))
    """)
    assert out["usable"], out["text"]
    assert out["initialised"] is False
    assert out["in_kernel"]["cuda_initialized"] is True
    assert out["in_kernel"]["device_count"] == out["device_count"]
