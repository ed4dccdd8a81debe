"""Child processes a probe starts and must never leave behind: each in its own session (so whatever it starts dies
with it), its stderr in a file (a full pipe would block it), its stdout optionally streamed line by line; `stop()`
kills every process group and reaps it, whatever state the children are in. The checked all-reduce's ranks and the
distributed profile's ranks are both started here.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import IO

STDERR_LINES = 15


class StartError(RuntimeError):
    """A child could not be started; the message is one sentence for the user."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Children:
    """Processes started in their own sessions, each with its stderr in a file (a full pipe would block a rank);
    `stop()` kills every process group and reaps it, whatever state the ranks are in."""

    def __init__(self, error: type[Exception] = StartError) -> None:
        self.error = error  # what a child that cannot start raises: the caller's own error, with one sentence
        self.processes: list[subprocess.Popen[str]] = []
        self.stderr: list[IO[bytes]] = []
        self._readers: list[threading.Thread] = []

    def start(self, command: list[str], env: Mapping[str, str], *, stream: queue.Queue[str | None] | None) -> None:
        errors = tempfile.TemporaryFile()  # noqa: SIM115 -- closed in stop()
        self.stderr.append(errors)
        try:
            process = subprocess.Popen(command, env=dict(env), stdin=subprocess.DEVNULL,
                                       stdout=subprocess.PIPE if stream is not None else subprocess.DEVNULL,
                                       stderr=errors, text=True, start_new_session=True)
        except OSError as exc:  # the interpreter is missing or not executable
            raise self.error(f"Cannot start {command[0]}: {exc.strerror or exc}.") from None
        self.processes.append(process)
        if stream is not None:
            reader = threading.Thread(target=pump, args=(process.stdout, stream), daemon=True)
            reader.start()
            self._readers.append(reader)

    def failed(self) -> list[int]:
        """Indices of the processes that have exited with an error."""
        return [index for index, process in enumerate(self.processes) if process.poll() not in (None, 0)]

    def wait_all(self, deadline: float) -> bool:
        for process in self.processes:
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                return False
        return True

    def stderr_tail(self, index: int) -> str:
        handle = self.stderr[index]
        handle.seek(0)
        return tail(handle.read().decode(errors="replace"))

    def exit_text(self, index: int) -> str:
        code = self.processes[index].returncode
        if code is not None and code < 0:
            return f"was killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"

    def stop(self) -> None:
        for process in self.processes:
            # The group: whatever a rank started dies with it. Gone already (ProcessLookupError) is fine.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        for process in self.processes:
            process.wait()
        for reader in self._readers:
            reader.join(timeout=1.0)
        for process in self.processes:
            if process.stdout is not None:
                process.stdout.close()
        for handle in self.stderr:
            handle.close()


def pump(pipe: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in pipe:
        lines.put(line)
    lines.put(None)


def tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join("  " + line for line in lines[-STDERR_LINES:]) or "  (it printed nothing on stderr)"
