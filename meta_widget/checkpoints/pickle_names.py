"""A ``torch.save`` pickle's value as dotted names: its tensors, and its other values with
their type, listed under the file's budget.

Names are those ``torch.load`` gives the same object: dict keys and list, tuple and set
positions joined by dots (``layers.0.1`` is ``obj["layers"][0][1]``). A set has no order, so its
members are numbered in one order both sides can compute: by dtype and shape for tensors, by
type and value for the rest (two members that order cannot tell apart have the same shape and
dtype, so the list is the same whichever comes first).
"""

from __future__ import annotations

from typing import Any

from .entries import CheckpointError, TensorEntry, quoted
from .pickle_budget import Budget
from .pickle_globals import Global, Opaque, StoredTensor

_MAX_NESTING = 100  # containers inside containers in one torch.save file
_ENTRY = 160  # a name's entry: the list or dict slot that keeps it, its tuple on the stack
_CHILD = 80  # a child waiting on the stack: its tuple (value, parent, key, depth)
_MEMO = 104  # an entry of a table keyed by object id
_SEQUENCES = (list, tuple, set)
_END = object()


class Flattener:
    """Walks a pickle's value into :attr:`tensors`, :attr:`duplicates` and :attr:`others`.

    A pickle can share objects (``[x] * 20``, ten levels deep, is 20**10 paths to one list in a
    3.7 KB file) and hold cycles (a dict holding itself). Each container is expanded once, under
    the first name that reaches it; every later reference is listed in ``others`` as
    ``"same <type> as <first name>"`` and counted in a note. Tensors reached twice (tied weights)
    are listed under each name, as ``state_dict`` does; two tensors reached under one name
    (``"fc.weight"`` beside ``{"fc": {"weight": ...}}``) are a duplicate: the first is listed,
    the others are in ``duplicates``. Dicts are always expanded; a list, tuple or set only when
    it holds a tensor or a dict at some depth (a list of numbers is one entry of ``others``).

    The walk has no recursion and stops past :data:`_MAX_NESTING` levels. Every name is charged
    to the file's budget *before* it is built (a 4 MB key above 2,000 entries would otherwise
    build 8 GB of names), and so is every step of the walk.
    """

    def __init__(self, file: str, budget: Budget) -> None:
        self.file = file
        self.budget = budget
        self.tensors: list[TensorEntry] = []
        self.duplicates: list[TensorEntry] = []
        self.others: dict[str, str] = {}
        self.shared = 0
        self.first: dict[int, str] = {}  # id of an expanded container -> its first name
        self.named: set[str] = set()  # names of the tensors listed
        self.holding: dict[int, bool] = {}  # id of a list, tuple or set -> holds a tensor

    def run(self, obj: Any) -> None:
        # the objects stay alive in `obj` for the whole walk, so their ids are never reused
        stack: list[tuple[Any, str | None, Any, int]] = [(obj, None, None, 0)]
        while stack:
            item, parent, key, depth = stack.pop()
            self._visit(item, self._name(parent, key), depth, stack)

    def _name(self, parent: str | None, key: Any) -> str:
        """``parent.key`` (the root: ``""``), charged to the budget before it is built."""
        if parent is None:
            self.budget.charge(_ENTRY)
            return ""
        text = key if type(key) is str else None
        size = len(text) if text is not None else _text_size(key)
        # one byte a character when both are ASCII (an int's digits are), else up to four
        ascii_key = text.isascii() if text is not None else isinstance(key, int)
        narrow = parent.isascii() and ascii_key
        steps = 1 if text is not None else _text_steps(key)
        self.budget.charge((1 if narrow else 4) * (len(parent) + 1 + size) + _ENTRY, steps)
        if text is None:
            text = _key(key)
        return f"{parent}.{text}" if parent else text

    def _visit(
        self, item: Any, name: str, depth: int, stack: list[tuple[Any, str | None, Any, int]]
    ) -> None:
        """Record ``item``; put its children on ``stack`` (in order)."""
        label = name or "<root>"
        if isinstance(item, StoredTensor):
            self._tensor(item, name)
            return
        if not isinstance(item, (dict, *_SEQUENCES)):
            self.others[label] = _kind(item)
            return
        first = self.first.get(id(item))
        if first is not None:
            self.shared += 1
            self.budget.charge(4 * len(first) + 64, 0)
            self.others[label] = f"same {type(item).__name__} as {first}"
            return
        self.budget.charge(_MEMO, 0)
        self.first[id(item)] = label
        if not isinstance(item, dict) and not self._holds(item):
            self.others[label] = type(item).__name__  # a list of values: one entry
            return
        if depth >= _MAX_NESTING:
            raise CheckpointError(
                f"{self.file!r} nests containers more than {_MAX_NESTING} levels deep (at "
                f"{quoted(label)}): refused, it is not a model checkpoint a person would write. "
                "If you wrote it, save the model's state_dict() instead."
            )
        self.budget.charge(_CHILD * len(item), 0)  # before the children are listed
        if isinstance(item, dict):
            pairs: Any = item.items()
        elif isinstance(item, set):
            n = len(item)
            self.budget.charge(0, n * max(1, n.bit_length()))  # sorting it
            pairs = enumerate(sorted(item, key=_order))
        else:
            pairs = enumerate(item)
        children = [(v, name, k, depth + 1) for k, v in pairs]
        stack.extend(reversed(children))

    def _holds(self, root: list[Any] | tuple[Any, ...] | set[Any]) -> bool:
        """True when ``root`` holds a tensor or a dict, at any depth (lists in lists...).

        Each container is looked into once (a table by id), a step per value it holds. A
        container met again while it is being looked into (a cycle) counts as holding nothing
        there: whatever it holds is listed where it is expanded.
        """
        holding = self.holding
        if id(root) in holding:
            return holding[id(root)]
        self.budget.charge(_MEMO, 0)
        holding[id(root)] = False
        path: list[list[Any]] = [[root, iter(root), False]]
        while path:
            frame = path[-1]
            child = _END if frame[2] else next(frame[1], _END)
            if child is _END:
                path.pop()
                holding[id(frame[0])] = frame[2]
                if path and frame[2]:
                    path[-1][2] = True
                continue
            self.budget.charge(0, 1)
            if isinstance(child, StoredTensor | dict):
                frame[2] = True
            elif isinstance(child, _SEQUENCES):
                if id(child) not in holding:
                    self.budget.charge(_MEMO, 0)
                    holding[id(child)] = False
                    path.append([child, iter(child), False])
                elif holding[id(child)]:
                    frame[2] = True
        return holding[id(root)]

    def _tensor(self, item: StoredTensor, name: str) -> None:
        entry = TensorEntry(name, item.shape, item.dtype, item.nbytes, self.file)
        if name in self.named:
            self.duplicates.append(entry)
            return
        self.named.add(name)
        self.tensors.append(entry)

    def notes(self) -> list[str]:
        notes = []
        if self.shared:
            notes.append(
                f"{self.shared} reference(s) to containers listed already (the pickle shares "
                "them): each container is listed once, under its first name; see 'others'."
            )
        if self.duplicates:
            d = self.duplicates[0]
            notes.append(
                f"{len(self.duplicates)} tensor name(s) are given twice, e.g. {quoted(d.name)} "
                "(a key with dots beside nested keys that read the same): the first is listed, "
                "the others are in 'duplicates'. Which one a loader keeps depends on how it "
                "flattens the keys: fix the file."
            )
        return notes


def _kind(item: Any) -> str:
    if isinstance(item, Opaque):
        return item.kind.rpartition(".")[2]
    if isinstance(item, Global):  # a global kept as a value (a dtype, a storage type)
        return item.name
    return type(item).__name__


def _key(k: object) -> str:
    try:
        return str(k)
    except ValueError:  # e.g. an int past sys.get_int_max_str_digits()
        return f"<{type(k).__name__}>"


def _text_size(key: Any) -> int:
    """At most how many characters ``str(key)`` has, found without building it (a key is a
    scalar, or a tuple of them at most 8 deep and 1,024 values: ``pickle_keys.hashable``)."""
    if isinstance(key, tuple):
        return 2 + sum(2 + _text_size(k) for k in key)
    if isinstance(key, str):  # inside a tuple: its repr, at most \\U0010ffff for a character
        return 2 + 10 * len(key)
    if isinstance(key, bytes):
        return 3 + 4 * len(key)
    if isinstance(key, int):
        return 2 + key.bit_length() // 3  # at least 3 bits a digit
    if isinstance(key, float | complex) or key is None:
        return 64  # '(-1.2345678901234567e-308-1.2345678901234567e-308j)'
    return 2048  # a stand-in (a device, a dtype, a tensor as a key): its repr


def _text_steps(key: Any) -> int:
    """The steps ``str(key)`` takes: writing an int's digits takes time quadratic in its size
    (17 us for the largest a pickle's LONG1 holds, 2,040 bits: 50 steps), the rest linear."""
    if isinstance(key, tuple):
        return 1 + sum(_text_steps(k) for k in key)
    if isinstance(key, int):
        return 1 + (key.bit_length() // 256) ** 2
    return 1 + _text_size(key) // 256


def _order(value: Any) -> tuple[Any, ...]:
    """The key that orders a set's members (see the module's text)."""
    if isinstance(value, StoredTensor):
        return (0, value.dtype, value.shape)
    if isinstance(value, tuple):
        return (1, tuple(_order(v) for v in value))
    if isinstance(value, Opaque | Global):
        return (3, value.kind if isinstance(value, Opaque) else value.name)
    if isinstance(value, complex):
        return (2, "complex", (value.real, value.imag))
    return (2, type(value).__name__, 0 if value is None else value)
