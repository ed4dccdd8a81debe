"""Files a profiled loop, or a probed step, writes with `torch.save`, put back afterwards.

A training cell keeps its best model on disk (`torch.save(model.state_dict(), "best.pt")` after a validation that
improved). Profiled, that cell's first epoch beats the `inf` it starts from, so the profile's few steps overwrote the
checkpoint of the user's real run with a barely trained model, while the model in memory was put back. Here a file
that existed is moved aside (a rename, in its own directory) before the loop's first save to it, and moved back
afterwards; a file the loop created is removed. The saves themselves still run, so their cost stays in the steps.
The probes guard their step alike: a loop body lifted with its `if step % 100 == 0: torch.save(...)` is called tens
of times by `%speedprobe`. A save through a file object, or through a `save` imported by name before the profile,
is not seen.

Probe layer: torch is the caller's.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Any

from jupyter_gpu.probekit.step_variables import advanced_iterators_notes


class SavedFiles:
    """While entered, `torch.save` to a path keeps what was there; `restore()` puts every such path back as it was
    (again and again: later saves are put back too), and leaving the block restores once more."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._original: Any = None
        self._backups: dict[Path, Path | None] = {}  # the path saved to -> where its old file waits (None: new)
        self.restored: list[str] = []  # the paths put back, as the loop named them, each once
        self.failed: list[str] = []    # the paths that could not be put back, with why

    def __enter__(self) -> SavedFiles:
        torch = self._torch
        self._original = original = torch.save

        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(f, str | os.PathLike):
                self._before_saving(Path(f))
            return original(obj, f, *args, **kwargs)

        torch.save = save
        torch.serialization.save = save
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._original is not None:
            self._torch.save = self._original
            self._torch.serialization.save = self._original
            self._original = None
        self.restore()

    def _before_saving(self, path: Path) -> None:
        if path in self._backups:
            return
        if not path.is_file():
            self._backups[path] = None
            return
        backup = path.with_name(f".{path.name}.jupyter-gpu-{os.getpid()}.bak")
        os.replace(path, backup)  # a rename: instant, whatever the checkpoint's size
        self._backups[path] = backup

    def restore(self) -> None:
        """Every saved-to path back as it was: the old file where there was one, no file where there was none."""
        for path, backup in list(self._backups.items()):
            try:
                if backup is not None:
                    os.replace(backup, path)
                else:
                    path.unlink(missing_ok=True)
            except OSError as exc:
                kept = f"; the old file is {backup}" if backup is not None else ""
                self.failed.append(f"{path} ({exc.strerror or exc}{kept})")
                continue
            del self._backups[path]
            if str(path) not in self.restored:
                self.restored.append(str(path))


def saved_files_notes(saves: SavedFiles, writer: str, keep: str = "") -> list[str]:
    """The report's notes on the files put back and those that could not be: `writer` says whose saves they were
    ("the cell's torch.save"), `keep` how to keep what they wrote, if the command can ("; --keep keeps ...")."""
    notes = []
    if saves.restored:
        notes.append(f"{', '.join(saves.restored)}: written by {writer} and put back as before (the old file, or no "
                     f"file where there was none){keep}.")
    if saves.failed:
        notes.append(f"could not be put back after {writer}: {'; '.join(saves.failed)}.")
    return notes


def probe_leftover_notes(saves: SavedFiles, advanced: list[tuple[str, str]]) -> list[str]:
    """What every probe says of its step's calls beyond the state it puts back: the files their torch.save wrote
    (put back) and the notebook's iterators they read from (`StateSnapshot.advanced_iterators`: not rewound)."""
    return [*saved_files_notes(saves, "the step's torch.save while the probe called it"),
            *advanced_iterators_notes(advanced, "The probe's calls of the step")]
