"""Paths as a facts snapshot records them: the paths of the machine that was checked, in its own flavour.

Diagnosis is a pure function of the snapshot, so the rules never read its paths with the replaying host's
`os.path`: a snapshot from a Windows kernel diagnosed on Linux (or the reverse) must give the same findings.
A snapshot does not record its flavour separately: the checked machine's platform
(`snapshot["system"]["platform"]["system"]`) decides it, and `flavour_of_system` is the one place that
turns a platform name into path rules. The fact gatherers use the same helper for the machine they check.
"""

from __future__ import annotations

import ntpath
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

WINDOWS = "Windows"
# What Windows falls back to when PATHEXT is unset (cmd.exe's own default list).
DEFAULT_PATHEXT = ".COM;.EXE;.BAT;.CMD"


@dataclass(frozen=True)
class PathFlavour:
    """How one machine spells paths and PATH-like lists."""

    module: ModuleType  # posixpath or ntpath, never os.path
    list_separator: str  # between the entries of PATH, PYTHONPATH, JUPYTER_PATH
    windows: bool

    def split_list(self, value: str | None) -> list[str]:
        """The non-empty entries of a PATH-like variable."""
        return [entry for entry in (value or "").split(self.list_separator) if entry]

    def key(self, path: str) -> str:
        """A form in which two spellings of one path compare equal (Windows ignores case and slash kind)."""
        return self.module.normcase(self.module.normpath(path)) if path else ""

    def same(self, first: str | None, second: str | None) -> bool:
        return bool(first) and bool(second) and self.key(first or "") == self.key(second or "")

    def is_inside(self, path: str, folder: str) -> bool:
        return bool(folder) and self.key(path).startswith(self.module.join(self.key(folder), ""))

    def join(self, *parts: str) -> str:
        return self.module.join(*parts)

    def dirname(self, path: str) -> str:
        return self.module.dirname(path)

    def basename(self, path: str) -> str:
        return self.module.basename(path.rstrip("/\\" if self.windows else "/"))

    def is_absolute(self, path: str) -> bool:
        # ntpath.isabs("\\x") is True, but a path without a drive is relative to the current drive.
        if self.windows:
            return bool(ntpath.splitdrive(path)[0]) and ntpath.isabs(path)
        return posixpath.isabs(path)

    def prefix_of_interpreter(self, path: str) -> str:
        """The environment an interpreter belongs to.

        POSIX: /x/env/bin/python -> /x/env (venvs, conda envs and system Pythons alike).
        Windows: C:\\x\\env\\Scripts\\python.exe (venv) and C:\\x\\env\\python.exe (conda, python.org) -> C:\\x\\env.
        """
        folder = self.module.dirname(path)
        if not self.windows or self.module.basename(folder).lower() in ("scripts", "bin"):
            return self.module.dirname(folder)
        return folder

    def interpreters_in_prefix(self, prefix: str) -> list[str]:
        """Where an environment's interpreter lives, most likely first."""
        if self.windows:
            return [ntpath.join(prefix, "python.exe"), ntpath.join(prefix, "Scripts", "python.exe")]
        return [posixpath.join(prefix, "bin", "python")]

    def library_search_path(self, env: Mapping[str, str]) -> list[str]:
        """LD_LIBRARY_PATH's entries: the variable means nothing to the Windows loader, so none there."""
        return [] if self.windows else [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]

    def executable_extensions(self, env: Mapping[str, str]) -> list[str]:
        """What may follow a program's name on PATH: PATHEXT's entries on Windows, nothing elsewhere."""
        if not self.windows:
            return [""]
        return [ext.lower() for ext in (env.get("PATHEXT") or DEFAULT_PATHEXT).split(";") if ext]


POSIX = PathFlavour(posixpath, ":", windows=False)
NT = PathFlavour(ntpath, ";", windows=True)


def flavour_of_system(system: str | None) -> PathFlavour:
    """The path rules of a machine, from its `platform.system()` name."""
    return NT if system == WINDOWS else POSIX


def flavour_of_snapshot(snapshot: Mapping[str, Any]) -> PathFlavour:
    platform = ((snapshot.get("system") or {}).get("platform") or {})
    return flavour_of_system(platform.get("system"))
