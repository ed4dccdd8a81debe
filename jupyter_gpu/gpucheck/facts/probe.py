"""Run `probe_script.py` in a child of the kernel's interpreter and read back its JSON."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from importlib import resources
from typing import Any

from jupyter_gpu.gpucheck.facts.context import ProbeContext
from jupyter_gpu.gpucheck.facts.errors import describe_error

MARKER = "@@JUPYTER_GPU_PROBE@@"
BASE_SECTIONS = ("python", "install", "nvml")


def probe_source() -> str:
    return resources.files("jupyter_gpu.gpucheck.facts").joinpath("probe_script.py").read_text(encoding="utf-8")


def run_probe(ctx: ProbeContext, sections: tuple[str, ...]) -> dict[str, Any]:
    """Return the probe's sections, or a `run` record saying why the child gave none."""
    started = time.monotonic()
    command = [ctx.python, "-c", probe_source(), ",".join(sections)]
    try:
        done = subprocess.run(command, env=dict(ctx.env), cwd=ctx.cwd, capture_output=True, text=True,
                              timeout=ctx.probe_timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        return {"run": {"ok": False, "timed_out": True, "timeout_s": ctx.probe_timeout_s,
                        "stderr_tail": _tail(exc.stderr), "wall_s": round(time.monotonic() - started, 3)}}
    except OSError as exc:  # the interpreter itself is missing or not executable
        return {"run": {"ok": False, "error": describe_error(exc), "python": ctx.python}}
    run: dict[str, Any] = {"ok": False, "returncode": done.returncode,
                           "wall_s": round(time.monotonic() - started, 3)}
    if done.returncode < 0:
        run["signal"] = signal.Signals(-done.returncode).name
    payload = None
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(MARKER):
            payload = json.loads(line[len(MARKER):])
            break
    if payload is None:
        run["stderr_tail"] = _tail(done.stderr)
        return {"run": run}
    run["ok"] = True
    run["stderr_tail"] = _tail(done.stderr) or None
    payload["run"] = run
    return payload


def _tail(text: str | bytes | None, limit: int = 2000) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return text[-limit:]
