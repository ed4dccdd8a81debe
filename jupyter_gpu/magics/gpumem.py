"""IPython glue for `%gpumem`: parse, map or free or watch, display."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.display import display

from jupyter_gpu.magics.arguments import parse_line
from jupyter_gpu.options import gpumem_parser, help_from

WATCHING = ("gpumem: watching: memory is recorded after every cell; %gpumem --history shows which cell made it "
            "grow, %gpumem --watch off stops")
STOPPED = "gpumem: stopped watching; %gpumem --history still shows what was recorded"


def _one_mode(options: Any) -> None:
    modes = [flag for flag, on in (("--free", options.free), ("--watch", options.watch),
                                   ("--history", options.history)) if on]
    if len(modes) > 1:
        raise ValueError(f"{modes[0]} and {modes[1]} are separate requests: run them one at a time")


@magics_class
class GpuMemMagics(Magics):
    @line_magic
    @help_from(gpumem_parser)
    def gpumem(self, line: str) -> Any:
        """Who holds the memory in this notebook: every tensor storage reachable from it, counted once and named by
        the path you would type (model.fc.weight, opt.state[...]['exp_avg'], Out[12], graph of loss, last error:
        frame f, local x, the hidden _ that %reset out leaves), reconciled with the allocator.

        --free outputs | traceback | cache | NAME ... gives memory back without restarting the kernel and shows
        what it freed, what is still held and by whom, and what to type next time. --watch records memory after
        every cell; --history shows which cell made it grow and which cells keep growing. CUDA is never
        initialised by %gpumem.
        """
        options = parse_line("%gpumem", gpumem_parser(), line, validate=_one_mode)
        from jupyter_gpu.gpumem.runner import GpuMemError, map_memory

        shell = self.shell
        try:
            if options.free:
                from jupyter_gpu.gpumem.free import free

                result: Any = free(options.free, shell.user_ns, shell)
            elif options.watch or options.history:
                from jupyter_gpu.gpumem.watch import watch_for

                watch = watch_for(shell)
                if options.watch == "on":
                    watch.start()
                elif options.watch == "off":
                    watch.stop()
                if options.watch and not options.quiet:
                    print(WATCHING if watch.active else STOPPED)
                result = watch.history()
                if options.watch:
                    return result if options.return_result else None
            else:
                result = map_memory(shell.user_ns, shell, device=options.device, top=options.top)
        except GpuMemError as exc:
            raise UsageError(f"%gpumem: {exc}") from None
        if not options.quiet:
            display(result)
        return result if options.return_result else None
