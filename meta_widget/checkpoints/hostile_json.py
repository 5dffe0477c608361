"""JSON from files nobody vouches for: objects that remember repeated keys, no NaN or Infinity,
and the small type checks the readers share.
"""

from __future__ import annotations

from collections import Counter
from typing import Any


class _Object(dict):  # type: ignore[type-arg]
    """A JSON object that remembers the keys it held more than once (last one kept)."""

    repeated: frozenset[str] = frozenset()


def object_pairs(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object(pairs)
    if len(obj) != len(pairs):
        counts = Counter(k for k, _ in pairs)
        obj.repeated = frozenset(k for k, n in counts.items() if n > 1)
    return obj


def no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_kind(value: object) -> str:
    if value is None:
        return "missing or null"
    if isinstance(value, dict):
        bad = next((v for v in value.values() if not isinstance(v, str)), None)
        if bad is None:
            return "that"
        exact = isinstance(bad, int) and not isinstance(bad, bool)  # a negative int is a subclass
        return f"an object holding a {'int' if exact else type(bad).__name__}"
    return f"a {type(value).__name__}"


def is_text(s: str) -> bool:
    """True when ``s`` can be written as UTF-8 (JSON allows lone surrogates; Rust does not)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
