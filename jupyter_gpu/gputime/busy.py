"""How busy the GPU was while a cell ran, from NVML utilisation on the process's shared sampler.

The watch holds a lease at the sampler's floor while the cell runs, so an open `%gpupanel` and the timing
share one thread (which polls faster for the duration), and it collects only the samples taken during the cell.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from jupyter_gpu.gputime.result import GpuBusy
from jupyter_gpu.kernel_torch import uses_device
from jupyter_gpu.metrics.hub import Lease
from jupyter_gpu.metrics.sample import Sample

SAMPLE_INTERVAL = 0.1  # the sampler's floor: NVML itself averages utilisation over 1/6 s to 1 s
MIN_SAMPLED_SECONDS = 0.25


class BusyWatch:
    """Samples utilisation on a background thread between `start()` and `stop()`."""

    def __init__(self, lease: Lease, first: Sample) -> None:
        self._lease = lease  # taken at SAMPLE_INTERVAL by the caller; closed by stop()
        self._first = first
        self._samples: list[Sample] = []
        self._unsubscribe: Callable[[], None] | None = None
        self._started = 0.0
        self._elapsed = 0.0

    def start(self) -> None:
        self._started = time.time()
        self._unsubscribe = self._lease.sampler.subscribe(self._samples.append)
        self._lease.hub.start()

    def stop(self) -> None:
        self._elapsed = time.time() - self._started
        try:
            self._lease.sampler.read_now()  # the driver's average over the cell's last moments
        finally:
            if self._unsubscribe is not None:
                self._unsubscribe()
            self._lease.close()

    def result(self, uuids: set[str] | None = None) -> tuple[GpuBusy | None, str | None, list[str]]:
        """(busy fraction, or a note saying why there is none, performance throttle reasons seen).

        `uuids`: the bare UUIDs of the devices the cell used (`kernel_torch.torch_uuid`); None for every GPU.
        """
        # The reading taken as the cell started reflects the time before it, so it is left out.
        samples = [s for s in self._samples if s.timestamp > self._started and s.status == "ok"]
        throttles = sorted({reason for s in samples for d in s.devices if d.throttled
                            for reason in d.throttle_reasons or () if reason != "gpu_idle"})
        if self._elapsed < MIN_SAMPLED_SECONDS:
            return None, f"cell too short to sample (< {MIN_SAMPLED_SECONDS} s); NVML averages over longer", throttles
        readings: list[float] = []
        devices: set[str] = set()
        for sample in samples:
            for device in sample.devices:
                if device.utilization_gpu is None or (uuids and not uses_device(device, uuids)):
                    continue
                readings.append(device.utilization_gpu)
                devices.add(device.label)
        if not readings:
            return None, "NVML reported no utilisation for these GPUs", throttles
        busy = GpuBusy(percent=sum(readings) / len(readings), samples=len(readings), devices=sorted(devices),
                       simulated=self._first.simulated)
        return busy, None, throttles
