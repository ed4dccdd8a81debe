"""IPython glue for `%batchprobe` / `%%batchprobe`: parse, run the probe (or the estimate), display."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import Image, display

from jupyter_gpu.magics.arguments import NamedObject, parse_line
from jupyter_gpu.magics.progress import ProgressLine
from jupyter_gpu.options import (
    batchprobe_parser,
    help_from,
    validate_batchprobe,
)

CELL_PARAMETER = "batch_size"


STEP = NamedObject(
    magic="%batchprobe", what="step function", noun="a step", definition="def {name}(batch_size): ...",
    option_hint="--max-memory 6GiB",
    missing="%batchprobe needs the name of a step function, e.g. %batchprobe train_step --max-memory 6GiB, where "
            "train_step(batch_size) runs one training step; or use %%batchprobe with the step in the cell body.")


@magics_class
class BatchProbeMagics(Magics):
    @line_cell_magic
    @help_from(batchprobe_parser)
    def batchprobe(self, line: str, cell: str | None = None) -> Any:
        """Find the largest batch size that fits in memory, with the model left exactly as it was.

        Each trial runs --steps real steps (so optimizer state is counted). Two small trials give a memory
        model from what is live at each allocation; it is checked once, then the search tries one past the
        limit it predicts; the answer is exact (N runs, N+1 does not), never below --start, and ran after
        the last failure. A step that keeps memory between calls is reported as a leak, one that ignores
        batch_size as such. Out-of-memory errors of every kind are recovered from and cleaned up, including
        what IPython keeps alive after an earlier cell's error. Parameters, buffers, gradients, optimizer and
        scheduler state, train/eval mode and RNG states are put back bitwise.
        """
        magic = "%%batchprobe" if cell is not None else "%batchprobe"
        options, step = self._parse(magic, line, cell)
        if options.estimate:
            return self._estimate(magic, options, step)
        from jupyter_gpu.batchprobe.runner import (
            DEFAULT_MAX_BATCH,
            DEFAULT_MAX_SECONDS,
            ProbeError,
            ProbeRequest,
            run_probe,
        )

        request = ProbeRequest(start=options.start, maximum=options.maximum or DEFAULT_MAX_BATCH,
                               max_memory=options.max_memory, margin=options.margin, steps=options.steps,
                               amp=options.amp, max_seconds=options.max_seconds or DEFAULT_MAX_SECONDS)
        try:
            result = run_probe(step, request, namespace=self.shell.user_ns, shell=self.shell,
                               progress=None if options.quiet else ProgressLine())
        except ProbeError as exc:
            raise UsageError(f"{magic}: {exc}") from None
        # With -o, a cell magic's return value is the cell's Out: displaying it here would show it twice.
        shown_as_value = options.return_result and cell is not None and not result.interrupted
        if not options.quiet and not shown_as_value:
            display(result)
        if not options.quiet:
            self._plot(result)
        if result.interrupted:
            raise KeyboardInterrupt  # the finished trials are shown; stop as asked ("Run all" stops too)
        return result if options.return_result else None

    def _parse(self, magic: str, line: str, cell: str | None) -> tuple[Any, Callable[[int], Any]]:
        options = parse_line(magic, batchprobe_parser(magic), line, validate_batchprobe)
        if cell is not None:
            if options.names:
                raise UsageError(f"%%batchprobe takes only options on its first line, not {' '.join(options.names)!r};"
                                 f" the cell body is the step and reads `{CELL_PARAMETER}`.")
            if not cell.strip():
                raise UsageError("%%batchprobe has an empty cell: write one training step that uses `batch_size`.")
            from jupyter_gpu.magics.cell import compile_cell_function

            step = compile_cell_function(self.shell, cell, f"%%batchprobe {line}".rstrip(), CELL_PARAMETER,
                                         self.shell.user_ns)
            return options, step
        return options, self._named_step(options.names)

    def _named_step(self, names: list[str]) -> Callable[[int], Any]:
        name = STEP.one_name(names)
        step = STEP.look_up(self.shell.user_ns, name)
        if not callable(step):
            raise UsageError(f"%batchprobe: {name!r} is a {type(step).__name__}, not a function; it must be "
                             "callable as step(batch_size).")
        return step

    def _estimate(self, magic: str, options: Any, step: Callable[[int], Any]) -> Any:
        from jupyter_gpu.batchprobe.estimate import EstimateError, estimate_peaks
        from jupyter_gpu.batchprobe.runner import DEFAULT_MAX_BATCH

        sizes = options.memory_sizes or [options.max_memory]
        try:
            estimate = estimate_peaks(step, [], namespace=self.shell.user_ns, memory_sizes=sizes,
                                      margin=options.margin, start=options.start,
                                      maximum=options.maximum or DEFAULT_MAX_BATCH, amp=options.amp)
        except EstimateError as exc:
            raise UsageError(f"{magic}: {exc}") from None
        if not options.quiet:
            display(estimate)
        return estimate if options.return_result else None

    @staticmethod
    def _plot(result: Any) -> None:
        from jupyter_gpu.batchprobe.render import plot_png

        png = plot_png(result) if len(result.trials) > 1 else None
        if png is not None:
            display(Image(data=png, format="png"))
