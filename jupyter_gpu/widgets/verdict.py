"""The `%gpucheck` verdict a panel shows instead of an empty box when there is no GPU to watch."""

from __future__ import annotations

from html import escape

from jupyter_gpu.gpucheck.report import CheckBrief
from jupyter_gpu.rendering.kit import COLOUR, code_block_html


def gpucheck_verdict_html() -> str:
    """Run `%gpucheck`'s diagnosis of this kernel (torch is probed in a child process) and summarise it:
    the verdict, the primary finding and its exact fix. Takes seconds: call it off the kernel's thread.
    """
    from jupyter_gpu.gpucheck.run import check_this_environment

    try:
        brief = check_this_environment().brief()
    except (OSError, ValueError) as exc:
        brief = CheckBrief.could_not_run(exc)
    verdict = brief.verdict if brief.verdict.startswith("%gpucheck") else f"%gpucheck: {brief.verdict}"
    parts = [f'<div style="font-weight:600;color:{COLOUR[brief.status]}">{escape(verdict)}</div>']
    if brief.headline is not None:
        parts.append(f"<div>{escape(brief.headline)}</div>")
    if brief.fix:
        parts.append(f'<div>Fix:</div>{code_block_html(chr(10).join(brief.fix))}')
    parts.append('<div style="opacity:.75">Run %gpucheck for the evidence and every finding.</div>')
    return "".join(parts)
