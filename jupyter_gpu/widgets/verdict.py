"""The `%gpucheck` verdict a panel shows instead of an empty box when there is no GPU to watch."""

from __future__ import annotations

from html import escape
from typing import Any

from jupyter_gpu.gpucheck.render import COLOUR


def gpucheck_verdict_html(cache: Any | None = None) -> str:
    """Run `%gpucheck`'s diagnosis of this kernel (torch is probed in a child process) and summarise it:
    the verdict, the primary finding and its exact fix. Takes seconds: call it off the kernel's thread.
    """
    from jupyter_gpu.gpucheck.run import check_this_environment

    try:
        report = check_this_environment(cache)
    except (OSError, ValueError) as exc:
        return f"<div>%gpucheck could not run: {escape(str(exc))}</div>"
    parts = [f'<div style="font-weight:600;color:{COLOUR[report.status]}">%gpucheck: {escape(report.verdict)}</div>']
    primary = report.primary
    if primary is not None:
        if primary.headline not in report.verdict:
            parts.append(f"<div>{escape(primary.headline)}</div>")
        if primary.fix:
            fix = "\n".join(primary.fix)
            parts.append(f'<div>Fix:</div><pre style="margin:.2em 0">{escape(fix)}</pre>')
    parts.append('<div style="opacity:.75">Run %gpucheck for the evidence and every finding.</div>')
    return "".join(parts)
