"""jupyter-gpu: is PyTorch really using the GPU, why not, and exactly how to fix it.

Importing this package has no side effects: no NVML, no CUDA, no torch import. Everything heavy is
imported when a magic, the CLI or `require_gpu()` runs.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["GpuCheckReport", "GpuUnavailableError", "__version__", "require_gpu"]


def load_ipython_extension(ipython: Any) -> None:
    from jupyter_gpu.magics import GpuCheckMagics

    ipython.register_magics(GpuCheckMagics)


def unload_ipython_extension(ipython: Any) -> None:
    from jupyter_gpu.magics import MAGIC_NAMES

    registry = ipython.magics_manager.magics
    for kind, names in MAGIC_NAMES.items():
        for name in names:
            registry[kind].pop(name, None)
    ipython.magics_manager.registry.pop("GpuCheckMagics", None)


def __getattr__(name: str) -> Any:
    # Lazy public names keep `import jupyter_gpu` instant and free of torch/IPython imports.
    if name in ("require_gpu", "GpuUnavailableError"):
        from jupyter_gpu import gate

        return getattr(gate, name)
    if name == "GpuCheckReport":
        from jupyter_gpu.report import GpuCheckReport

        return GpuCheckReport
    raise AttributeError(f"module 'jupyter_gpu' has no attribute {name!r}")
