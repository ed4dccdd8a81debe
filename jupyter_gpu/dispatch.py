"""One `TorchDispatchMode` that hands every ATen operator to a Python handler (operator counting, budgets)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# handler(func, args, kwargs) runs the operator (func(*args, **kwargs)) and returns its result.
Handler = Callable[[Any, tuple, dict], Any]


def handler_mode(handler: Handler) -> Any:
    """A fresh dispatch mode (a context manager) that calls `handler` for every operator below autograd.

    It declares `ignore_compile_internals`: without it, Dynamo skips, for good, a function first called
    under the mode, so `torch.compile` would silently stop compiling the user's code.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    class HandlerMode(TorchDispatchMode):
        @classmethod
        def ignore_compile_internals(cls) -> bool:
            return True

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            return handler(func, args, kwargs or {})

    return HandlerMode()
