"""One shape for every registry of the package: sources of models, explanations of errors,
upper bounds of value-dependent ops, collectives, and those to come.

A :class:`Registry` maps a key to an entry, in registration order (the order a lookup tries
them in). Each registry is one module-level instance, filled by a public ``register_*``
function of its own module; ``scoped()`` gives a test (or a user trying something out) a
registry it may change freely, put back as it was on leaving, whatever happened inside:

>>> with BOUNDS.scoped():
...     register_bound("mylib::keep_positive", lambda x: x.numel())
...     mw.analyze(model, input_size=(8, 16))
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

__all__ = ["Registry"]

K = TypeVar("K")
V = TypeVar("V")


class Registry(Generic[K, V]):
    """Entries by key, in the order they were registered (a key registered again keeps its
    place unless ``first=True`` moves it to the front).

    Parameters
    ----------
    what
        What an entry is, for messages (``"bound"``, ``"source of models"``).
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self._entries: dict[K, V] = {}
        self._lock = threading.RLock()

    def register(self, key: K, entry: V, *, first: bool = False) -> V:
        """Add (or replace) ``key``'s entry; ``first`` puts it before every other."""
        with self._lock:
            if first:
                self._entries = {key: entry, **{k: v for k, v in self._entries.items() if k != key}}
            else:
                self._entries[key] = entry
        return entry

    def unregister(self, key: K) -> V:
        """Remove ``key``'s entry and return it (``KeyError`` naming the registry if absent)."""
        with self._lock:
            try:
                return self._entries.pop(key)
            except KeyError:
                raise KeyError(f"no {self.what} {key!r} is registered") from None

    def get(self, key: K) -> V | None:
        return self._entries.get(key)

    def __getitem__(self, key: K) -> V:
        try:
            return self._entries[key]
        except KeyError:
            raise KeyError(f"no {self.what} {key!r} is registered") from None

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._entries))

    def items(self) -> list[tuple[K, V]]:
        """The entries in lookup order (a copy: registering while iterating is safe)."""
        return list(self._entries.items())

    def values(self) -> list[V]:
        return list(self._entries.values())

    @contextmanager
    def scoped(self) -> Iterator[Registry[K, V]]:
        """Changes made inside the block are undone on leaving it, on every path."""
        with self._lock:
            saved = dict(self._entries)
        try:
            yield self
        finally:
            with self._lock:
                self._entries = saved

    def __repr__(self) -> str:
        return f"<Registry of {len(self)} {self.what} entries: {list(self._entries)[:8]}>"
