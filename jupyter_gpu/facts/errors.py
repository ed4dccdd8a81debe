"""One way to write an error into the facts: "module.Type: message", safe against a broken __str__."""

from __future__ import annotations

MAX_MESSAGE_CHARS = 4000


def qualified_name(cls: type) -> str:
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def error_message(exc: BaseException) -> str:
    try:
        return str(exc)[:MAX_MESSAGE_CHARS]
    except Exception as inner:  # a broken __str__ must not hide the exception itself
        return f"<str() raised {type(inner).__name__}>"


def describe_error(exc: BaseException) -> str:
    return f"{qualified_name(type(exc))}: {error_message(exc)}"
