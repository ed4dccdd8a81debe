"""Start the ranks of a profiled run, watch them, and never leave one behind.

Two ways in, one watch:
- `torchrun_command`: the user's own `torchrun ... train.py ARGS` with `-m jupyter_gpu.ddpprofile.rank_main` put
  before the script (torch's own torchrun parser finds the script, so every torchrun option, rendezvous included,
  keeps its meaning). torchrun starts each worker in a session of its own, so the workers are killed by the pids
  their status files give, besides torchrun's own group.
- `local_commands`: N ranks on this machine started here, with the variables torchrun would set (a notebook cell,
  written to a file, or `--scaling`'s one-process run of a script).

The watch: every rank rewrites a status file twice a second (its step, the collective it is in, since when). When no
rank's step has moved for `hang_seconds` and a rank has waited that long in one collective, the run is a hang: the
ranks in a collective are named with it and how long
they have waited, the others with where they were last, and every process is killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_gpu.ddpprofile.rank_main import OUT_ENV, STEPS_ENV, WARMUP_ENV
from jupyter_gpu.probekit.child_processes import Children, free_port
from jupyter_gpu.rendering.units import format_seconds

RANK_MODULE = "jupyter_gpu.ddpprofile.rank_main"
DEFAULT_HANG_SECONDS = 120.0
POLL_SECONDS = 0.25


class LaunchError(RuntimeError):
    """The ranks could not be started or run; the message is for the user."""


@dataclass
class RankRun:
    records: list[dict[str, Any]] = field(default_factory=list)  # each rank's JSON, by rank
    failure: str | None = None   # a rank failed or the run hung: said whole, for the user
    seconds: float = 0.0
    interrupted: bool = False


def parse_torchrun(argv: Sequence[str]) -> tuple[int, Any]:
    """Where torchrun's own options start in `argv`, and those options as torch's own torchrun parser reads them."""
    argv = list(argv)
    at = launcher_end(argv)
    if at is None:
        raise LaunchError("The command after `--` must start with torchrun (or python -m torch.distributed.run), "
                          f"not {argv[0] if argv else 'nothing'}.")
    from torch.distributed.run import get_args_parser

    options = argv[at:]
    try:
        return at, get_args_parser().parse_args(options)
    except SystemExit:
        raise LaunchError(f"torchrun cannot read these options: {' '.join(options)}") from None


def torchrun_world(parsed: Any) -> int | None:
    """nproc-per-node x nodes where both are plain numbers (else the ranks' own records say)."""
    nodes = str(parsed.nnodes).split(":")[-1]
    per_node = str(parsed.nproc_per_node)
    return int(nodes) * int(per_node) if nodes.isdigit() and per_node.isdigit() else None


def torchrun_command(argv: Sequence[str]) -> list[str]:
    """`torchrun [OPTIONS] SCRIPT [ARGS]` (or `python -m torch.distributed.run ...`) with the rank module put before
    the script."""
    argv = list(argv)
    at, parsed = parse_torchrun(argv)
    options = argv[at:]
    if parsed.no_python:
        raise LaunchError("--no-python runs a program that is not Python; the profile needs the Python script.")
    script_at = len(options) - len(parsed.training_script_args) - 1
    script = options[script_at]
    launcher = argv[:at]
    if at == 1 and shutil.which(argv[0]) is None:
        # No torchrun on PATH (a venv not activated): the same launcher from the Python running this command.
        launcher = [sys.executable, "-m", "torch.distributed.run"]
    if parsed.module:
        # torchrun -m pkg.train: the rank module runs the module by name.
        before = [o for o in options[:script_at] if o not in ("-m", "--module")]
        return [*launcher, *before, "-m", RANK_MODULE, "--module", script, *parsed.training_script_args]
    return [*launcher, *options[:script_at], "-m", RANK_MODULE, script, *parsed.training_script_args]


def launcher_end(argv: list[str]) -> int | None:
    """Where torchrun's own options start: after `torchrun`, or after `python -m torch.distributed.run`."""
    if not argv:
        return None
    if os.path.basename(argv[0]) in ("torchrun", "torchrun.exe"):
        return 1
    if len(argv) >= 3 and argv[1] == "-m" and argv[2] in ("torch.distributed.run", "torch.distributed.launch"):
        return 3
    return None


def local_commands(script: str, args: Sequence[str], processes: int, python: str | None = None,
                   base_env: Mapping[str, str] | None = None) -> list[tuple[list[str], dict[str, str]]]:
    """One command and environment per rank, as torchrun's standalone mode would set them."""
    env = dict(os.environ if base_env is None else base_env)
    port = free_port()
    commands = []
    for rank in range(processes):
        rank_env = {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                    "LOCAL_RANK": str(rank), "WORLD_SIZE": str(processes), "LOCAL_WORLD_SIZE": str(processes),
                    "GROUP_RANK": "0", "ROLE_RANK": str(rank)}
        commands.append(([python or sys.executable, "-m", RANK_MODULE, script, *args], rank_env))
    return commands


def profile_env(out: Path, steps: int, warmup: int) -> dict[str, str]:
    """What every rank reads: where to write, how many steps; one OpenMP thread per rank unless set (as torchrun
    does with several processes a node: ranks sharing a node's cores)."""
    env = {OUT_ENV: str(out), STEPS_ENV: str(steps), WARMUP_ENV: str(warmup)}
    if "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = "1"
    return env


def run(commands: list[tuple[list[str], dict[str, str]]], out: Path, world: int, *,
        hang_seconds: float = DEFAULT_HANG_SECONDS, progress: Callable[[str], None] | None = None,
        stream_output: Callable[[str], None] | None = None) -> RankRun:
    """Start the commands, watch the ranks' status files, and read every rank's result. Ctrl-C (KeyboardInterrupt)
    stops every process and comes back as `interrupted`."""
    began = time.monotonic()
    children = Children(LaunchError)
    lines: queue.Queue[str | None] = queue.Queue()
    outcome = RankRun()
    try:
        for command, env in commands:
            children.start(command, env, stream=lines if stream_output is not None else None)
        outcome.failure = _watch(children, out, world, hang_seconds, progress, lines, stream_output)
    except KeyboardInterrupt:
        outcome.interrupted = True
        outcome.failure = "Interrupted: every rank was stopped."
    finally:
        if outcome.failure is not None:
            _kill_ranks(out)
        launcher_said = children.stderr_tail(0) if children.processes else ""
        children.stop()
        _drain(lines, stream_output)
    outcome.seconds = time.monotonic() - began
    outcome.records = _gathered(out) or _results(out)
    if outcome.failure is None:
        failed = [r for r in outcome.records if r.get("error")]
        if failed:
            outcome.failure = _rank_failure(failed[0])
            _kill_ranks(out)
        elif not outcome.records:
            outcome.failure = f"No rank wrote a result; the launcher's last lines:\n{launcher_said}"
    return outcome


def _watch(children: Children, out: Path, world: int, hang_seconds: float, progress: Callable[[str], None] | None,
           lines: Any, stream_output: Callable[[str], None] | None) -> str | None:
    last_steps: tuple[int, ...] = ()
    moved = time.monotonic()
    while True:
        _drain(lines, stream_output)
        if all(p.poll() is not None for p in children.processes):
            return None
        results = _results(out)
        if any(r.get("error") for r in results):
            return None  # a rank raised: its peers wait in their next collective for gloo's or NCCL's own timeout
        failed = children.failed()
        if failed and not results:
            # A launcher that died before any rank wrote (a bad option, a script that is not there).
            return f"The ranks' launcher {children.exit_text(failed[0])}:\n{children.stderr_tail(failed[0])}"
        statuses = _statuses(out)
        steps = tuple(s.get("step", 0) for s in statuses)
        if steps != last_steps:
            last_steps, moved = steps, time.monotonic()
            if progress is not None and statuses:
                progress(f"step {min(steps)} on {len(statuses)} of {world} ranks")
        elif time.monotonic() - moved > hang_seconds and _waiting_in_a_collective(statuses, hang_seconds):
            return hang_message(statuses, world, hang_seconds)
        time.sleep(POLL_SECONDS)


def _waiting_in_a_collective(statuses: list[dict[str, Any]], seconds: float) -> bool:
    """Whether some rank has waited in one collective for `seconds`: a hang is ranks waiting for a peer. Ranks that
    make no step and wait in none are starting (importing torch, their first batch, compiling) or computing a long
    step: nobody is stuck on anybody (a clean clone's CI once called three ranks' start-up under load a hang)."""
    now = time.time()
    return any(s.get("collective") and now - s.get("since", now) >= seconds for s in statuses)


def hang_message(statuses: list[dict[str, Any]], world: int, hang_seconds: float) -> str:
    """Who is stuck where, from the ranks' last status."""
    now = time.time()
    seen = {s["rank"]: s for s in statuses}
    parts = []
    for rank in range(world):
        status = seen.get(rank)
        if status is None:
            parts.append(f"rank {rank} never started its script")
        elif status.get("collective"):
            parts.append(f"rank {rank} has waited {format_seconds(now - status['since'])} in {status['collective']} "
                         f"at step {status['step']}")
        else:
            quiet = now - status.get("at", now)
            stale = f", its status {format_seconds(quiet)} old" if quiet > 5 else ""
            parts.append(f"rank {rank} is in no collective (at step {status['step']}{stale}): it is the one the "
                         "others wait for")
    return (f"The run hung: no rank finished a step in {format_seconds(hang_seconds)}. " + "; ".join(parts) + ". "
            "Every rank was stopped. A rank that stops taking part (an exception it swallowed, an uneven last batch, "
            "a different number of steps) leaves the others in the next collective; --timeout sets how long to wait.")


def _rank_failure(record: dict[str, Any]) -> str:
    where = record.get("traceback") or ""
    lines = [line for line in where.strip().splitlines() if line.strip()][-6:]
    detail = ("\n" + "\n".join("  " + line for line in lines)) if lines else ""
    return f"Rank {record['rank']} raised {record['error']}.{detail}\nEvery other rank was stopped."


def _gathered(out: Path) -> list[dict[str, Any]]:
    """Every rank's record as rank 0 gathered them (ranks on other nodes included), or nothing."""
    with contextlib.suppress(OSError, ValueError):
        records = json.loads((out / "all-ranks.json").read_text(encoding="utf-8")).get("records") or []
        return sorted((r for r in records if isinstance(r, dict)), key=lambda r: r.get("rank", 0))
    return []


def _statuses(out: Path) -> list[dict[str, Any]]:
    return _read_all(out, "status-")


def _results(out: Path) -> list[dict[str, Any]]:
    return sorted(_read_all(out, "rank-"), key=lambda r: r.get("rank", 0))


def _read_all(out: Path, prefix: str) -> list[dict[str, Any]]:
    found = []
    for path in sorted(out.glob(f"{prefix}*.json")):
        with contextlib.suppress(OSError, ValueError):
            found.append(json.loads(path.read_text(encoding="utf-8")))
    return found


def _kill_ranks(out: Path) -> None:
    """Every rank by the pid it wrote, with its group (its DataLoader workers): torchrun starts each in a session
    of its own, outside torchrun's group."""
    for status in _statuses(out):
        pid = status.get("pid")
        if isinstance(pid, int) and pid > 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _drain(lines: Any, stream_output: Callable[[str], None] | None) -> None:
    while True:
        try:
            line = lines.get_nowait()
        except queue.Empty:
            return
        if line is not None and stream_output is not None:
            stream_output(line)
