"""IPython glue for `%%gpuprofile` / `%gpuprofile`: parse, run the user's loop under the profile, display."""

from __future__ import annotations

import types
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display

from jupyter_gpu.magics.cell import parse_line_or_cell
from jupyter_gpu.magics.progress import ProgressLine
from jupyter_gpu.options import (
    gpuprofile_parser,
    help_from,
    validate_gpuprofile,
)


@magics_class
class GpuProfileMagics(Magics):
    @line_cell_magic
    @help_from(gpuprofile_parser)
    def gpuprofile(self, line: str, cell: str | None = None) -> Any:
        """Profile your own training loop as written: where each step's time goes (waiting for data, copies,
        forward, backward, optimizer, each sync with its line, garbage collection, other host time), its FLOPs and
        how far it is from this device's limit, and what to fix first, with the command to type.

        Put %%gpuprofile on the training cell (nested epoch loops, logging, tqdm, schedulers, gradient
        accumulation: whatever it holds), or use %gpuprofile train_one_epoch(...) for a function that trains.
        Optimizer steps are counted through torch's global hooks (DataLoader batches when no optimizer steps);
        K warm-up steps run first, then N are profiled, one more is counted operator by operator, and the cell is
        stopped between two steps. The model, optimizer, scheduler, GradScaler, RNGs and global flags are put back
        bitwise afterwards unless --keep. CUDA is never initialised unless the cell does it.
        """
        __tracebackhide__ = True  # an error in the cell shows the cell's lines
        magic = "%%gpuprofile" if cell is not None else "%gpuprofile"
        options, statement = parse_line_or_cell(
            "gpuprofile", line, cell, gpuprofile_parser,
            validate_gpuprofile, body="the training loop",
            needs="%gpuprofile needs the function that trains, e.g. %gpuprofile train_one_epoch(model, loader); use "
                  "%%gpuprofile on a cell that holds the loop.", empty="there is no training loop to profile")
        if options.nproc is not None:
            if cell is None:
                raise UsageError(f"{magic} --nproc: put %%gpuprofile --nproc N on the cell that trains; it runs as a "
                                 "script in every rank.")
            return self._profile_ranks(options, cell)
        from jupyter_gpu.gpuprofile.lift import LoopSource
        from jupyter_gpu.gpuprofile.request import DEFAULT_DATA_SECONDS, DEFAULT_STEPS, ProfileRequest
        from jupyter_gpu.gpuprofile.runner import GpuProfileError, profile_run
        from jupyter_gpu.magics.cell import compile_magic_source

        namespace = self.shell.user_ns
        source = cell if cell is not None else statement
        if cell is None and statement.isidentifier():
            if not callable(namespace.get(statement)):
                raise UsageError(f"%gpuprofile: there is no function {statement!r} in the notebook; define "
                                 f"def {statement}(): ... (one epoch of training) first.")
            source = f"{statement}()"
        compiled = compile_magic_source(self.shell, "gpuprofile", line, source, cell,
                                        "train_one_epoch(model, loader, optimizer)")

        def run() -> Any:
            exec(compiled.body, namespace)
            if compiled.last_expression is not None:
                return eval(compiled.last_expression, namespace)
            return None

        request = ProfileRequest(steps=None if options.seconds is not None else options.steps or DEFAULT_STEPS,
                                 warmup=options.warmup, seconds=options.seconds, keep=options.keep,
                                 apply=options.apply, compile=options.compile,
                                 data_seconds=options.data_seconds or DEFAULT_DATA_SECONDS)
        try:
            # The cell's code as functions of the notebook: the variables it changes are put back with the rest.
            code = [types.FunctionType(part, namespace) for part in (compiled.body, compiled.last_expression)
                    if isinstance(part, types.CodeType)]
            profiled = profile_run(run, request, namespace=namespace, loop_source=LoopSource(compiled.filename),
                                   progress=None if options.quiet else ProgressLine(), code=code)
        except GpuProfileError as exc:
            raise UsageError(f"{magic}: {exc}") from None
        # With -o the result is the cell's value (its Out): displaying it here too would show it twice.
        if not options.quiet and not (options.return_result and profiled.error is None):
            display(profiled.result)
        if profiled.error is not None:
            raise profiled.error  # the partial result is shown; the cell's own error, with its own traceback
        return profiled.result if options.return_result else None

    def _profile_ranks(self, options: Any, cell: str) -> Any:
        """The cell as every rank's script (a notebook's functions cannot be pickled into spawned processes, and a
        forked kernel is unsafe once CUDA is up): written to a file, run in N processes with torchrun's variables,
        each profiled; the ranks' printed lines appear below the cell as they come."""
        import os
        import tempfile

        from jupyter_gpu.ddpprofile.launch import DEFAULT_HANG_SECONDS
        from jupyter_gpu.ddpprofile.runner import profile_script
        from jupyter_gpu.gpuprofile.request import DEFAULT_STEPS

        with tempfile.TemporaryDirectory(prefix="jupyter-gpu-cell-") as folder:
            script = os.path.join(folder, "cell.py")
            with open(script, "w", encoding="utf-8") as handle:
                handle.write(cell)
            progress = None if options.quiet else ProgressLine()
            try:
                profile = profile_script(script, processes=options.nproc, steps=options.steps or DEFAULT_STEPS,
                                         warmup=options.warmup, with_scaling=options.scaling, apply=options.apply,
                                         hang_seconds=options.timeout or DEFAULT_HANG_SECONDS,
                                         progress=(lambda text: progress(f"%%gpuprofile --nproc: {text}"))
                                         if progress is not None else None,
                                         output=lambda line: print(line, end="" if line.endswith("\n") else "\n"),
                                         shown_as=f"this cell in {options.nproc} processes")
            finally:
                if progress is not None:
                    progress("")
        if not options.quiet and not options.return_result:
            display(profile)
        return profile if options.return_result else None
