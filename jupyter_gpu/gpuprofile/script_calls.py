"""What `profile_training` prints for a script: the probes as the Python calls a script makes.

A report for the notebook says `%speedprobe profile_train_step`; a script has no magics, and from it the same probe
is `jupyter_gpu.probe_speed(profile_train_step, namespace=globals())`. The commands the profile writes come in three
forms (`lift.py`'s ready steps and `plan.py`'s next steps), each rewritten here wherever it appears in a command.
"""

from __future__ import annotations

import dataclasses
import re

from jupyter_gpu.gpuprofile.result import ProfileResult

_NAME = r"[A-Za-z_][\w.]*"
_SPEEDPROBE = re.compile(rf"%speedprobe ({_NAME})(?: --try ([\w,-]+))?")
_DATAPROBE = re.compile(rf"%dataprobe ({_NAME}) --step ({_NAME})")
_BATCHPROBE = re.compile(rf"%batchprobe ({_NAME})")


def _speed_call(match: re.Match[str]) -> str:
    step, options = match.groups()
    tried = "" if options is None else f"options={tuple(options.split(','))!r}, "
    return f"jupyter_gpu.probe_speed({step}, {tried}namespace=globals())"


def script_command(command: str) -> str:
    """`command` with each probe magic in it written as the call a script makes; the rest as it is."""
    command = _SPEEDPROBE.sub(_speed_call, command)
    command = _DATAPROBE.sub(lambda m: f"jupyter_gpu.probe_loader({m[1]}, {m[2]}, namespace=globals())", command)
    return _BATCHPROBE.sub(lambda m: f"jupyter_gpu.probe_batch_size({m[1]}, namespace=globals())", command)


def with_script_commands(result: ProfileResult) -> ProfileResult:
    """The result with its next steps and ready steps' commands as a script's calls."""
    return dataclasses.replace(
        result,
        plan=[dataclasses.replace(item, command=script_command(item.command)) for item in result.plan],
        ready_steps=[dataclasses.replace(ready, command=script_command(ready.command)) for ready in result.ready_steps])
