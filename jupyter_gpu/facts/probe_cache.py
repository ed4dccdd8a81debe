"""The torch child's answer, kept on disk across processes while nothing it depends on has changed.

Importing torch in a child costs a second or more; its answer only changes when the interpreter, the
torch install (or torchvision/torchaudio beside it), the driver, the device nodes, the GPUs or the
relevant environment variables change. One small JSON file per key under the user's cache folder:

- the file name is a hash of what is known *before* any child runs (interpreter, cwd, root, env, the
  driver and device facts read from files, the tool and probe-script versions), so a hit is found in
  milliseconds and no torch child is started at all;
- the entry lists the files the answer depends on with their size, mtime and inode, checked by `os.stat`
  at lookup (a rebuilt `torch/_C*.so`, a reinstalled wheel, a new package on `sys.path`);
- the entry also holds what only the base child can tell (NVML's driver, GPU UUIDs and MIG modes, the
  install facts, `sys.path`): `matches` compares them once the base child is back, and a mismatch means
  the torch child runs after all.

A missing, corrupt or unreadable entry is a miss, an unwritable folder means no caching: never an error.
The file paths are those the child reported: it runs on this filesystem, so they are stat-ed as they are
(`ProbeContext.root` only remaps the host files under /proc, /sys and /dev that `system.py` reads).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jupyter_gpu.atomic_write import write_text_atomically
from jupyter_gpu.facts.context import ProbeContext
from jupyter_gpu.facts.probe import probe_source
from jupyter_gpu.version import __version__

CACHE_DIR_VARIABLE = "JUPYTER_GPU_CACHE_DIR"
ENTRY_FORMAT = 1
MAX_ENTRIES = 32  # one per (interpreter, cwd, env, ...) in use; the oldest go first
# Not shown in the snapshot's `env`, but they change which torch the child finds or how it loads.
KEY_ONLY_ENV = ("PYTHONHOME", "PYTHONUSERBASE", "PYTHONSAFEPATH", "PYTHONNOUSERSITE", "HOME", "LD_PRELOAD")
# In the snapshot's `env`, but naming a process, not anything torch reads: a restarted server keeps its entry.
KEY_IGNORED_ENV = ("JPY_PARENT_PID", "VSCODE_PID")

FileSignature = list[int] | None


def cache_dir(env: Mapping[str, str]) -> Path | None:
    """`$JUPYTER_GPU_CACHE_DIR`, else `$XDG_CACHE_HOME/jupyter-gpu`, else `~/.cache/jupyter-gpu`, from the
    context's env (never os.environ), so a test's fake machine gets its own folder; None without a HOME."""
    if env.get(CACHE_DIR_VARIABLE):
        return Path(env[CACHE_DIR_VARIABLE])
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "jupyter-gpu"
    if env.get("HOME"):
        return Path(env["HOME"]) / ".cache" / "jupyter-gpu"
    return None


def file_signature(path: str) -> FileSignature:
    try:
        stat = os.stat(path)
    except (OSError, ValueError):  # ValueError: a NUL in a path from a broken sys.path
        return None
    return [stat.st_size, stat.st_mtime_ns, stat.st_ino]


def lookup_key(ctx: ProbeContext, system: dict[str, Any], env: dict[str, str]) -> str:
    """What the answer depends on that is known before any child runs: names the entry's file."""
    stable = {
        "format": ENTRY_FORMAT,
        "tool_version": __version__,
        # A changed probe script (a new section, a fixed reading) must not reuse an answer of the old one.
        "probe_script": hashlib.sha256(probe_source().encode()).hexdigest(),
        "python": ctx.python,
        "python_realpath": os.path.realpath(ctx.python),
        "cwd": ctx.cwd,
        "root": str(ctx.root),
        "env": {**{name: value for name, value in env.items() if name not in KEY_IGNORED_ENV},
                **{name: ctx.env[name] for name in KEY_ONLY_ENV if name in ctx.env}},
        "driver": system.get("driver"),
        "device_nodes": system.get("device_nodes"),
        "pci_gpus": system.get("pci_gpus"),
        "platform": system.get("platform"),
        # A home folder shared by the nodes of a cluster must not hand one node's GPUs to another.
        "host": [(system.get("hosting") or {}).get("hostname"), platform.node()],
    }
    return hashlib.sha256(json.dumps(stable, sort_keys=True, default=str).encode()).hexdigest()


def base_signature(snapshot: dict[str, Any]) -> Any:
    """What only the base child knows and the torch child's answer depends on (JSON-normalised)."""
    nvml = snapshot.get("nvml") or {}
    signature = {
        "nvml": [nvml.get("status"), nvml.get("driver_version"),
                 [(d.get("uuid"), d.get("mig_enabled")) for d in nvml.get("devices") or []]],
        "install": snapshot.get("install"),
        "sys_path": (snapshot.get("python") or {}).get("sys_path"),
    }
    return json.loads(json.dumps(signature, sort_keys=True, default=str))


def dependent_files(ctx: ProbeContext, snapshot: dict[str, Any]) -> list[str]:
    """The files whose change can change the torch child's answer, as the base child located them."""
    python = snapshot.get("python") or {}
    install = snapshot.get("install") or {}
    files = [python.get("executable_realpath") or os.path.realpath(ctx.python)]
    package_dir = install.get("package_dir")
    sites = {d["location"] for d in install.get("distributions") or [] if d.get("location")}
    if package_dir:
        sites.add(os.path.dirname(package_dir))
        files += [os.path.join(package_dir, name) for name in
                  ("version.py", "__init__.py", "lib/libtorch_cuda.so", "lib/libtorch_hip.so")]
        files += sorted(glob.glob(os.path.join(glob.escape(package_dir), "_C*.so")))
        files += sorted(glob.glob(os.path.join(glob.escape(package_dir), "_C*.pyd")))
    # The base child lists every companion it looked for, installed (a dict) or not (None).
    companions = list(install.get("companions") or {})
    for companion in (install.get("companions") or {}).values():
        if isinstance(companion, dict) and companion.get("package_dir"):
            sites.add(os.path.dirname(companion["package_dir"]))
            files.append(os.path.join(companion["package_dir"], "__init__.py"))
    for site in sorted(sites):
        files += [os.path.join(site, name, "version.py") for name in companions]
        for name in ("torch", *companions):
            pattern = os.path.join(glob.escape(site), f"{name}-*.dist-info")
            for dist_info in sorted(glob.glob(pattern)):
                files += [os.path.join(dist_info, "RECORD"), os.path.join(dist_info, "METADATA")]
    # A package added anywhere on sys.path (a `--user` torch, an nvidia-* wheel) changes that folder's mtime.
    # The cwd is left out (a notebook folder changes all the time); only a `torch` there can shadow the real one.
    cwd = os.path.abspath(ctx.cwd)
    files += [entry for entry in python.get("sys_path") or [] if entry and os.path.abspath(entry) != cwd]
    files += [os.path.join(cwd, "torch"), os.path.join(cwd, "torch.py")]
    return list(dict.fromkeys(files))


@dataclass(frozen=True)
class CachedProbe:
    path: Path
    created: str
    torch: dict[str, Any] | None
    record: dict[str, Any]
    base: Any


class TorchProbeCache:
    """The on-disk cache of the torch child's answer: `lookup` before any child runs, `matches` once the
    base child is back, `store` after a successful probe. `directory=None` caches nothing."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory

    @classmethod
    def for_context(cls, ctx: ProbeContext) -> TorchProbeCache:
        return cls(cache_dir(ctx.env))

    def entry_path(self, key: str) -> Path | None:
        return None if self.directory is None else self.directory / f"torch-probe-{key[:40]}.json"

    def lookup(self, key: str) -> CachedProbe | None:
        path = self.entry_path(key)
        if path is None:
            return None
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
            valid = (entry["format"] == ENTRY_FORMAT and entry["key"] == key
                     and all(file_signature(name) == signature for name, signature in entry["files"].items()))
            if not valid:
                return None
            return CachedProbe(path=path, created=str(entry["created"]), torch=entry["torch"],
                               record=dict(entry["record"]), base=entry["base"])
        except (OSError, ValueError, TypeError, KeyError, AttributeError):  # missing or corrupt: a miss
            return None

    @staticmethod
    def matches(cached: CachedProbe, snapshot: dict[str, Any]) -> bool:
        return cached.base == base_signature(snapshot)

    def discard(self, cached: CachedProbe) -> None:
        with contextlib.suppress(OSError):
            cached.path.unlink()

    def store(self, key: str, ctx: ProbeContext, snapshot: dict[str, Any], torch: dict[str, Any] | None,
              record: dict[str, Any]) -> Path | None:
        """Write the entry atomically; None when the folder cannot be written (no caching, no error)."""
        path = self.entry_path(key)
        if path is None:
            return None
        entry = {
            "format": ENTRY_FORMAT,
            "key": key,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "tool_version": __version__,
            "files": {name: file_signature(name) for name in dependent_files(ctx, snapshot)},
            "base": base_signature(snapshot),
            "torch": torch,
            "record": record,
        }
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # A reader in another process sees the old entry or the new one, never half of one.
            write_text_atomically(path, json.dumps(entry, sort_keys=True, default=str))
        except OSError:
            return None
        self._prune()
        return path

    def _prune(self) -> None:
        assert self.directory is not None
        with contextlib.suppress(OSError):
            entries = sorted(self.directory.glob("torch-probe-*.json"), key=lambda p: p.stat().st_mtime_ns)
            for old in entries[:-MAX_ENTRIES]:
                old.unlink()
