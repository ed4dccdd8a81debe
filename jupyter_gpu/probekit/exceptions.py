"""Walking an exception's chain: what `%batchprobe` reads to classify a failed trial and what the probes' last-error
release clears. Pure Python.
"""

from __future__ import annotations

from collections.abc import Iterator


def exception_chain(error: BaseException, seen: set[int] | None = None) -> Iterator[BaseException]:
    """The exception and everything reachable through `__cause__` and `__context__`, each once.

    Depth first, cause before context. `raise X from oom` sets both to the same object; the seen-set both
    drops that duplicate and stops on a cycle (an exception can end up in its own context). A context hidden
    with `from None` is still walked: that only shortens the printout, the memory still ran out. Pass the
    same `seen` to walk several chains without visiting a shared exception twice.
    """
    seen = set() if seen is None else seen
    stack = [error]
    while stack:
        exception = stack.pop()
        if id(exception) in seen:
            continue
        seen.add(id(exception))
        yield exception
        for linked in (exception.__context__, exception.__cause__):  # pushed in reverse: cause pops first
            if linked is not None:
                stack.append(linked)
