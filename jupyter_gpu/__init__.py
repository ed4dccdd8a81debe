"""jupyter-gpu: is PyTorch really using the GPU, why not, and exactly how to fix it.

Importing this package has no side effects: no NVML, no CUDA, no torch import. Everything heavy is
imported when a magic, the CLI or `require_gpu()` runs.
"""

from __future__ import annotations

from typing import Any

from jupyter_gpu.version import __version__

__all__ = ["AllReduceResult", "BatchProbeResult", "Comparison", "DataProbeResult", "GpuCheckReport", "GpuTimeResult",
           "GpuUnavailableError", "MemoryMap", "ProfileResult", "ReadinessReport", "SpeedProbeResult", "__version__",
           "compare", "memory_map", "probe_batch_size", "probe_loader", "probe_speed", "profile_training",
           "require_gpu", "run_allreduce"]


def load_ipython_extension(ipython: Any) -> None:
    from jupyter_gpu.magics import magic_classes

    for magics in magic_classes():
        ipython.register_magics(magics)


def unload_ipython_extension(ipython: Any) -> None:
    from jupyter_gpu.magics import MAGIC_NAMES, magic_classes

    registry = ipython.magics_manager.magics
    for kind, names in MAGIC_NAMES.items():
        for name in names:
            registry[kind].pop(name, None)
    for magics in magic_classes():
        instance = ipython.magics_manager.registry.pop(magics.__name__, None)
        close = getattr(instance, "close", None)
        if close is not None:
            close()
    from jupyter_gpu.metrics.hub import close_shared_hubs

    close_shared_hubs()  # whatever still holds a lease (a panel object kept in a variable) stops updating


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    # The side panel's built front end, installed into share/jupyter/labextensions/jupyter-gpu by the wheel.
    return [{"src": "labextension", "dest": "jupyter-gpu"}]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    # An app, not only a module: jupyter_server gives shutdown hooks to extension apps alone.
    from jupyter_gpu.server.extension import GpuPanelExtension

    return [{"module": "jupyter_gpu", "app": GpuPanelExtension}]


def __getattr__(name: str) -> Any:
    # Lazy public names keep `import jupyter_gpu` instant and free of torch/IPython imports.
    if name in ("require_gpu", "GpuUnavailableError"):
        from jupyter_gpu.gpucheck import gate

        return getattr(gate, name)
    if name in ("compare", "Comparison"):
        from jupyter_gpu.gputime import compare

        return getattr(compare, name)
    if name == "run_allreduce":
        from jupyter_gpu.distributed.allreduce import run_allreduce

        return run_allreduce
    if name == "AllReduceResult":
        from jupyter_gpu.distributed.collective import AllReduceResult

        return AllReduceResult
    if name == "ReadinessReport":
        from jupyter_gpu.distributed.report import ReadinessReport

        return ReadinessReport
    if name == "profile_training":
        from jupyter_gpu.gpuprofile.runner import profile_training

        return profile_training
    if name == "ProfileResult":
        from jupyter_gpu.gpuprofile.result import ProfileResult

        return ProfileResult
    if name == "GpuTimeResult":
        from jupyter_gpu.gputime.result import GpuTimeResult

        return GpuTimeResult
    if name == "probe_batch_size":
        from jupyter_gpu.batchprobe.runner import probe_batch_size

        return probe_batch_size
    if name == "BatchProbeResult":
        from jupyter_gpu.batchprobe.result import BatchProbeResult

        return BatchProbeResult
    if name == "probe_loader":
        from jupyter_gpu.dataprobe.runner import probe_loader

        return probe_loader
    if name == "DataProbeResult":
        from jupyter_gpu.dataprobe.result import DataProbeResult

        return DataProbeResult
    if name == "probe_speed":
        from jupyter_gpu.speedprobe.runner import probe_speed

        return probe_speed
    if name == "SpeedProbeResult":
        from jupyter_gpu.speedprobe.result import SpeedProbeResult

        return SpeedProbeResult
    if name == "memory_map":
        from jupyter_gpu.gpumem.runner import memory_map

        return memory_map
    if name == "MemoryMap":
        from jupyter_gpu.gpumem.result import MemoryMap

        return MemoryMap
    if name == "GpuCheckReport":
        from jupyter_gpu.gpucheck.report import GpuCheckReport

        return GpuCheckReport
    raise AttributeError(f"module 'jupyter_gpu' has no attribute {name!r}")
