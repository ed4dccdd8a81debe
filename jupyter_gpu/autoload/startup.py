"""The start-up check's child process: `python -m jupyter_gpu check --json` with the kernel's own interpreter,
cwd and environment, so it diagnoses exactly what the kernel would see, while the kernel imports no torch,
loads no NVML and starts no CUDA.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from jupyter_gpu.autoload.notice import could_not_run_notice, failure_notice

# Background work: lower priority, so the kernel still starting and the user's first cells win the CPU (the
# torch probe the check starts inherits it). 10 is what `nice` applies by default.
NICENESS = 10
# The check limits its own torch probe to 60 s and then reports it as a finding; past this, the check is stuck.
CHECK_TIMEOUT_S = 120.0
_REASON_LIMIT = 200  # characters of the child's last error line kept in the notice


@dataclass(frozen=True)
class CheckOutcome:
    """What the check found: the line to show (None when healthy) and the report's status, if there was one."""

    notice: str | None
    status: str | None


class CheckChild:
    """One running check; `wait()` collects it, `kill()` ends it and whatever it started."""

    def __init__(self, python: str = sys.executable) -> None:
        command = [python, "-m", "jupyter_gpu", "check", "--json"]
        nice = shutil.which("nice")  # not os.nice in preexec_fn: that is unsafe from a thread
        if nice:
            command = [nice, "-n", str(NICENESS), *command]
        # A session of its own, so a timeout or the kernel's exit can end the torch probe it starts as well.
        self.process = subprocess.Popen(command,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        start_new_session=True)

    def wait(self, timeout: float = CHECK_TIMEOUT_S) -> CheckOutcome:
        try:
            out, err = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.process.communicate()
            return CheckOutcome(could_not_run_notice(f"it did not finish within {timeout:g} s"), None)
        return outcome_of(self.process.returncode, out, err)

    def kill(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it finished meanwhile
                os.killpg(self.process.pid, signal.SIGKILL)


def outcome_of(returncode: int, out: bytes, err: bytes) -> CheckOutcome:
    """The outcome of a finished check: its report's notice, or why there was no report."""
    try:
        data: Any = json.loads(out)
        return CheckOutcome(failure_notice(data), str(data["status"]))
    except (ValueError, KeyError, TypeError):
        return CheckOutcome(could_not_run_notice(_failure_reason(returncode, err)), None)


def _failure_reason(returncode: int, err: bytes) -> str:
    if returncode < 0:
        try:
            how = f"the check process was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"the check process was killed by signal {-returncode}"
    else:
        how = f"the check process exited with status {returncode} and no report"
    lines = [line.strip() for line in err.decode("utf-8", "replace").splitlines() if line.strip()]
    if lines:
        last = lines[-1]
        how += f": {last[:_REASON_LIMIT]}{'…' if len(last) > _REASON_LIMIT else ''}"
    return how
