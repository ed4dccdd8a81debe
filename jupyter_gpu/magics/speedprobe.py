"""IPython glue for `%speedprobe`: parse, find the step in the notebook, run the probe, display."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.display import display

from jupyter_gpu.magics.arguments import NamedObject, parse_line
from jupyter_gpu.magics.progress import ProgressLine
from jupyter_gpu.options import help_from, speedprobe_parser

STEP = NamedObject(
    magic="%speedprobe", what="step function", noun="a step", definition="def {name}(): ...",
    option_hint="--try amp-bf16",
    missing="%speedprobe needs the name of a training step, e.g. %speedprobe train_step, where train_step() runs "
            "one step (batch, forward, backward, optimizer step).")


@magics_class
class SpeedProbeMagics(Magics):
    @line_magic
    @help_from(speedprobe_parser)
    def speedprobe(self, line: str) -> Any:
        """Measure what bf16/fp16 autocast, TF32, cudnn.benchmark, channels_last, fused optimizers and torch.compile
        buy on your own training step, and check that each one's numbers still agree with the step as it is.

        STEP() runs one training step (its own batch, forward, backward, optimizer step) and may return the loss.
        Each option is applied without editing your code, timed like %%gputime (synchronised, warm-up and
        compilation apart, at least five timed steps), and compared from the same weights and batch: the first
        update against the baseline's, the loss over --steps steps. Then the options that helped and agreed are
        combined. The model, optimizer, RNGs and global flags are put back exactly after every trial; Ctrl-C
        keeps what was measured.
        """
        options = parse_line("%speedprobe", speedprobe_parser(), line)
        name = STEP.one_name(options.names)
        step = STEP.look_up(self.shell.user_ns, name)
        from jupyter_gpu.speedprobe.runner import SpeedProbeError, SpeedProbeRequest, run_speedprobe

        request = SpeedProbeRequest(options=options.options, steps=options.steps)
        try:
            result = run_speedprobe(step, request, step_name=name, namespace=self.shell.user_ns,
                                    progress=None if options.quiet else ProgressLine())
        except SpeedProbeError as exc:
            raise UsageError(f"%speedprobe: {exc}") from None
        if not options.quiet:
            display(result)
        if result.interrupted:
            raise KeyboardInterrupt  # what was measured is shown; stop as asked ("Run all" stops too)
        return result if options.return_result else None
