"""How busy the GPU was while a cell ran, from NVML utilisation sampled on the shared sampler class."""

from __future__ import annotations

import time

from jupyter_gpu.backends import Backend
from jupyter_gpu.metrics import Sample
from jupyter_gpu.sampler import Sampler
from jupyter_gpu.timing.result import GpuBusy

SAMPLE_INTERVAL = 0.1  # the sampler's floor: NVML itself averages utilisation over 1/6 s to 1 s
MIN_SAMPLED_SECONDS = 0.25


class BusyWatch:
    """Samples utilisation on a background thread between `start()` and `stop()`."""

    def __init__(self, backend: Backend, first: Sample) -> None:
        self._first = first
        self._sampler = Sampler(backend, interval=SAMPLE_INTERVAL, history=100_000)
        self._started = 0.0
        self._elapsed = 0.0

    def start(self) -> None:
        self._started = time.time()
        self._sampler.start()

    def stop(self) -> None:
        self._elapsed = time.time() - self._started
        self._sampler.read_now()  # the driver's average over the cell's last moments
        self._sampler.stop()

    def result(self, uuids: set[str] | None = None) -> tuple[GpuBusy | None, str | None, list[str]]:
        """(busy fraction, or a note saying why there is none, performance throttle reasons seen)."""
        # The reading taken as the cell started reflects the time before it, so it is left out.
        samples = [s for s in self._sampler.history(since=self._started) if s.status == "ok"]
        throttles = sorted({reason for s in samples for d in s.devices if d.throttled
                            for reason in d.throttle_reasons or () if reason != "gpu_idle"})
        if self._elapsed < MIN_SAMPLED_SECONDS:
            return None, f"cell too short to sample (< {MIN_SAMPLED_SECONDS} s); NVML averages over longer", throttles
        readings: list[float] = []
        devices: set[str] = set()
        for sample in samples:
            for device in sample.devices:
                if device.utilization_gpu is None or (uuids and device.uuid not in uuids):
                    continue
                readings.append(device.utilization_gpu)
                devices.add(device.label)
        if not readings:
            return None, "NVML reported no utilisation for these GPUs", throttles
        busy = GpuBusy(percent=sum(readings) / len(readings), samples=len(readings), devices=sorted(devices),
                       simulated=self._first.simulated)
        return busy, None, throttles
