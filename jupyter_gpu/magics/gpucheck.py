"""IPython glue for `%gpucheck`: parse, gather, diagnose, display. No diagnosis logic lives here."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.display import display

from jupyter_gpu.facts.context import ProbeContext
from jupyter_gpu.gpucheck.report import GpuCheckReport
from jupyter_gpu.gpucheck.request import CheckRequest
from jupyter_gpu.magics.activity import activity_for, close_activity
from jupyter_gpu.magics.arguments import parse_line
from jupyter_gpu.options import check_parser, help_from, validate

if TYPE_CHECKING:
    from jupyter_gpu.distributed.report import ReadinessReport


def _last_exception() -> BaseException | None:
    # IPython records the last uncaught cell exception here (sys.last_exc from Python 3.12 on).
    return getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)


@magics_class
class GpuCheckMagics(Magics):
    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        # Set by tests to point the magic at a fake machine (see tests/fixtures/fake_machine.py).
        self.context: ProbeContext | None = None
        self.activity = activity_for(shell)  # when the cells ran, matched against the sampler's GPU readings

    def close(self) -> None:
        """On `%unload_ext`: stop recording cell windows."""
        close_activity(self.shell)

    @line_magic
    @help_from(lambda: check_parser("%gpucheck", magic=True))
    def gpucheck(self, line: str) -> GpuCheckReport | None:
        """Is PyTorch in this kernel really able to use the GPU? If not, why, and the exact fix.

        Checks the kernel's Python and torch install, the driver, the GPUs and their visibility without
        initialising CUDA in this kernel (torch is probed in a child process), then audits the notebook's
        models, tensors, optimizers and DataLoaders (or only the NAMEs given) and the last error.
        """
        options = parse_line("%gpucheck", check_parser("%gpucheck", magic=True), line, validate)
        if options.distributed:
            return self._distributed(options)
        from jupyter_gpu.facts.activity import gather_activity
        from jupyter_gpu.facts.notebook import gather_notebook_facts
        from jupyter_gpu.gpucheck.run import run_check

        notebook = None
        missing = [name for name in options.names if name not in self.shell.user_ns]
        if missing and not options.facts:
            # An audit that quietly skipped a mistyped name would read as "nothing wrong with it".
            raise UsageError(f"%gpucheck: there is no {_listed(missing)} in the notebook to audit; run the cell "
                             "that defines it first, or check the spelling.")
        if not options.facts:
            notebook = gather_notebook_facts(self.shell.user_ns, names=options.names or None,
                                             last_exception=_last_exception())
            notebook["activity"] = gather_activity(self.activity.cells())
        try:
            # The torch probe's answer is cached on disk by run_check (shared with the CLI and other kernels).
            report = run_check(CheckRequest.from_options(options), notebook=notebook, context=self.context)
        except (OSError, ValueError) as exc:
            raise UsageError(f"%gpucheck: {exc}") from None
        if options.json:
            print(json.dumps(report.to_dict(), indent=2, default=str))
        elif not options.quiet:
            display(report)
        return report if options.return_result else None

    def _distributed(self, options: Any) -> ReadinessReport | None:
        """`--distributed [--bench]`: multi-GPU readiness; the all-reduce runs in children started from a module."""
        from jupyter_gpu.distributed.runner import check_distributed
        from jupyter_gpu.magics.progress import ProgressLine

        progress = None if options.quiet or options.json else ProgressLine()
        try:
            report = check_distributed(CheckRequest.from_options(options), user_ns=self.shell.user_ns,
                                       context=self.context, bench=options.bench, on_progress=progress)
        except (OSError, ValueError) as exc:
            raise UsageError(f"%gpucheck: {exc}") from None
        finally:
            if progress is not None:
                progress("")
        if options.json:
            print(json.dumps(report.to_dict(), indent=2, default=str))
        elif not options.quiet:
            display(report)
        return report if options.return_result else None


def _listed(names: list[str]) -> str:
    quoted = [repr(name) for name in names]
    return f"variable {quoted[0]}" if len(quoted) == 1 else f"variables {', '.join(quoted[:-1])} or {quoted[-1]}"
