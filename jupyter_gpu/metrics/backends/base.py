"""What every metrics backend is: the `Backend` protocol, the error for a spec that names none, the variable.

Apart from the implementations, so the sampler, the hub and the recording format get their types without
importing NVML, the simulated scenarios or the replay of a recording.
"""

from __future__ import annotations

from typing import Protocol

from jupyter_gpu.metrics.sample import Sample

# Chooses the backend for every surface: `simulated:NAME`, `replay:FILE` or (empty, the default) `nvml`.
BACKEND_ENV = "JUPYTER_GPU_BACKEND"


class Backend(Protocol):
    name: str
    simulated: bool

    def read(self) -> Sample:
        """One reading of every device. NVML/driver problems become statuses in the Sample, never exceptions."""
        ...

    def close(self) -> None: ...


class BackendSpecError(ValueError):
    """A backend spec the user gave (argument or environment variable) that names no backend."""
