"""What a `functools.lru_cache` (or `functools.cache`) wrapper keeps: each cached call's arguments and result.

Probe ring. CPython's C wrapper (`functools._lru_cache_wrapper`, Modules/_functoolsmodule.c) has no Python
attribute for its entries: `cache_info()` counts them and `cache_clear()` drops them. They are reached here the way
the garbage collector reaches them, through `gc.get_referents(wrapper)`, which lists what the wrapper's
`tp_traverse` visits and calls no code of the user's:

- the wrapper's `cache`, a dict from each call's key to its result (an unbounded cache) or to a private
  `_lru_list_elem` link that Python cannot read (a bounded one);
- for a bounded cache, each link's key and then its result, oldest first (3.11 to 3.14 visit `link->key` then
  `link->result`, 3.13+ with the link's type after them), so a result is the referent right after its key;
- the wrapper's own `__dict__`, its function, and on 3.12+ the keyword marker and a few types.

The key is the call's arguments as `_functoolsmodule.c` builds it: the argument itself for one `int` or `str`, else
a tuple of the positional arguments, then the keyword marker and each keyword's name and value, then (with
`typed=True`) the arguments' types.
"""

from __future__ import annotations

import functools
import gc
import itertools
import types
from typing import Any


def _wrapper_type() -> type | None:
    wrapper_type = type(functools.lru_cache(maxsize=None)(len))
    # Without the C accelerator the wrapper is a plain function whose closure holds the cache dict: the walk reads
    # closures already, so there is nothing special to do.
    return None if wrapper_type is types.FunctionType else wrapper_type


LRU_CACHE_TYPE = _wrapper_type()


def is_lru_cache(item_type: type) -> bool:
    return item_type is LRU_CACHE_TYPE  # the C type cannot be subclassed


def cache_entries(wrapper: Any, limit: int) -> tuple[list[tuple[str, Any, Any]], int]:
    """(key as the call's arguments, key, result) for at most `limit` cached calls of an lru_cache wrapper, and how
    many calls it caches in all."""
    own = object.__getattribute__(wrapper, "__dict__")
    referents = gc.get_referents(wrapper)
    cache = next((item for item in referents if type(item) is dict and item is not own), None)
    if not cache:
        return [], 0
    marker = _keyword_marker(referents, cache)
    if type(next(iter(cache.values()))).__name__ != "_lru_list_elem":
        pairs = list(itertools.islice(cache.items(), limit))
    else:
        pairs = _bounded_pairs(referents, cache, limit)
    return [(call_text(key, marker), key, result) for key, result in pairs], len(cache)


def _bounded_pairs(referents: list[Any], cache: dict[Any, Any], limit: int) -> list[tuple[Any, Any]]:
    """A bounded cache's dict holds opaque links: each key is paired with the referent that follows it."""
    keys = {id(key) for key in cache}
    pairs: list[tuple[Any, Any]] = []
    index = 0
    while index < len(referents) - 1 and len(pairs) < limit:
        item = referents[index]
        if id(item) in keys:
            keys.discard(id(item))
            pairs.append((item, referents[index + 1]))
            index += 2
        else:
            index += 1
    return pairs


def _keyword_marker(referents: list[Any], cache: dict[Any, Any]) -> Any | None:
    """The object that separates positional from keyword arguments in a key: a bare `object()` (3.12+ lists it
    among the referents; earlier, it is found inside a key)."""
    for item in referents:
        if type(item) is object:
            return item
    for key in cache:
        if type(key) is tuple:
            for part in key:
                if type(part) is object:
                    return part
    return None


def call_text(key: Any, marker: Any | None) -> str:
    """A cache key as the call's arguments: `3`, `'dog'`, `(4, 'a')`, `(4, scale=2.0)`."""
    if type(key) is not tuple:
        return _value_text(key)
    parts = list(key)
    keywords: list[str] = []
    if marker is not None and any(part is marker for part in parts):
        at = next(index for index, part in enumerate(parts) if part is marker)
        rest = parts[at + 1:]
        parts = parts[:at]
        keywords = [f"{name}={_value_text(value)}" for name, value in zip(rest[0::2], rest[1::2], strict=False)
                    if type(name) is str]
    texts = [_value_text(part) for part in parts] + keywords
    text = "(" + ", ".join(texts) + ("," if len(texts) == 1 and not keywords else "") + ")"
    return text if len(text) <= 60 else text[:57] + "..."


_LITERALS = (str, int, float, bool, type(None))


def _value_text(value: Any) -> str:
    # The exact built-in types only: a subclass's __repr__, or a __class__ it computes, is the user's code.
    if type(value) in _LITERALS or (type(value) is tuple and len(value) <= 4
                                    and all(type(part) in _LITERALS for part in value)):
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."
    if issubclass(type(value), type):
        return value.__name__  # typed=True appends the arguments' types
    return f"<{type(value).__name__}>"
