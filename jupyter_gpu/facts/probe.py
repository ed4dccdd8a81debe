"""Run `probe_script.py` in a child of the kernel's interpreter and read back its JSON.

`start_probe` starts the child without waiting, so the slow torch child can run while the rest of the
facts are gathered; `run_probe` is start + result. One implementation keeps the timeout, crash and
missing-interpreter records the same whichever way a probe is run.
"""

from __future__ import annotations

import json
import signal
import subprocess
import tempfile
import time
from importlib import resources
from typing import IO, Any

from jupyter_gpu.facts.context import ProbeContext
from jupyter_gpu.facts.errors import describe_error

MARKER = "@@JUPYTER_GPU_PROBE@@"
BASE_SECTIONS = ("python", "install", "nvml")


def probe_source() -> str:
    return resources.files("jupyter_gpu.facts").joinpath("probe_script.py").read_text(encoding="utf-8")


class ProbeHandle:
    """A probe child that is running (or could not start); `result()` waits for its sections."""

    def __init__(self, ctx: ProbeContext, sections: tuple[str, ...]) -> None:
        self.sections = sections
        self._timeout_s = ctx.probe_timeout_s
        self._python = ctx.python
        self._started = time.monotonic()
        self._result: dict[str, Any] | None = None
        # Files, not pipes: a chatty child can never block on a full pipe while we wait for the other one.
        # They outlive this call (closed in `_finish`), hence no `with`.
        self._stdout: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        self._process: subprocess.Popen[bytes] | None = None
        try:
            self._process = subprocess.Popen(
                [ctx.python, "-c", probe_source(), ",".join(sections)], env=dict(ctx.env), cwd=ctx.cwd,
                stdin=subprocess.DEVNULL, stdout=self._stdout, stderr=self._stderr)
        except OSError as exc:  # the interpreter itself is missing or not executable
            self._finish({"run": {"ok": False, "error": describe_error(exc), "python": ctx.python}})

    def result(self) -> dict[str, Any]:
        """The probe's sections, or a `run` record saying why the child gave none."""
        if self._result is not None:
            return self._result
        assert self._process is not None
        remaining = self._timeout_s - (time.monotonic() - self._started)
        try:
            returncode = self._process.wait(timeout=max(remaining, 0.0))
        except subprocess.TimeoutExpired:
            self._stop()
            return self._finish({"run": {"ok": False, "timed_out": True, "timeout_s": self._timeout_s,
                                         "stderr_tail": _tail(self._read(self._stderr)),
                                         "wall_s": self._wall_s()}})
        return self._finish(self._parse(returncode))

    def cancel(self) -> None:
        """Stop a child whose answer is no longer wanted (it was started on evidence that did not hold)."""
        if self._result is None and self._process is not None:
            self._stop()
            self._finish({"run": {"ok": False, "cancelled": True, "wall_s": self._wall_s()}})

    def _parse(self, returncode: int) -> dict[str, Any]:
        stdout, stderr = self._read(self._stdout), self._read(self._stderr)
        run: dict[str, Any] = {"ok": False, "returncode": returncode, "wall_s": self._wall_s()}
        if returncode < 0:
            run["signal"] = signal.Signals(-returncode).name
        payload = None
        for line in reversed(stdout.splitlines()):
            if line.startswith(MARKER):
                payload = json.loads(line[len(MARKER):])
                break
        if payload is None:
            run["stderr_tail"] = _tail(stderr)
            return {"run": run}
        run["ok"] = True
        run["stderr_tail"] = _tail(stderr) or None
        payload["run"] = run
        return payload

    def _stop(self) -> None:
        assert self._process is not None
        self._process.kill()
        self._process.wait()

    def _wall_s(self) -> float:
        return round(time.monotonic() - self._started, 3)

    @staticmethod
    def _read(handle: IO[bytes]) -> str:
        handle.seek(0)
        # The newlines text-mode pipes would give, so records read the same on every platform.
        return handle.read().decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")

    def _finish(self, result: dict[str, Any]) -> dict[str, Any]:
        self._result = result
        self._stdout.close()
        self._stderr.close()
        return result


def start_probe(ctx: ProbeContext, sections: tuple[str, ...]) -> ProbeHandle:
    """Start the probe child now and return at once; call `.result()` to wait for it."""
    return ProbeHandle(ctx, sections)


def run_probe(ctx: ProbeContext, sections: tuple[str, ...]) -> dict[str, Any]:
    """Return the probe's sections, or a `run` record saying why the child gave none."""
    return start_probe(ctx, sections).result()


def _tail(text: str | bytes | None, limit: int = 2000) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return text[-limit:]
