"""IPython glue for `%gpucells`: the activity recorder's rows, flagged and shown."""

from __future__ import annotations

from typing import Any

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.display import display

from jupyter_gpu.magics.activity import activity_for, close_activity
from jupyter_gpu.magics.arguments import parse_line
from jupyter_gpu.options import gpucells_parser, help_from


@magics_class
class GpuCellsMagics(Magics):
    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.activity = activity_for(shell)  # recording starts at %load_ext (or kernel start under autoload)

    def close(self) -> None:
        close_activity(self.shell)

    @line_magic
    @help_from(gpucells_parser)
    def gpucells(self, line: str) -> Any:
        """Which of your cells used the GPU: each finished cell's wall time, GPU time, how busy the GPU was, its
        peak memory and the memory it left behind, with the cells to look at flagged (kept the GPU idle while
        holding it, memory growing run after run, the slowest). Recorded after every cell since jupyter_gpu was
        loaded; CUDA is never initialised for it, and a failing record never breaks a cell.
        """
        options = parse_line("%gpucells", gpucells_parser(), line)
        from jupyter_gpu.facts.activity import running_samples
        from jupyter_gpu.gpucells.log import build_log
        from jupyter_gpu.kernel_torch import cuda_initialized, loaded_torch

        log = build_log(self.activity.cells(), options.shown, cuda_now=cuda_initialized(loaded_torch()),
                        sampler_running=bool(running_samples()))
        if not options.quiet:
            display(log)
        return log if options.return_result else None
