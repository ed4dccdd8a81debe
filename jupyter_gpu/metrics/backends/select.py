"""Which backend a spec names: the real NVML, a named simulated scenario, or a recording being replayed.

The simulated and replay backends are never a silent fallback: a user whose NVML is broken must see
`no_driver`, not a healthy-looking fake H200. They are chosen only by `JUPYTER_GPU_BACKEND=simulated:NAME`
or `replay:FILE`, or by passing a spec, and every sample they give is marked simulated. Each implementation
is imported only when its spec is chosen.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from jupyter_gpu.metrics.backends.base import BACKEND_ENV, Backend, BackendSpecError


def _nvml(argument: str | None, where: str) -> Backend:
    from jupyter_gpu.metrics.backends.nvml import NvmlBackend

    if argument is not None:
        raise BackendSpecError(f"The 'nvml' backend takes no argument ({where}); {_choices()}.")
    return NvmlBackend()


def _simulated(argument: str | None, where: str) -> Backend:
    from jupyter_gpu.metrics.backends.simulated import SCENARIOS, SimulatedBackend

    if not argument:
        raise BackendSpecError(f"The simulated backend needs a scenario name ({where}); {_choices()}.")
    if argument not in SCENARIOS:
        raise BackendSpecError(f"Unknown simulated scenario {argument!r} ({where}); {_choices()}.")
    return SimulatedBackend(argument)


def _replay(argument: str | None, where: str) -> Backend:
    from jupyter_gpu.metrics.backends.replay import ReplayBackend

    if not argument:
        raise BackendSpecError(f"The replay backend needs the recording to play, as replay:FILE ({where}); "
                               f"{_choices()}.")
    return ReplayBackend(argument)  # a file it cannot replay is a BackendSpecError naming the file


# kind -> factory(argument after the first ":" or None, where the spec came from).
_FACTORIES: dict[str, Callable[[str | None, str], Backend]] = {
    "nvml": _nvml,
    "simulated": _simulated,
    "replay": _replay,
}


def _choices() -> str:
    from jupyter_gpu.metrics.backends.simulated import SCENARIOS

    scenarios = ", ".join(f"simulated:{name}" for name in SCENARIOS)
    return f"use 'nvml' (the default), one of {scenarios}, or replay:FILE to play back a `jupyter-gpu record` file"


def select_backend(spec: str | None = None, env: Mapping[str, str] | None = None) -> Backend:
    """The backend a spec names; with no spec, the one `JUPYTER_GPU_BACKEND` names, else NVML."""
    source = "the backend spec"
    if spec is None:
        environ = os.environ if env is None else env
        spec = environ.get(BACKEND_ENV, "")
        source = BACKEND_ENV
    text = spec.strip()
    if not text:
        return _nvml(None, "the default")
    where = f"{spec!r} in {source}"
    kind, sep, argument = text.partition(":")
    factory = _FACTORIES.get(kind.strip().lower())
    if factory is None:
        raise BackendSpecError(f"Unknown GPU backend {where}; {_choices()}.")
    return factory(argument.strip() if sep else None, where)
