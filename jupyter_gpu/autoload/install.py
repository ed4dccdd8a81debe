"""Switch autoload on or off in an environment: read, merge and write its `ipython_kernel_config.py`.

The file is shared with the user and other tools, so only our block changes, the write is atomic (a
kernel starting meanwhile reads the old file or the new one, never half of one) and the file keeps its mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jupyter_gpu.atomic_write import write_text_atomically
from jupyter_gpu.autoload.config import BlockError, BlockState, add_block, config_file, read_block, remove_block


class AutoloadError(Exception):
    """Autoload could not be switched or read, as one sentence a user can act on."""


@dataclass(frozen=True)
class Change:
    path: Path
    changed: bool
    state: BlockState
    file_removed: bool = False


def read_state(prefix: str | Path) -> tuple[Path, BlockState]:
    path = _checked_prefix(prefix)
    return path, _parse(path, _read(path))


def switch_on(prefix: str | Path, *, watch: bool) -> Change:
    path = _checked_prefix(prefix)
    old = _read(path)
    _parse(path, old)
    new = add_block(old, watch=watch)
    if new != old:
        _write(path, new)
    return Change(path, new != old, BlockState(on=True, watch=watch))


def switch_off(prefix: str | Path) -> Change:
    path = _checked_prefix(prefix)
    old = _read(path)
    if not _parse(path, old).on:
        return Change(path, False, BlockState(on=False, watch=False))
    new = remove_block(old)
    if new.strip():
        _write(path, new)
        return Change(path, True, BlockState(on=False, watch=False))
    try:
        path.unlink()
    except OSError as exc:
        raise AutoloadError(_cannot_write(path, exc)) from None
    return Change(path, True, BlockState(on=False, watch=False), file_removed=True)


def _checked_prefix(prefix: str | Path) -> Path:
    if not Path(prefix).is_dir():
        raise AutoloadError(f"There is no environment at {prefix}: pass --prefix with an environment's folder "
                            f"(its sys.prefix).")
    return config_file(prefix)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):  # not written yet (writing will say why it cannot be)
        return ""
    except (OSError, UnicodeDecodeError) as exc:
        raise AutoloadError(f"Cannot read {path}: {getattr(exc, 'strerror', None) or exc}.") from None


def _parse(path: Path, text: str) -> BlockState:
    try:
        return read_block(text)
    except BlockError as exc:
        raise AutoloadError(f"{path}: {exc}") from None


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
        write_text_atomically(path, text, mode=mode)
    except OSError as exc:
        raise AutoloadError(_cannot_write(path, exc)) from None


def _cannot_write(path: Path, exc: OSError) -> str:
    return (f"Cannot write {path} ({exc.strerror or exc}): run `jupyter-gpu autoload` with the Python of an "
            f"environment you can write to, or pass --prefix with a writable environment's folder.")
