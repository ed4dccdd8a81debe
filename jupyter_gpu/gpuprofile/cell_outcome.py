"""The report's first note: what %%gpuprofile did to the cell. It runs the user's loop only as far as the profile
needs and puts the training state back, so a training cell returns in seconds without having trained; a user who
missed the docs must read that before anything else (its epoch prints never appeared)."""

from __future__ import annotations

from jupyter_gpu.gpuprofile.result import ONE_RUN, ProfileResult


def what_the_cell_did(result: ProfileResult, stopped: bool, completed: int, restored: list[str], keep: bool) -> str:
    """One sentence: whether the loop was stopped or ran to its end, after how many steps (warm-up, profiled, traced),
    and whether what those steps did was put back (naming what was checked equal afterwards) or kept."""
    if result.counted == ONE_RUN:
        ran = "The cell ran once, as written"
    else:
        warmup, profiled = len(result.warmup_seconds), result.steps
        traced = max(0, completed - warmup - profiled)
        parts = [f"{warmup} warm-up", f"{profiled} profiled"]
        if traced:
            parts.append(f"{traced} more traced for its operators and lines")
        counted = f"{completed} {result.counted} ({', '.join(parts)})"
        ran = f"Stopped the loop after {counted}" if stopped else f"The cell ran to its end: {counted}"
    if keep:
        return f"{ran}; --keep: what those steps did is kept (below), so the model trained only those steps."
    if not restored:
        return f"{ran}; no model, optimizer or random generator was found to put back."
    return (f"{ran}; {', '.join(restored)} put back (checked after the run: exactly as before the cell), so the cell "
            "did not train (--keep keeps the steps).")
