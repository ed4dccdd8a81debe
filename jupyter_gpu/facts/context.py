"""The one door to the outside world for fact gathering.

Every file read goes through `root` and every subprocess gets `env`, `python` and `cwd` from here, so a
test can lay out a whole fake machine in a temporary folder (files, device nodes, stub `torch` and
`pynvml` modules on PYTHONPATH) and run the real gathering code against it.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_gpu.snapshot.paths import PathFlavour, flavour_of_system

ROOT_VARIABLE = "JUPYTER_GPU_ROOT"
DEFAULT_PROBE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ProbeContext:
    root: Path = Path("/")
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    # The interpreter whose view of torch we diagnose: the kernel's own by default.
    python: str = sys.executable
    cwd: str = field(default_factory=os.getcwd)
    pid: int = field(default_factory=os.getpid)
    probe_timeout_s: float = DEFAULT_PROBE_TIMEOUT_S
    # Device-node access check. CI runs as root, where os.access is always True, so tests of
    # "permission denied" inject their own check here.
    access: Callable[[str], bool] | None = None
    # The modules the *kernel* has imported (sys.modules by default): where the in-kernel torch is read.
    modules: Mapping[str, object] = field(default_factory=lambda: sys.modules)
    # The checked machine's `platform.system()`: a test stamps a fake machine as "Windows", and every
    # platform-specific reader asks this, not the host it runs on.
    system: str = field(default_factory=platform.system)

    @property
    def flavour(self) -> PathFlavour:
        return flavour_of_system(self.system)

    @property
    def windows(self) -> bool:
        return self.flavour.windows

    @classmethod
    def from_environment(cls, root: str | None = None, **overrides: object) -> ProbeContext:
        env = dict(os.environ)
        chosen = root or env.get(ROOT_VARIABLE) or "/"
        return cls(root=Path(chosen), env=env, **overrides)  # type: ignore[arg-type]

    def path(self, absolute: str) -> Path:
        """Map an absolute machine path into the root folder (C:\\x\\y goes to <root>/C/x/y)."""
        if self.root == Path(self.root.anchor):
            return Path(absolute)  # the real machine: its own paths, whatever their flavour
        if self.windows:
            drive, rest = self.flavour.module.splitdrive(absolute)
            parts = [part for part in re.split(r"[\\/]", rest) if part]
            return self.root.joinpath(drive.rstrip(":"), *parts) if drive else self.root.joinpath(*parts)
        return self.root / absolute.lstrip("/")

    def read_text(self, absolute: str, limit: int = 65536) -> str | None:
        try:
            with open(self.path(absolute), encoding="utf-8", errors="replace") as handle:
                return handle.read(limit)
        except OSError:
            return None

    def exists(self, absolute: str) -> bool:
        return os.path.lexists(self.path(absolute))

    def listdir(self, absolute: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(absolute)))
        except OSError:
            return []

    def can_read_write(self, absolute: str) -> bool:
        if self.access is not None:
            return self.access(absolute)
        return os.access(self.path(absolute), os.R_OK | os.W_OK)

    def resolve(self, absolute: str, max_hops: int = 16) -> str | None:
        """Follow symlinks *inside the root*: an absolute link target stays in the fake machine."""
        current = absolute
        for _ in range(max_hops):
            mapped = self.path(current)
            if not os.path.lexists(mapped):
                return None
            if not os.path.islink(mapped):
                return current
            target = os.readlink(mapped)
            paths = self.flavour
            current = target if paths.is_absolute(target) else paths.module.normpath(
                paths.join(paths.dirname(current), target)
            )
        return None
