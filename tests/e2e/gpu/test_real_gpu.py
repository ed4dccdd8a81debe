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


def test_magic_never_initialises_cuda_in_the_kernel():
    import torch
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython() or InteractiveShell.instance()
    shell.run_line_magic("load_ext", "jupyter_gpu")
    report = shell.run_line_magic("gpucheck", "-q -o")
    assert report.gpu_usable, str(report)
    assert not torch.cuda.is_initialized()
    # Once the user has initialised CUDA, the in-kernel facts are read too.
    torch.ones(1, device="cuda")
    report = shell.run_line_magic("gpucheck", "-q -o --refresh")
    assert report.facts["in_kernel"]["cuda_initialized"] is True
    assert report.facts["in_kernel"]["device_count"] == torch.cuda.device_count()
