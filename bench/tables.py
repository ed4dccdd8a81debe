"""The benches' result tables, printed as aligned text or as Markdown for docs/benchmarks.md."""

from __future__ import annotations

from collections.abc import Sequence


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
