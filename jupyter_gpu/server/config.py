"""Server-side settings: `c.JupyterGpu.interval = 2` in jupyter_server_config.py, or `--JupyterGpu.interval=2`."""

from __future__ import annotations

from traitlets import Bool, Float, Int, TraitError, validate
from traitlets.config import Configurable

from jupyter_gpu.metrics.sampler import MIN_INTERVAL


class JupyterGpu(Configurable):
    interval = Float(1.0, config=True, help="Seconds between GPU readings (one sampler for every client).")
    history = Int(600, config=True, help="Readings kept on the server, so a reopened panel shows its past.")
    history_seconds = Float(
        3600.0, config=True,
        help="Seconds of each GPU's utilisation and memory the server keeps for the panel's long charts (1 h by "
             "default), sent downsampled (min, mean and max per bucket). 16 bytes per GPU per reading, fixed at "
             "start-up: an hour of eight GPUs at 1 s is 0.5 MB.")
    freeze_startup_objects = Bool(
        True, config=True,
        help="Once the server has started, move the objects start-up made (modules, classes, JupyterLab's "
             "extensions: some 200,000) out of the garbage collector's full collections with gc.freeze(). Each "
             "full collection otherwise stops the event loop for about 100 ms, the tail of a burst of panel polls. "
             "Objects made later are collected as before.")

    @validate("interval")
    def _check_interval(self, proposal: dict) -> float:
        value = proposal["value"]
        if not value >= MIN_INTERVAL:
            raise TraitError(f"JupyterGpu.interval must be at least {MIN_INTERVAL} s, got {value!r}.")
        return value

    @validate("history_seconds")
    def _check_history_seconds(self, proposal: dict) -> float:
        value = proposal["value"]
        if not value >= 60:
            raise TraitError(f"JupyterGpu.history_seconds must keep at least 60 s, got {value!r}.")
        return value

    @validate("history")
    def _check_history(self, proposal: dict) -> int:
        if proposal["value"] < 1:
            raise TraitError(f"JupyterGpu.history must keep at least 1 reading, got {proposal['value']!r}.")
        return proposal["value"]
