"""IPython glue for `%gputime` / `%%gputime`: parse, run through the timing core, display."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display

from jupyter_gpu.magics.cell import parse_line_or_cell
from jupyter_gpu.magics.progress import ProgressLine
from jupyter_gpu.metrics.backends.base import BackendSpecError
from jupyter_gpu.metrics.hub import Lease, shared_hub
from jupyter_gpu.options import (
    gputime_parser,
    help_from,
    validate_gputime,
)

LABEL_WIDTH = 60


@magics_class
class GpuTimeMagics(Magics):
    def __init__(self, shell: Any) -> None:
        super().__init__(shell)

    @line_cell_magic
    @help_from(gputime_parser)
    def gputime(self, line: str, cell: str | None = None) -> Any:
        """Time a cell on the GPU correctly, and say whether its work ran on the GPU at all.

        By default the cell runs once, like %%time, and its variables stay in the notebook. The GPU is
        synchronised before (earlier cells' queued work is not billed here) and after; wall time and,
        when CUDA is up, CUDA-event GPU time are reported. With -n/-r/-w/--auto the first run is reported
        apart (compile, autotuning, warm-up) and the steady state as median, min, IQR and n. The first run
        counts PyTorch operators per device, host/device copies and waits for the GPU; its cost is
        measured and stated. CUDA is never initialised unless the cell does it.
        """
        __tracebackhide__ = True  # IPython hides this frame: an error in the cell shows the cell's lines
        options, statement = self._parse(line, cell)
        source = cell if cell is not None else statement
        from jupyter_gpu.gputime.runner import TimingRequest, time_cell
        from jupyter_gpu.magics.cell import compile_magic_source

        request = TimingRequest(
            label=options.label or _label(source), loops=options.loops, repeat=options.repeat,
            warmup=options.warmup, auto=options.auto, budget=options.budget or 2.0, count_ops=options.count_ops)
        compiled = compile_magic_source(self.shell, "gputime", line, source, cell, "model(x).sum().backward()")
        progress = None if options.quiet else ProgressLine()
        timed = time_cell(self.shell.user_ns, compiled, request, self._busy_lease(), progress=progress)
        # With -o, a cell magic's return value is the cell's Out: displaying it here would show it twice.
        shown_as_value = options.return_result and cell is not None and timed.interrupted is None
        if not options.quiet and not shown_as_value:
            display(timed.result)
        if timed.interrupted is not None:
            raise timed.interrupted  # the finished repeats are shown; stop as asked ("Run all" stops too)
        if options.return_result:
            return timed.result
        return None if options.quiet or request.repeated else timed.value

    def _parse(self, line: str, cell: str | None) -> tuple[Any, str]:
        return parse_line_or_cell(
            "gputime", line, cell, gputime_parser, validate_gputime,
            body="the code", needs="%gputime needs a statement to time, e.g. %gputime model(x); use %%gputime to "
                                   "time a whole cell.", empty="nothing to time")

    def _busy_lease(self) -> Lease:
        from jupyter_gpu.gputime.busy import SAMPLE_INTERVAL

        try:
            return shared_hub().acquire(SAMPLE_INTERVAL, start=False)
        except BackendSpecError as exc:
            raise UsageError(f"%gputime: {exc}") from None


def _label(source: str) -> str:
    lines = [ln.strip() for ln in source.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    if not lines:
        return "(empty)"
    text = lines[0] + (" …" if len(lines) > 1 else "")
    return text if len(text) <= LABEL_WIDTH else text[: LABEL_WIDTH - 1] + "…"

