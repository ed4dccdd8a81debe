"""Pause Python's cycle collector while %gpumem builds and renders a map.

A map of 10,000 storages allocates a few records and names per storage; in a kernel with a few hundred thousand
objects that sets off a full collection pass, which cost 0.2 s of a 0.45 s call in bench/bench_gpumem.py. Nothing
the walk allocates is cyclic garbage, so the pass finds nothing to free; the collector runs again as soon as it is
back on. Pure: the standard library's gc only.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The collector off for the block, then as it was (a user who disabled it keeps it disabled)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
