"""Who a GPU process is: its parent, owner and program name, read from /proc (probe layer).

Everything takes the proc root, so tests lay out a fake /proc. Only the program name (argv[0]'s last part)
is read, never the arguments: a command line can hold secrets, and other users' processes are not ours to
describe at all.
"""

from __future__ import annotations

import os
from pathlib import Path

from jupyter_gpu.server.attribution import ProcessInfo, ProcessLookup

PROC_ROOT = Path("/proc")
MAX_NAME = 64  # a program name longer than this is cut, so a crafted argv[0] cannot flood the panel


def read_process(pid: int, proc_root: Path = PROC_ROOT) -> ProcessInfo | None:
    """The process as this server sees it; None when it is not visible (gone, or in another PID namespace)."""
    base = proc_root / str(pid)
    try:
        status = (base / "status").read_text(errors="replace")
    except OSError:
        return None
    fields: dict[str, str] = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    real_uid = (fields.get("Uid") or "").split()[:1]  # "Uid:  real effective saved fs"
    return ProcessInfo(pid, _int(fields.get("PPid")), _int(real_uid[0] if real_uid else None),
                       _program_name(base) or fields.get("Name") or None)


def _program_name(base: Path) -> str | None:
    try:
        argv0 = (base / "cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return None
    name = os.path.basename(argv0.decode(errors="replace"))
    return name[:MAX_NAME] or None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def cached_lookup(proc_root: Path = PROC_ROOT) -> ProcessLookup:
    """A lookup that reads each pid at most once: attribution walks the same parents for many processes."""
    seen: dict[int, ProcessInfo | None] = {}

    def lookup(pid: int) -> ProcessInfo | None:
        if pid not in seen:
            seen[pid] = read_process(pid, proc_root)
        return seen[pid]

    return lookup
