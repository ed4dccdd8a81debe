"""`GpuPanel`: a live ipywidgets view of every GPU, fed by a lease on the process's shared sampler.

Updates run on the sampler thread (never the kernel's), so a training cell keeps the kernel while the panel
moves; each widget whose value changed sends one small comm message. Closing the panel closes its lease: the
last lease stops the thread.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from html import escape

import ipywidgets as widgets

from jupyter_gpu.kernel_torch import with_torch_memory
from jupyter_gpu.metrics.alerts import Alert, KernelView, sample_alerts
from jupyter_gpu.metrics.hub import RateLimiter, SamplerHub
from jupyter_gpu.metrics.sample import DeviceSample, Sample
from jupyter_gpu.widgets import view

VERDICT_THREAD_NAME = "jupyter-gpu-verdict"
BAR_STYLE = {None: "", "warn": "warning", "fail": "danger"}


class DeviceRow(widgets.VBox):
    """One GPU: a title, utilisation and memory bars each with a sparkline and figures, and one block for
    processes, MIG slices and alerts. Few widgets on purpose: each changed widget is one comm message a second.
    """

    def __init__(self, index: int) -> None:
        self.index = index
        self.title = widgets.HTML()
        self.utilization = widgets.FloatProgress(min=0, max=100, description="GPU",
                                                 layout=widgets.Layout(width="14em"))
        self.utilization_line = widgets.HTML()  # sparkline and figures
        self.memory = widgets.FloatProgress(min=0, max=100, description="Memory", layout=widgets.Layout(width="14em"))
        self.memory_line = widgets.HTML()
        self.details = widgets.HTML()  # processes, MIG slices, alerts
        super().__init__([
            self.title,
            widgets.HBox([self.utilization, self.utilization_line]),
            widgets.HBox([self.memory, self.memory_line]),
            self.details,
        ], layout=widgets.Layout(margin="0 0 .6em 0"))

    def show(self, device: DeviceSample, history: Sequence[DeviceSample | None], alerts: list[Alert],
             kernel: KernelView, simulated_label: str) -> None:
        self.title.value = view.device_title_html(device, simulated_label)
        if device.status != "ok":
            self.utilization.value = self.memory.value = 0
            self.utilization.bar_style = self.memory.bar_style = "danger"
            self.utilization_line.value = self.memory_line.value = "n/a"
            self.details.value = view.alerts_html(alerts)
            return
        severity = {a.code: a.severity for a in alerts}
        self.utilization.value = device.utilization_gpu or 0.0
        self.utilization.bar_style = BAR_STYLE[severity.get("GPU_IDLE_DURING_CELL")]
        spark = view.sparkline_svg([None if d is None else d.utilization_gpu for d in history], 100,
                                   view.UTILIZATION_COLOUR)
        self.utilization_line.value = f"{spark} {escape(view.utilization_text(device))}"
        fraction = device.memory_fraction
        self.memory.value = 0.0 if fraction is None else 100 * fraction
        self.memory.bar_style = BAR_STYLE[severity.get("MEMORY_NEARLY_FULL")]
        spark = view.sparkline_svg([None if d is None else d.memory_used for d in history], device.memory_total or 0,
                                   view.MEMORY_COLOUR)
        self.memory_line.value = f"{spark} {escape(view.memory_text(device, kernel))}"
        blocks = [view.processes_html(device, kernel), view.mig_html(device), view.alerts_html(alerts)]
        self.details.value = "".join(f"<div>{block}</div>" for block in blocks if block)


class GpuPanel(widgets.VBox):
    """`GpuPanel(shared_hub())` shows every GPU, live; `close()` stops its updates."""

    def __init__(
        self,
        hub: SamplerHub,
        *,
        interval: float = 1.0,
        history: int = 60,
        devices: Sequence[int] | None = None,
        cell_started: Callable[[], float | None] = lambda: None,
        verdict: Callable[[], str] | None = None,
        pids: frozenset[int] | None = None,
    ) -> None:
        self.interval = interval
        self.history_length = history
        self.devices = None if devices is None else tuple(devices)
        self._cell_started = cell_started
        self._verdict = verdict
        self._pids = frozenset({os.getpid()}) if pids is None else pids
        self._lock = threading.Lock()  # one update at a time: the sampler thread, or read_now() from another
        self._history: deque[Sample] = deque(maxlen=history)
        self._limiter = RateLimiter(interval)
        self._rows: dict[int, DeviceRow] = {}
        self._verdict_started = False
        self.closed = False
        self.alerts: list[Alert] = []
        self.heading = widgets.HTML()
        self.message = widgets.HTML()
        self.verdict_box = widgets.HTML()
        self.close_button = widgets.Button(description="Close", tooltip="stop updating and remove this panel",
                                           layout=widgets.Layout(width="6em"))
        self.close_button.on_click(lambda _: self.close())
        self.body = widgets.VBox()
        super().__init__([widgets.HBox([self.heading, self.close_button]), self.message, self.verdict_box, self.body])
        try:
            self._lease = hub.acquire(interval, self._on_sample, start=False)
        except BaseException:
            self.close()  # a bad JUPYTER_GPU_BACKEND must not leave these widgets registered in the kernel
            raise
        sampler = self._lease.sampler
        self.backend_name = sampler.backend.name
        self.simulated = sampler.backend.simulated
        # Fixed for the panel's life: set once here, not rebuilt on every update.
        self.heading.value = (f"<b>GPUs</b> <span style=\"opacity:.75\">{escape(self.backend_name)} · every "
                              f"{self.interval:g} s</span>" + (' <span style="opacity:.75">[simulated]</span>'
                                                                if self.simulated else ""))
        # A panel opened later starts with the history already sampled, thinned to its own rate; the grid of
        # its own updates starts at the fresh reading below, which it always shows.
        thinning = RateLimiter(interval)
        self._history.extend(past for past in sampler.history() if thinning.due(past))
        self.first = sampler.read_now()  # feeds this panel through _on_sample
        hub.start()

    # -- what tests and the magic read ---------------------------------------------------------------

    @property
    def latest(self) -> Sample | None:
        with self._lock:
            return self._history[-1] if self._history else None

    @property
    def history(self) -> list[Sample]:
        with self._lock:
            return list(self._history)

    @property
    def rows(self) -> dict[int, DeviceRow]:
        return dict(self._rows)

    def __repr__(self) -> str:
        # nbval compares this text: only what does not move (no values, no times).
        if self.closed:
            return "GpuPanel(closed)"
        label = " [simulated]" if self.simulated else ""
        if self.first.status != "ok":
            return f"GpuPanel({self.backend_name}{label}: no GPU to watch; the panel shows why and the fix)"
        count = len(self._shown(self.first.devices))
        return (f"GpuPanel({self.backend_name}{label}: {count} GPU{'s' if count != 1 else ''}, "
                f"every {self.interval:g} s, {self.history_length} samples)")

    # -- lifecycle -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop updating (closing the shared thread if this was its last user) and remove the widgets."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        lease = getattr(self, "_lease", None)  # absent when the lease was refused (Widget.__del__ closes too)
        if lease is not None:
            lease.close()
        _close_tree(self)

    # -- updates -------------------------------------------------------------------------------------

    def _on_sample(self, sample: Sample) -> None:
        with self._lock:
            if self.closed or not self._limiter.due(sample):
                return
            sample = with_torch_memory(sample)
            self._history.append(sample)
            history = list(self._history)
            kernel = KernelView(pids=self._pids, cell_started=self._cell_started())
            self.alerts = sample_alerts(sample, history, kernel)
            self._show(sample, history, kernel)

    def _show(self, sample: Sample, history: list[Sample], kernel: KernelView) -> None:
        label = "simulated" if self.simulated else ""
        if sample.status != "ok":
            self.message.value = view.alerts_html(self.alerts)
            self._start_verdict(sample)
            self._set_rows([])
            return
        self.message.value = ""
        devices = self._shown(sample.devices)
        if not devices:
            self.message.value = "<b>NVML sees no GPU matching --devices on this machine.</b>"
        self._set_rows([d.index for d in devices])
        by_index = [{d.index: d for d in past.devices} for past in history]
        for device in devices:
            past = [devices_then.get(device.index) for devices_then in by_index]
            alerts = [a for a in self.alerts if a.device == device.index]
            self._rows[device.index].show(device, past, alerts, kernel, label)

    def _set_rows(self, indices: list[int]) -> None:
        """One row per shown device; rows of devices that went away are closed, not just hidden."""
        if indices == list(self._rows):
            return
        old = self._rows
        self._rows = {index: old.get(index) or DeviceRow(index) for index in indices}
        self.body.children = tuple(self._rows.values())
        for index, row in old.items():
            if index not in self._rows:
                _close_tree(row)

    def _shown(self, devices: Sequence[DeviceSample]) -> list[DeviceSample]:
        return [d for d in devices if self.devices is None or d.index in self.devices]

    def _start_verdict(self, sample: Sample) -> None:
        if self._verdict_started or self._verdict is None or sample.status != "no_driver":
            return
        self._verdict_started = True
        self.verdict_box.value = "<i>Running %gpucheck to say why and how to fix it…</i>"
        verdict = self._verdict

        def run() -> None:
            html = verdict()
            if not self.closed:
                self.verdict_box.value = html

        threading.Thread(target=run, name=VERDICT_THREAD_NAME, daemon=True).start()


def _close_tree(widget: widgets.Widget) -> None:
    # Widget.close() closes only itself; its children would stay registered in the kernel for ever.
    # Layouts and styles are widgets of their own, with comms of their own.
    for child in (*getattr(widget, "children", ()), getattr(widget, "layout", None), getattr(widget, "style", None)):
        if isinstance(child, widgets.Widget):
            _close_tree(child)
    if isinstance(widget, GpuPanel):
        super(GpuPanel, widget).close()
    else:
        widget.close()
