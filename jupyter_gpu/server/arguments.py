"""Query arguments of the server's routes, checked the same way on every one (the polling routes and the stream)."""

from __future__ import annotations

import math

from tornado import web


def number_argument(handler: web.RequestHandler, name: str, what: str) -> float | None:
    """The query argument `name` as a finite number, None when absent; anything else is a 400 saying `what`."""
    text = handler.get_argument(name, None)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise web.HTTPError(400, f"'{name}' must be {what}, got {text!r}.")
    return value
