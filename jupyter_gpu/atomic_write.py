"""Replace a file's text in one step: readers (another process, a crash mid-write) see the old file or the new.

Written to a temporary file in the same folder (so the rename stays on one file system), then `os.replace`.
Standard library only, for every writer in the package: recordings, the probe cache, the autoload config.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_text_atomically(path: Path, text: str, *, mode: int | None = None) -> None:
    """Write `text` to `path` (UTF-8); `mode`, when given, is set before the file appears. Raises OSError."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:  # Ctrl-C or a full disk: leave no half-written temporary behind
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
