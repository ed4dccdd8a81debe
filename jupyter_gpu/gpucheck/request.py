"""`CheckRequest`: what one `%gpucheck`, `jupyter-gpu check` or `require_gpu()` asks for, as plain data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CheckRequest:
    facts: str | None = None  # diagnose this saved snapshot instead of gathering facts
    root: str | None = None  # read system files under this folder instead of / (tests, chroots)
    timeout: float | None = None  # seconds for the child that imports torch; None: the default
    refresh: bool = False  # probe torch again even if nothing changed: skips the cached answer and rewrites it
    save: str | None = None  # write the facts snapshot here
    verbose: bool = False  # the report shows every fact gathered

    @classmethod
    def from_options(cls, options: Any) -> CheckRequest:
        """From the namespace the shared check parser made (`jupyter_gpu.options.check_parser`)."""
        return cls(facts=options.facts, root=options.root, timeout=options.timeout, refresh=options.refresh,
                   save=options.save, verbose=options.verbose)
