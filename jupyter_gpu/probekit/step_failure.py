"""The user's step, called by a probe: whether it can take the arguments the probe passes, and, when it raises, one
sentence naming the error and the user's own line it came from. Shared by `%speedprobe` (`step()`), `%dataprobe`
(`step(batch)`) and `%batchprobe` (`step(batch_size)`), so the three word a broken step the same way.
"""

from __future__ import annotations

import inspect
import traceback
from typing import Any

from jupyter_gpu.probekit.user_line import innermost_user_frame, place_of


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (torch's argument errors run to dozens), or its type's name."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def raised_sentence(torch: Any, exc: BaseException) -> str:
    """"ValueError: bad shape (at Cell In[3], line 4, in step: `...`)": the error and the innermost line of the
    user's code it passed through, where there is one."""
    frames = list(traceback.walk_tb(exc.__traceback__))
    index = innermost_user_frame(torch, frames)
    where = f" (at {place_of(*frames[index])})" if index is not None else ""
    return f"{type(exc).__name__}: {first_line(exc)}{where}"


def argument_mismatch(step: Any, name: str, passed: int, call: str) -> str | None:
    """None when `step` can be called with `passed` positional arguments; else the sentence saying what it takes
    and how the probe calls it (`call`: "%speedprobe calls it with no arguments"). A callable without a readable
    signature (a builtin) is let through: the call will say."""
    parameters = _parameters(step)
    if parameters is None:
        return None
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p.name for p in positional if p.default is p.empty]
    required_keywords = [p.name for p in parameters if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    takes_any = any(p.kind is p.VAR_POSITIONAL for p in parameters)
    if len(required) <= passed and (takes_any or passed <= len(positional)) and not required_keywords:
        return None
    takes = ", ".join(required + required_keywords) if required or required_keywords else "no arguments"
    return f"`{name}` takes {takes}, and {call}"


def first_parameter(step: Any) -> str | None:
    """The name of the step's first parameter (`batch_size`, `batch`), or None (none, or no readable signature)."""
    parameters = _parameters(step)
    return parameters[0].name if parameters else None


def _parameters(step: Any) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(step).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature
        return None
