"""The benches' result tables, printed as aligned text or as Markdown for docs/benchmarks.md."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence


def print_table(headings: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool = False) -> None:
    """Print `rows` under `headings`: Markdown with the first two columns left-aligned and the rest right-aligned, or
    text with each column as wide as its widest cell."""
    if markdown:
        print("| " + " | ".join(headings) + " |")
        print("|" + "|".join("---" if i < 2 else "---:" for i in range(len(headings))) + "|")
        for line in rows:
            print("| " + " | ".join(line) + " |")
        return
    table = [tuple(headings), *rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(headings))]
    for line in table:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip())


def print_report(headings: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool,
                 after: Sequence[Callable[[], None]], begun: float) -> None:
    """The end of a bench's run: a blank line, the table, what each of `after` prints (its summary and details),
    and the run's wall time since `begun` (a time.perf_counter() reading)."""
    print()
    print_table(headings, rows, markdown)
    for part in after:
        part()
    print(f"\nWhole run: {time.perf_counter() - begun:.1f} s")
