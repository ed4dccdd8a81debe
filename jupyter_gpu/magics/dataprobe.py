"""IPython glue for `%dataprobe`: parse, find the loader and step in the notebook, run the probe, display."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.display import display

from jupyter_gpu.magics.arguments import NamedObject, parse_line
from jupyter_gpu.magics.progress import ProgressLine
from jupyter_gpu.options import dataprobe_parser, help_from

LOADER = NamedObject(
    magic="%dataprobe", what="DataLoader", noun="a loader", definition="{name} = DataLoader(dataset, batch_size=64)",
    option_hint="--step train_step",
    missing="%dataprobe needs the name of a DataLoader, e.g. %dataprobe train_loader --step train_step, where "
            "train_step(batch) runs one training step.")
STEP = NamedObject(magic="%dataprobe", what="step function", noun="a step", definition="def {name}(batch): ...",
                   option_hint="--step train_step", missing="")


@magics_class
class DataProbeMagics(Magics):
    @line_magic
    @help_from(dataprobe_parser)
    def dataprobe(self, line: str) -> Any:
        """Measure whether the DataLoader starves the training step, and which DataLoader settings fix it.

        Three measurements on your own code, each with its spread: the loader alone, the step alone on one cached
        batch (the ceiling a perfect loader would reach) and both together (the time spent waiting for data).
        Then a sweep of num_workers, prefetch_factor, persistent_workers and, for a GPU step, pin_memory, each
        measured more than once on a fresh DataLoader built from yours, where it could win (the report names
        what it left out and why); one is recommended and checked by running it again. Your loader is never
        iterated; the model, optimizer, RNGs and sampler are put back exactly; no worker process is left behind.
        Ctrl-C keeps what was measured.
        """
        options = parse_line("%dataprobe", dataprobe_parser(), line)
        loader_name = LOADER.one_name(options.names)
        loader = LOADER.look_up(self.shell.user_ns, loader_name)
        step = None
        if options.step is not None:
            step = STEP.look_up(self.shell.user_ns, options.step)
            if not callable(step):
                raise UsageError(f"%dataprobe: {options.step!r} is a {type(step).__name__}, not a function; it "
                                 "must be callable as step(batch).")
        from jupyter_gpu.dataprobe.runner import DataProbeError, DataProbeRequest, run_dataprobe

        request = DataProbeRequest(workers=options.workers, seconds=options.seconds)
        try:
            result = run_dataprobe(loader, step, request, loader_name=loader_name, step_name=options.step,
                                   namespace=self.shell.user_ns, progress=None if options.quiet else ProgressLine())
        except DataProbeError as exc:
            raise UsageError(f"%dataprobe: {exc}") from None
        if not options.quiet:
            display(result)  # its HTML carries the plot (text bars where matplotlib is missing)
        if result.interrupted:
            raise KeyboardInterrupt  # what was measured is shown; stop as asked ("Run all" stops too)
        return result if options.return_result else None
