"""The pickle inside a ``torch.save`` file, read by a small machine of our own, under a budget.

``torch.load`` is never called on the file: the opcodes ``torch.load(weights_only=True)`` reads
are run here, but every global is a stand-in. A tensor becomes a :class:`StoredTensor` (its
shape and dtype, no storage), a storage a :class:`Storage` (its dtype); containers, numbers and
text are built as they are, and any other global ``torch.load(weights_only=True)`` would allow
is an :class:`Opaque` value that is never called. A global it would not allow is refused with
:class:`UnsafeCheckpointError` the moment the pickle names it: nothing is imported or run.

Every step is charged to a :class:`~.pickle_budget.Budget` *as it goes*: steps (one per opcode,
and one per unit of work where an opcode's work is not a constant: hashing a key, building a set)
and the bytes built (an upper bound of CPython's sizes, charged before they are built; a
string's length is checked before it is read). Nothing is timed: a file is read or refused the
same way on every machine. A 9 KB zip whose pickle builds 8 million empty dicts is refused after
about a million steps and 70 MiB, not after 84 s and 2.3 GB.
"""

from __future__ import annotations

import _compat_pickle
import functools
import pickle
import struct
import sys
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

from .entries import CheckpointError, UnsafeCheckpointError
from .pickle_budget import Budget
from .pickle_globals import (
    Global,
    Opaque,
    Storage,
    StoredTensor,
    allowed_names,
    known_globals,
    opaque,
    storage_dtypes,
)
from .pickle_keys import CONTAINERS, build_container, hashable

#: ``torch.save``'s legacy (pre-1.6) format starts with these two pickled numbers
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001

_MAX_GLOBAL_NAME = 1024  # bytes of a GLOBAL's "module\nname\n"
_INT = sys.getsizeof(2**40)  # an int object (big ones are charged by their size)
_DICT = sys.getsizeof({}) + 16  # + the garbage collector's header
_LIST = sys.getsizeof([]) + 16
_TUPLE = sys.getsizeof(()) + 16
_ITEM = 64  # one more dict entry (amortized, with resizing)
_SLOT = 8  # one more pointer: a list or stack slot
_MEMO = 104  # a memo entry: dict slot and int key
_STUB = 96  # a stand-in object
_STRUCTS = {f: struct.Struct(f) for f in ("<B", "<H", "<i", "<I", ">d")}


# -- the machine --------------------------------------------------------------------------------

_HANDLERS: dict[int, str] = {}
_COST = [0] * 256  # bytes charged before each opcode runs (what it builds, at most)


def _op(*codes: bytes, cost: int = 0) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a handler of ``codes``; ``cost``: the bytes each of them builds (more is
    charged by the handler where the size depends on the data)."""

    def register(method: Callable[..., Any]) -> Callable[..., Any]:
        for code in codes:
            _HANDLERS[code[0]] = method.__name__
            _COST[code[0]] = cost
        return method

    return register


#: opcodes read here that ``torch.load(weights_only=True)`` refuses ("Unsupported operand"):
#: read so that an unsafe global behind them is still named, then refused for what they are
_NOT_WEIGHTS_ONLY = {
    pickle.FRAME[0]: "FRAME (pickle protocol 4 or later)",
    pickle.SHORT_BINUNICODE[0]: "SHORT_BINUNICODE (pickle protocol 4 or later)",
    pickle.MEMOIZE[0]: "MEMOIZE (pickle protocol 4 or later)",
    pickle.STACK_GLOBAL[0]: "STACK_GLOBAL (pickle protocol 4 or later)",
    pickle.SHORT_BINBYTES[0]: "SHORT_BINBYTES (pickle protocol 3 or later)",
    pickle.BINBYTES[0]: "BINBYTES (pickle protocol 3 or later)",
    pickle.BINSTRING[0]: "BINSTRING (a Python 2 string)",
    pickle.LONG4[0]: "LONG4 (an integer of more than 255 bytes, over 600 digits)",
    pickle.POP[0]: "POP",
    pickle.DUP[0]: "DUP",
}


class PickleMachine:
    """Runs one pickle from ``data[start:]`` under ``budget``; :meth:`load` returns its value.

    ``data`` is bytes or a memory map; ``more`` says the file goes on past it (a pickle that
    runs past ``data`` is then too long, not truncated).

    ``not_weights_only`` names the first opcode read that ``torch.load(weights_only=True)``
    would refuse (``None`` when there is none): the caller refuses the file for it.
    """

    def __init__(self, data: Any, start: int, budget: Budget, *, more: bool = False) -> None:
        self.data = data
        self.pos = start
        self.budget = budget
        self.more = more
        self.stack: list[Any] = []
        self.marks: list[list[Any]] = []
        self.memo: dict[int, Any] = {}
        self.not_weights_only: str | None = None
        self.allowed = allowed_names()  # read once: torch's list, and the user's added to it
        self.table = [getattr(self, _HANDLERS[i]) if i in _HANDLERS else None for i in range(256)]

    # -- reading --------------------------------------------------------------------------------

    def load(self) -> Any:
        data, table, budget, end = self.data, self.table, self.budget, len(self.data)
        while True:
            if self.pos >= end:
                raise self._past_end()
            code = data[self.pos]
            self.pos += 1
            budget.bytes += _COST[code]  # inline charge(_COST[code], 1): most steps come here
            budget.steps += 1
            if budget.bytes > budget.max_bytes or budget.steps > budget.max_steps:
                budget.bytes -= _COST[code]
                budget.steps -= 1
                budget.charge(_COST[code], 1)  # refuses, counting what was spent before it
            handler = table[code]
            if handler is None:
                raise self._damaged(
                    f"it holds the pickle opcode {code:#04x}"
                    f"{' (' + _opname(code) + ')' if _opname(code) else ''}, which torch.save "
                    "never writes and torch.load(weights_only=True) cannot read"
                )
            if code in _NOT_WEIGHTS_ONLY and self.not_weights_only is None:
                self.not_weights_only = _NOT_WEIGHTS_ONLY[code]
            if handler():
                return self.stack.pop() if self.stack else self._underflow()

    def read(self, n: int) -> Any:
        if n > len(self.data) - self.pos:
            raise self._past_end()
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def size(self, fmt: str) -> Any:
        """The number at the current position, as ``struct`` format ``fmt`` reads it."""
        reader = _STRUCTS[fmt]
        if reader.size > len(self.data) - self.pos:
            raise self._past_end()
        value = reader.unpack_from(self.data, self.pos)[0]
        self.pos += reader.size
        return value

    def push(self, value: Any, nbytes: int) -> None:
        self.budget.charge(nbytes + _SLOT, 0)
        self.stack.append(value)

    def pop(self) -> Any:
        return self.stack.pop() if self.stack else self._underflow()

    def top(self) -> Any:
        return self.stack[-1] if self.stack else self._underflow()

    def _past_end(self) -> CheckpointError:
        if self.more:
            return self.budget.refuse(f"runs past its first {len(self.data) // 2**20} MiB")
        return self._damaged("it ends in the middle of a pickle (the file is truncated)")

    def _underflow(self) -> Any:
        raise self._damaged("its pickle takes a value from an empty stack")

    def _damaged(self, what: str) -> CheckpointError:
        return CheckpointError(
            f"{self.budget.shown!r} cannot be read as a torch.save file: {what}. The file is "
            "truncated or damaged: download or save it again."
        )

    # -- opcodes: the first and the last ---------------------------------------------------

    @_op(pickle.PROTO)
    def _proto(self) -> None:
        self.read(1)

    @_op(pickle.FRAME)
    def _frame(self) -> None:
        self.read(8)

    @_op(pickle.STOP)
    def _stop(self) -> bool:
        return True

    # -- values -----------------------------------------------------------------------------

    @_op(pickle.NONE, cost=_SLOT)
    def _none(self) -> None:
        self.stack.append(None)

    @_op(pickle.NEWTRUE, pickle.NEWFALSE, cost=_SLOT)
    def _bool(self) -> None:
        self.stack.append(self.data[self.pos - 1] == pickle.NEWTRUE[0])

    @_op(pickle.BININT, cost=_INT + _SLOT)
    def _binint(self) -> None:
        self.stack.append(self.size("<i"))

    @_op(pickle.BININT1, cost=_INT + _SLOT)
    def _binint1(self) -> None:
        self.stack.append(self.size("<B"))

    @_op(pickle.BININT2, cost=_INT + _SLOT)
    def _binint2(self) -> None:
        self.stack.append(self.size("<H"))

    @_op(pickle.LONG1, pickle.LONG4)
    def _long(self) -> None:
        n = self.size("<B" if self.data[self.pos - 1] == pickle.LONG1[0] else "<i")
        if n < 0:
            raise self._damaged("it holds an integer of negative length")
        self.budget.charge(n + _INT, 0)  # before it is read
        self.push(int.from_bytes(self.read(n), "little", signed=True), 0)

    @_op(pickle.BINFLOAT, cost=24 + _SLOT)
    def _binfloat(self) -> None:
        self.stack.append(self.size(">d"))

    @_op(pickle.BINUNICODE, pickle.SHORT_BINUNICODE)
    def _unicode(self) -> None:
        n = self.size("<I" if self.data[self.pos - 1] == pickle.BINUNICODE[0] else "<B")
        self.budget.charge(4 * n + 80, 0)  # before it is read: at most 4 bytes a character
        try:
            text = str(self.read(n), "utf-8", "surrogatepass")
        except UnicodeDecodeError:
            raise self._damaged("it holds text that is not UTF-8") from None
        self.push(text, 0)

    @_op(pickle.SHORT_BINSTRING, pickle.SHORT_BINBYTES, pickle.BINBYTES, pickle.BINSTRING)
    def _bytes(self) -> None:
        short = self.data[self.pos - 1] in (pickle.SHORT_BINSTRING[0], pickle.SHORT_BINBYTES[0])
        n = self.size("<B" if short else "<I")
        self.budget.charge(n + 40, 0)
        self.push(bytes(self.read(n)), 0)

    # -- containers -------------------------------------------------------------------------

    @_op(pickle.EMPTY_DICT, cost=_DICT + _SLOT)
    def _empty_dict(self) -> None:
        self.stack.append({})

    @_op(pickle.EMPTY_LIST, cost=_LIST + _SLOT)
    def _empty_list(self) -> None:
        self.stack.append([])

    @_op(pickle.EMPTY_TUPLE, cost=_SLOT)
    def _empty_tuple(self) -> None:
        self.stack.append(())

    @_op(pickle.EMPTY_SET, cost=232 + _SLOT)
    def _empty_set(self) -> None:
        self.stack.append(set())

    @_op(pickle.MARK, cost=_LIST + _SLOT)
    def _mark(self) -> None:
        self.marks.append(self.stack)
        self.stack = []

    def pop_mark(self) -> list[Any]:
        if not self.marks:
            raise self._damaged("its pickle closes a MARK it never opened")
        items = self.stack
        self.stack = self.marks.pop()
        return items

    @_op(pickle.TUPLE)
    def _tuple(self) -> None:
        items = self.pop_mark()
        self.budget.charge(_TUPLE + _SLOT * (len(items) + 1), 0)  # the tuple, its stack slot
        self.stack.append(tuple(items))

    @_op(pickle.TUPLE1, pickle.TUPLE2, pickle.TUPLE3)
    def _tuple_n(self) -> None:
        n = self.data[self.pos - 1] - pickle.TUPLE1[0] + 1
        if len(self.stack) < n:
            self._underflow()
        items = tuple(self.stack[-n:])
        del self.stack[-n:]
        self.push(items, _TUPLE + _SLOT * n)

    @_op(pickle.APPEND, cost=_SLOT)
    def _append(self) -> None:
        item = self.pop()
        self._list_target("APPEND").append(item)

    @_op(pickle.APPENDS)
    def _appends(self) -> None:
        items = self.pop_mark()
        target = self._list_target("APPENDS")
        self.budget.charge(_SLOT * len(items), 0)
        target.extend(items)

    def _list_target(self, opcode: str) -> list[Any]:
        target = self.top()
        if type(target) is not list:
            raise self._damaged(f"its pickle does {opcode} to a {type(target).__name__}")
        return target

    @_op(pickle.SETITEM, cost=_ITEM)
    def _setitem(self) -> None:
        value, key = self.pop(), self.pop()
        self._dict_target("SETITEM")[hashable(key, self.budget, self._damaged)] = value

    @_op(pickle.SETITEMS)
    def _setitems(self) -> None:
        items = self.pop_mark()
        if len(items) % 2:
            raise self._damaged("its pickle does SETITEMS with a key and no value")
        target = self._dict_target("SETITEMS")
        self.budget.charge(_ITEM * (len(items) // 2), 0)
        for i in range(0, len(items), 2):
            target[hashable(items[i], self.budget, self._damaged)] = items[i + 1]

    def _dict_target(self, opcode: str) -> dict[Any, Any]:
        target = self.top()
        if type(target) not in (dict, OrderedDict, Counter):
            raise self._damaged(f"its pickle does {opcode} to a {type(target).__name__}")
        return target  # type: ignore[no-any-return]

    @_op(pickle.BINPUT, pickle.LONG_BINPUT, pickle.MEMOIZE)
    def _put(self) -> None:
        code = self.data[self.pos - 1]
        if code == pickle.MEMOIZE[0]:
            index = len(self.memo)
        else:
            index = self.size("<B" if code == pickle.BINPUT[0] else "<I")
        if index not in self.memo:
            self.budget.charge(_MEMO, 0)
        self.memo[index] = self.top()

    @_op(pickle.BINGET, pickle.LONG_BINGET, cost=_SLOT)
    def _get(self) -> None:
        index = self.size("<B" if self.data[self.pos - 1] == pickle.BINGET[0] else "<I")
        if index not in self.memo:
            raise self._damaged(f"its pickle refers to memo entry {index}, which it never set")
        self.stack.append(self.memo[index])

    @_op(pickle.POP)
    def _pop_op(self) -> None:
        self.pop()

    @_op(pickle.DUP, cost=_SLOT)
    def _dup(self) -> None:
        self.stack.append(self.top())

    # -- globals and calls ------------------------------------------------------------------

    @_op(pickle.GLOBAL)
    def _global(self) -> None:
        end = self.data.find(b"\n", self.pos, self.pos + _MAX_GLOBAL_NAME)
        end = self.data.find(b"\n", end + 1, self.pos + _MAX_GLOBAL_NAME) if end >= 0 else -1
        if end < 0:
            raise self._damaged("it names a global that is not two lines of text")
        module, _, name = bytes(self.read(end + 1 - self.pos))[:-1].partition(b"\n")
        self.push(self._resolve(_utf8(module), _utf8(name)), _STUB)

    @_op(pickle.STACK_GLOBAL)
    def _stack_global(self) -> None:
        name, module = self.pop(), self.pop()
        if not isinstance(module, str) or not isinstance(name, str):
            raise self._damaged("its pickle names a global that is not text")
        self.push(self._resolve(module, name), _STUB)

    def _resolve(self, module: str, name: str) -> Any:
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        full = f"{module}.{name}"
        known = known_globals().get(full)
        if known is not None:
            return known
        if full in self.allowed:
            return Global(full, functools.partial(opaque, full))
        raise UnsafeCheckpointError(unsafe_message(self.budget.shown, f"the global {full}"))

    @_op(pickle.REDUCE)
    def _reduce(self) -> None:
        args = self.pop()
        func = self.top()
        self.stack[-1] = self._call(func, args)

    @_op(pickle.NEWOBJ)
    def _newobj(self) -> None:
        args = self.pop()
        cls = self.pop()
        self.push(self._call(cls, args), 0)

    def _call(self, func: Any, args: Any) -> Any:
        if not isinstance(func, Global):
            raise self._damaged(f"its pickle calls a {type(func).__name__}")
        if not isinstance(args, tuple):
            raise self._damaged(f"its pickle calls {func.name} with a {type(args).__name__}")
        try:
            if func.name in CONTAINERS:
                return build_container(func.name, args, self.budget, self._damaged)
            # before: a copy of its text or bytes argument (_codecs.encode, bytearray) at most
            copied = sum(len(a) for a in args[:2] if isinstance(a, str | bytes))
            self.budget.charge(_STUB + copied, 0)
            value = func.call(args)
        except (TypeError, ValueError, IndexError, KeyError, OverflowError, RecursionError) as exc:
            raise self._damaged(
                f"its call to {func.name} has arguments no tensor has ({exc})"
            ) from None
        if isinstance(value, StoredTensor):  # its shape: at most MAX_RANK numbers
            self.budget.charge(_TUPLE + _SLOT * len(value.shape), 0)
        return value

    @_op(pickle.BUILD)
    def _build(self) -> None:
        self.pop()  # the state: a tensor's hooks, an OrderedDict's _metadata; not needed here
        target = self.top()
        if not isinstance(target, StoredTensor | Opaque | OrderedDict):
            raise self._damaged(f"its pickle sets the state of a {type(target).__name__}")

    @_op(pickle.BINPERSID)
    def _persid(self) -> None:
        pid = self.pop()
        if not (isinstance(pid, tuple) and len(pid) >= 5 and _text(pid[0]) == "storage"):
            raise self._damaged(
                "it refers to an outside object that is not a tensor storage (torch.save writes "
                "('storage', type, key, location, size))"
            )
        kind = pid[1]
        if not isinstance(kind, Global) or kind.name not in storage_dtypes():
            raise self._damaged("it refers to a storage of no storage type torch knows")
        self.push(Storage(storage_dtypes()[kind.name]), _STUB)


def _opname(code: int) -> str:
    for name in ("LONG", "INT", "STRING", "UNICODE", "FLOAT", "GET", "PUT", "INST", "OBJ"):
        if bytes([code]) == getattr(pickle, name):
            return name
    return ""


def _utf8(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("ascii", "replace")
    return value if isinstance(value, str) else None


def unsafe_message(path: str, what: str) -> str:
    """The refusal of a pickle that would run code: ``what`` it would call (never its bytes)."""
    return (
        f"Refused to load {path!r}: its pickle would call {what} when loaded, which can run "
        "arbitrary code; nothing was executed (it was read as torch.load(weights_only=True) "
        "would read it, and stopped there). What to do: if you made this file, re-save only the "
        "tensors with torch.save(model.state_dict(), path) or safetensors.torch.save_file(...); "
        "load it with torch.load(path, weights_only=False) ONLY if you trust where it came from."
    )
