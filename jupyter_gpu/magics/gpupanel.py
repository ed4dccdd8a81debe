"""IPython glue for `%gpupanel`: parse, open a panel on the shared sampler, keep track of open panels."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.display import display

from jupyter_gpu.magics.activity import activity_for, close_activity
from jupyter_gpu.magics.arguments import parse_line
from jupyter_gpu.metrics.backends.base import BackendSpecError
from jupyter_gpu.metrics.hub import shared_hub
from jupyter_gpu.options import gpupanel_parser, help_from


@magics_class
class GpuPanelMagics(Magics):
    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.activity = activity_for(shell)  # shared with %gpucheck: one pair of cell hooks per shell
        self._open: list[tuple[Any, str | None]] = []  # (GpuPanel, id of the cell that opened it), oldest first

    @line_magic
    @help_from(gpupanel_parser)
    def gpupanel(self, line: str) -> Any:
        """A live panel of every GPU: utilisation, memory (the driver's and PyTorch's), temperature, power,
        throttling, who holds memory, and alerts when something is wrong.

        Every panel in this kernel shares one sampler thread; closing the last panel (its Close button,
        --close or %unload_ext jupyter_gpu) stops it. Re-running a cell replaces the panel it opened.
        """
        options = parse_line("%gpupanel", gpupanel_parser(), line)
        self._open = [(p, cell) for p, cell in self._open if not p.closed]
        if options.close:
            closed = self.close_panels()
            print(f"Closed {closed} GPU panel{'s' if closed != 1 else ''}.")
            return None
        self._replace_panel_of_this_cell()
        from jupyter_gpu.widgets.panel import GpuPanel
        from jupyter_gpu.widgets.verdict import gpucheck_verdict_html

        try:
            panel = GpuPanel(shared_hub(), interval=options.interval, history=options.history, devices=options.devices,
                             cell_started=lambda: self.activity.started,
                             verdict=gpucheck_verdict_html)
        except BackendSpecError as exc:
            raise UsageError(f"%gpupanel: {exc}") from None
        self._check_devices(panel, options.devices)
        self._open.append((panel, self.activity.cell_id))
        display(panel)
        return panel if options.return_result else None

    @property
    def panels(self) -> list[Any]:
        """The panels still open, oldest first."""
        return [panel for panel, _ in self._open if not panel.closed]

    def _replace_panel_of_this_cell(self) -> None:
        # Re-running a cell clears its output, but the old panel's widgets would live and update for ever.
        cell = self.activity.cell_id
        if cell is None:
            return
        for panel, _ in [entry for entry in self._open if entry[1] == cell]:
            panel.close()
        self._open = [entry for entry in self._open if entry[1] != cell]

    def _check_devices(self, panel: Any, wanted: tuple[int, ...] | None) -> None:
        first = panel.first
        if wanted is None or first.status != "ok":
            return
        present = [d.index for d in first.devices]
        missing = [i for i in wanted if i not in present]
        if missing:
            panel.close()
            have = f"GPUs {', '.join(map(str, present))}" if present else "no GPU"
            raise UsageError(f"%gpupanel: there is no GPU {', '.join(map(str, missing))} here; NVML lists {have}.")

    def close_panels(self) -> int:
        panels = self.panels
        self._open = []
        for panel in panels:
            panel.close()
        return len(panels)

    def close(self) -> None:
        """`%unload_ext`: every panel stops, the cell hooks go."""
        self.close_panels()
        close_activity(self.shell)
