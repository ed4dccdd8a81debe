"""CUDA state the GPU tests must know about: whether there is a GPU at all, and cuBLAS's workspaces, which
PyTorch's allocator counts with no tensor behind them. A plain module (pytest puts this folder on sys.path), so that
test modules and the conftest import the same functions."""

from __future__ import annotations

from functools import cache


@cache
def cuda_missing() -> str | None:
    """Why the GPU tests cannot run here, or None. Asked once per process, and only when a gpu-marked test is about
    to run: collecting the CPU suite, where these tests are deselected, never imports torch for it."""
    try:
        import torch
    except ImportError as exc:
        return f"needs a CUDA GPU; torch is not importable here ({exc})"
    if not torch.cuda.is_available():
        return (f"needs a CUDA GPU; torch.cuda.is_available() is False here (torch {torch.__version__}, "
                f"CUDA build {torch.version.cuda})")
    return None


def warm_up_cuda_libraries() -> int:
    """Have cuBLAS and cuBLASLt allocate their workspaces now, and return the bytes those take.

    Each takes a workspace per (handle, stream) from PyTorch's caching allocator at its first matrix product, about
    32 MiB on sm_90, which `torch.cuda.memory_allocated()` counts with no tensor behind it and which stays for the
    process's life. The forward pass runs on this thread and the backward pass on autograd's device thread, each
    with its own handle, so both run here. A test that measures memory from before a process's first product would
    otherwise count them as its own; started from cleared workspaces (as torch's own leak check does), the figure
    is the same whichever test runs first.
    """
    import torch

    torch.cuda.synchronize()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    before = torch.cuda.memory_allocated()
    layer = torch.nn.Linear(64, 64, device="cuda")  # addmm with a bias: the cuBLASLt path
    x = torch.randn(32, 64, device="cuda", requires_grad=True)
    (layer(x) @ layer.weight).sum().backward()  # mm: the cuBLAS path, forward here and backward on autograd's thread
    torch.cuda.synchronize()
    del layer, x
    return torch.cuda.memory_allocated() - before
