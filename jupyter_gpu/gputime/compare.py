"""`compare(a, b, ...)`: several `%%gputime` results side by side, with speed-ups against the first."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any

from jupyter_gpu.gputime.result import GpuTimeResult
from jupyter_gpu.rendering.units import format_seconds

COLUMNS = ("", "median", "min", "IQR", "n", "GPU median", "speed-up")


@dataclass(frozen=True)
class Comparison:
    """A table of results; `speedups[i]` is baseline median / result median (2.0 means twice as fast)."""

    results: list[GpuTimeResult]
    labels: list[str] | None = None  # default: each result's own label
    baseline: int = 0

    def __post_init__(self) -> None:
        if not self.results:
            raise ValueError("compare() needs at least one GpuTimeResult (from %%gputime -o).")
        for result in self.results:
            if not isinstance(result, GpuTimeResult):
                raise TypeError(f"compare() takes GpuTimeResult objects (from %%gputime -o), not "
                                f"{type(result).__name__}.")
        if self.labels is None:
            object.__setattr__(self, "labels", [r.label for r in self.results])
        if len(self.labels) != len(self.results):
            raise ValueError(f"compare() got {len(self.labels)} labels for {len(self.results)} results.")
        if not 0 <= self.baseline < len(self.results):
            raise ValueError(f"baseline must be an index from 0 to {len(self.results) - 1}.")

    @property
    def speedups(self) -> list[float | None]:
        base = self.results[self.baseline].median
        return [base / r.median if r.median > 0 and base > 0 else None for r in self.results]

    def rows(self) -> list[list[str]]:
        rows = []
        for index, (label, result, speedup) in enumerate(zip(self.labels, self.results, self.speedups, strict=True)):
            stats = result.stats
            gpu = result.gpu_median
            rows.append([label, format_seconds(stats.median), format_seconds(stats.minimum),
                         format_seconds(stats.iqr), str(stats.n), format_seconds(gpu) if gpu is not None else "-",
                         "baseline" if index == self.baseline else _speedup(speedup)])
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {"labels": list(self.labels), "baseline": self.baseline, "speedups": self.speedups,
                "results": [r.to_dict() for r in self.results]}

    def __str__(self) -> str:
        table = [list(COLUMNS), *self.rows()]
        widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
        lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths,
                 strict=True))).rstrip() for row in table]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{escape(c)}</th>" for c in COLUMNS)
        body = "".join("<tr>" + "".join(f'<td style="text-align:{"left" if i == 0 else "right"}">{escape(c)}</td>'
                                        for i, c in enumerate(row)) + "</tr>" for row in self.rows())
        return f'<table class="jupyter-gpu-compare"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))


def compare(*results: GpuTimeResult, labels: list[str] | None = None, baseline: int = 0) -> None:
    """Show several `%%gputime -o` results side by side, with speed-ups against `results[baseline]`.

    Displays the table (rich in a notebook, text in a terminal). For the numbers in code, build a
    `Comparison(results, labels)` and read `.speedups`.
    """
    table = Comparison(list(results), list(labels) if labels is not None else None, baseline)
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        print(table)
        return
    if get_ipython() is not None:
        display(table)
    else:
        print(table)


def _speedup(ratio: float | None) -> str:
    if ratio is None or ratio <= 0:
        return "-"
    return f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"
