"""IPython glue for `%dataprobe`: parse, find the loader and step in the notebook, run the probe, display."""

from __future__ import annotations

import shlex
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.display import display

from jupyter_gpu.magics.progress import ProgressLine
from jupyter_gpu.options import OptionsError, dataprobe_parser, help_from


@magics_class
class DataProbeMagics(Magics):
    @line_magic
    @help_from(dataprobe_parser)
    def dataprobe(self, line: str) -> Any:
        """Measure whether the DataLoader starves the training step, and which DataLoader settings fix it.

        Three measurements on your own code, each with its spread: the loader alone, the step alone on one cached
        batch (the ceiling a perfect loader would reach) and both together (the time spent waiting for data).
        Then a sweep of num_workers, prefetch_factor, persistent_workers and, for a GPU step, pin_memory, each
        measured more than once on a fresh DataLoader built from yours; the two best are measured again, one is
        recommended and checked by running it. Your loader is never iterated; the model, optimizer, RNGs and
        sampler are put back exactly; no worker process is left behind. Ctrl-C keeps what was measured.
        """
        try:
            options = dataprobe_parser().parse_args(shlex.split(line))
        except (OptionsError, ValueError) as exc:  # ValueError: unbalanced quotes
            raise UsageError(f"%dataprobe: {exc}") from None
        loader_name = self._loader_name(options.names)
        loader = self._lookup(loader_name, "DataLoader", f"{loader_name} = DataLoader(dataset, batch_size=64)")
        step = None
        if options.step is not None:
            step = self._lookup(options.step, "step function", f"def {options.step}(batch): ...")
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

    @staticmethod
    def _loader_name(names: list[str]) -> str:
        if not names:
            raise UsageError("%dataprobe needs the name of a DataLoader, e.g. %dataprobe train_loader --step "
                             "train_step, where train_step(batch) runs one training step.")
        name, *extra = names
        if extra:
            raise UsageError(f"%dataprobe takes one DataLoader name; {' '.join(extra)!r} is neither a loader nor "
                             "an option (options start with -, e.g. --step train_step).")
        return name

    def _lookup(self, name: str, what: str, example: str) -> Any:
        if name not in self.shell.user_ns:
            raise UsageError(f"%dataprobe: there is no {what} {name!r} in the notebook; define {example} first.")
        return self.shell.user_ns[name]
