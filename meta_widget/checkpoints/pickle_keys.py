"""Keys a pickle hashes, and the hashed containers it builds (``set``, ``OrderedDict``,
``Counter``), under the file's budget.

Python caches the hash of a string, not of a tuple or an int: a key of a million values, or a
huge integer, used a million times through the memo, is a trillion steps of hashing in a file
of a few KB. So a key is hashed only when it is bounded (at most :data:`MAX_KEY_VALUES` values,
tuples at most :data:`MAX_KEY_NESTING` deep: hashing a tuple nested a million deep crashes
CPython), and it is charged a step per value it holds: the work of hashing it.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

from .entries import CheckpointError
from .pickle_budget import Budget
from .pickle_globals import Global, Opaque, StoredTensor

#: values (tuples and what they hold) in one key, and how deep its tuples nest
MAX_KEY_VALUES = 1024
MAX_KEY_NESTING = 8

_FLAT_KEYS = (str, int, float, complex, bytes, type(None), Opaque, Global, StoredTensor)
_INT_BITS_PER_STEP = 2048  # hashing an int reads its digits: a step per 2048 bits
_SET = 232  # an empty set, and one more entry of a set or a dict (amortized, with resizing)
_SET_ITEM = 64
_ODICT = 160  # an empty OrderedDict, and one more entry (its linked list too)
_ODICT_ITEM = 112

Damaged = Callable[[str], CheckpointError]


def hashable(key: Any, budget: Budget, damaged: Damaged) -> Any:
    """``key`` if it can be hashed in bounded work, charged to ``budget``; else ``damaged``."""
    if type(key) is str:  # the common key: its hash is cached once computed
        return key
    values, level, depth = 0, [key], 0
    while level:
        if depth > MAX_KEY_NESTING:
            raise damaged(f"its pickle uses tuples nested past {MAX_KEY_NESTING} as a key")
        nested: list[Any] = []
        for k in level:
            values += 1
            if isinstance(k, tuple):
                if values + len(nested) + len(k) > MAX_KEY_VALUES:
                    raise damaged(f"its pickle uses a key of more than {MAX_KEY_VALUES} values")
                nested.extend(k)
            elif isinstance(k, int):
                values += k.bit_length() // _INT_BITS_PER_STEP
            elif not isinstance(k, _FLAT_KEYS):
                raise damaged(f"its pickle uses a {type(k).__name__} as a key")
        if values > MAX_KEY_VALUES:
            raise damaged(f"its pickle uses a key of more than {MAX_KEY_VALUES} values")
        level, depth = nested, depth + 1
    budget.charge(0, values)
    return key


#: the globals that build hashed containers: given their arguments here, not by their stand-in
CONTAINERS = ("builtins.set", "collections.OrderedDict", "collections.Counter")


def build_container(name: str, args: tuple[Any, ...], budget: Budget, damaged: Damaged) -> Any:
    """What ``name`` (one of :data:`CONTAINERS`) builds from ``args``, as
    ``torch.load(weights_only=True)`` would: every key checked by :func:`hashable`, the bytes
    charged before the container is built. Raises ``TypeError`` for arguments it would refuse.
    """
    if len(args) > 1:
        raise TypeError(f"{name} called with {len(args)} arguments")
    source = args[0] if args else ()
    if not isinstance(source, dict | list | tuple):
        raise TypeError(f"{name} of a {type(source).__name__}")
    n = len(source)
    odict = name == "collections.OrderedDict"
    budget.charge(_ODICT + _ODICT_ITEM * n if odict else _SET + _SET_ITEM * n, n)
    if name == "builtins.set":  # set(a dict) is the set of its keys, as in Python
        return {hashable(v, budget, damaged) for v in source}
    if isinstance(source, dict):
        built = {hashable(k, budget, damaged): v for k, v in source.items()}
        return OrderedDict(built) if odict else Counter(built)
    if not odict:  # Counter(values): how often each is there
        return Counter(hashable(v, budget, damaged) for v in source)
    result: OrderedDict[Any, Any] = OrderedDict()
    for pair in source:  # OrderedDict([(key, value), ...])
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise TypeError("an OrderedDict of something that is not (key, value) pairs")
        result[hashable(pair[0], budget, damaged)] = pair[1]
    return result
