"""safetensors headers, read and checked by the safetensors library's own rules (no tensor data
is read, and the ``safetensors`` package is not needed).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from .entries import DAMAGED, CheckpointError, TensorEntry, natural_key, quoted
from .hostile_json import is_text, json_kind, no_constant, object_pairs

#: safetensors dtype codes (every code the safetensors library knows) -> dtype names as torch
#: spells them (the sub-byte ``F4``/``F6`` codes have no torch dtype of one element each)
SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
    "F6_E2M3": "float6_e2m3fn",
    "F6_E3M2": "float6_e3m2fn",
    "F4": "float4_e2m1fn",
    "C64": "complex64",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
}


#: bits per element of each safetensors dtype (the library's ``Dtype::bitsize``)
_SAFETENSORS_BITS = {
    **dict.fromkeys(["F64", "C64", "I64", "U64"], 64),
    **dict.fromkeys(["F32", "I32", "U32"], 32),
    **dict.fromkeys(["F16", "BF16", "I16", "U16"], 16),
    **dict.fromkeys(["F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0"], 8),
    **dict.fromkeys(["I8", "U8", "BOOL"], 8),
    **dict.fromkeys(["F6_E2M3", "F6_E3M2"], 6),
    "F4": 4,
}


#: limits, each named in the refusal that enforces it
_MAX_HEADER = 100_000_000  # the safetensors library's MAX_HEADER_SIZE


_MAX_JSON_DEPTH = 127  # serde_json (inside safetensors) refuses a 128th nested array/object


_U64 = 2**64 - 1  # safetensors sizes are Rust usize (u64)


_SHAPE_FIELDS = ("dtype", "shape", "data_offsets")


def read_safetensors_header(path: str) -> list[TensorEntry]:
    """The tensors described by a safetensors file's JSON header (no tensor data read).

    The header is checked by the safetensors library's own rules; see :func:`read_safetensors`.
    """
    return read_safetensors(path, path)[0]


def read_safetensors(path: str, shown: str) -> tuple[list[TensorEntry], dict[str, str]]:
    """Tensors and ``__metadata__`` of a safetensors file, refused where the library refuses.

    The rules of ``safetensors`` (``SafeTensors::read_metadata`` and ``Metadata::validate``):
    a header of 1..100,000,000 bytes of UTF-8 JSON holding an object; each entry an object with
    a known ``dtype``, a ``shape`` of non-negative integers and two non-negative integer
    ``data_offsets``; no element count or bit count past 2**64 - 1; sub-byte dtypes ending on a
    byte; each entry's byte length ``numel * dtype size``; the entries, sorted by offset, tile the
    data area from 0 to its end without gap, overlap or trailing bytes; ``__metadata__`` absent,
    null, or an object of strings.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little")
        if len(head) < 8 or n == 0 or n > _MAX_HEADER or 8 + n > size:
            raise CheckpointError(
                f"{shown!r}: the safetensors header length ({n} bytes) does not fit the file "
                f"({size} bytes) or the safetensors limit ({_MAX_HEADER} bytes): the file is "
                "truncated or not safetensors. Download it again."
            )
        raw = f.read(n)
    header = _header_json(raw, shown)
    metadata = _header_metadata(header.get("__metadata__"), shown)
    specs = [
        (name, _header_entry(name, spec, shown))
        for name, spec in header.items()
        if name != "__metadata__"
    ]
    _check_layout(specs, size - 8 - n, shown)
    entries = [
        TensorEntry(name, shape, SAFETENSORS_DTYPES[code], end - start, shown)
        for name, (code, shape, start, end) in specs
    ]
    entries.sort(key=lambda t: natural_key(t.name))
    return entries, metadata


def _header_json(raw: bytes, shown: str) -> dict[str, Any]:
    where = f"{shown!r}: the safetensors header"
    try:
        header = json.loads(
            raw.decode("utf-8"),
            object_pairs_hook=object_pairs,
            parse_constant=no_constant,
            parse_int=_json_int,
        )
    except RecursionError:
        raise CheckpointError(
            f"{where} nests arrays or objects too deeply to read (the safetensors library "
            f"stops at {_MAX_JSON_DEPTH}). {DAMAGED}"
        ) from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise CheckpointError(f"{where} is not valid UTF-8 JSON ({exc}). {DAMAGED}") from exc
    if not isinstance(header, dict):
        raise CheckpointError(
            f"{where} is a JSON {type(header).__name__}, not an object of tensor name -> "
            f"{{dtype, shape, data_offsets}}. {DAMAGED}"
        )
    return header


class _Negative(int):
    """A JSON integer written with a minus sign (``-0`` included): never a size or an offset.

    The safetensors library reads ``-0`` as a float, and so refuses it where Python's ``json``
    gives ``0``; this type keeps the difference (and shows the text as written).
    """

    text = ""

    def __repr__(self) -> str:
        return self.text


def _json_int(text: str) -> int:
    if not text.startswith("-"):
        return int(text)
    value = _Negative(text)
    value.text = text
    return value


def _header_metadata(meta: object, shown: str) -> dict[str, str]:
    if meta is None:
        return {}
    if isinstance(meta, dict) and all(
        isinstance(v, str) and is_text(k) and is_text(v) for k, v in meta.items()
    ):
        return dict(meta)
    raise CheckpointError(
        f"{shown!r}: the safetensors header's __metadata__ must be an object of strings "
        f"(text -> text), not {json_kind(meta)}. {DAMAGED}"
    )


def _header_entry(name: str, spec: object, shown: str) -> tuple[str, tuple[int, ...], int, int]:
    """``(dtype code, shape, begin, end)`` of one header entry, checked field by field."""

    def refuse(what: str) -> CheckpointError:
        return CheckpointError(
            f"{shown!r}: the safetensors header entry for tensor {quoted(name)} {what}. {DAMAGED}"
        )

    if not is_text(name):
        raise refuse("has a name that is not valid text")
    if not isinstance(spec, dict):
        raise refuse(f"is a {type(spec).__name__}, not an object {{dtype, shape, data_offsets}}")
    repeated = sorted(set(getattr(spec, "repeated", ())) & set(_SHAPE_FIELDS))
    if repeated:
        raise refuse(f"gives {repeated[0]!r} twice")
    missing = [k for k in _SHAPE_FIELDS if k not in spec]
    if missing:
        raise refuse(f"has no {missing[0]!r}")
    code = spec["dtype"]
    if not isinstance(code, str) or code not in SAFETENSORS_DTYPES:
        raise refuse(
            f"has dtype {quoted(code, 40)}, which the safetensors library does not know "
            f"(it knows {', '.join(SAFETENSORS_DTYPES)})"
        )
    shape, offsets = spec["shape"], spec["data_offsets"]
    if not isinstance(shape, list) or not all(_is_u64(d) for d in shape):
        raise refuse(f"has shape {quoted(shape, 80)}: a shape is a list of integers >= 0")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_u64, offsets)):
        raise refuse(
            f"has data_offsets {quoted(offsets, 80)}: they are two integers >= 0, [begin, end]"
        )
    extra = [v for k, v in spec.items() if k not in _SHAPE_FIELDS]
    if extra and max(map(_json_depth, extra)) > _MAX_JSON_DEPTH - 2:
        raise refuse(f"nests more than {_MAX_JSON_DEPTH} arrays or objects")
    begin, end = offsets
    _check_size(code, shape, begin, end, refuse)
    return code, tuple(shape), begin, end


def _check_size(
    code: str, shape: list[int], begin: int, end: int, refuse: Callable[[str], CheckpointError]
) -> None:
    """The entry's element and bit counts fit in u64, end on a byte, and fill its offsets."""
    if begin > end:
        raise refuse(f"begins after it ends (data_offsets [{begin}, {end}])")
    numel = 1
    for d in shape:  # in order, like the library's checked fold: [0, 2**63] is fine
        numel *= d
        if numel > _U64:
            raise refuse(f"has shape {quoted(shape, 80)}, whose element count overflows 2**64")
    bits = numel * _SAFETENSORS_BITS[code]
    if bits > _U64:
        raise refuse(f"has shape {quoted(shape, 80)}, whose size in bits overflows 2**64")
    if bits % 8:
        raise refuse(f"holds {numel} {code} elements, which do not end on a byte boundary")
    if end - begin != bits // 8:
        raise refuse(
            f"says {numel} {code} elements (shape {list(shape)}, {bits // 8} bytes) but its "
            f"data_offsets span {end - begin} bytes"
        )


def _is_u64(v: object) -> bool:
    return type(v) is int and 0 <= v <= _U64  # not bool, nor a negative zero


def _json_depth(value: object) -> int:
    """Nesting depth of parsed JSON (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            stack.extend(
                (v, depth + 1) for v in (item.values() if isinstance(item, dict) else item)
            )
    return deepest


def _check_layout(
    specs: list[tuple[str, tuple[str, tuple[int, ...], int, int]]], data_size: int, shown: str
) -> None:
    """The entries, by offset, must tile ``[0, data_size)`` exactly (no gap, overlap, tail)."""
    at, previous = 0, None
    for name, (_code, _shape, begin, end) in sorted(specs, key=lambda s: (s[1][2], s[1][3])):
        if begin != at:
            how = (
                f"overlaps {quoted(previous)} (which ends at byte {at})"
                if begin < at
                else f"leaves a gap of {begin - at} bytes after "
                + (quoted(previous) if previous is not None else "the header")
            )
            raise CheckpointError(
                f"{shown!r}: tensor {quoted(name)} starts at byte {begin} of the data and "
                f"{how}; the safetensors library refuses this (InvalidOffset). {DAMAGED}"
            )
        at, previous = end, name
    if at > data_size:
        raise CheckpointError(
            f"{shown!r}: its tensors end at byte {at} of the data, but the file holds only "
            f"{data_size} bytes of data: the file is truncated. Download it again."
        )
    if at < data_size:
        raise CheckpointError(
            f"{shown!r}: the file holds {data_size - at} bytes after its last tensor that no "
            f"tensor covers; the safetensors library refuses this (MetadataIncompleteBuffer). "
            f"{DAMAGED}"
        )


# -- torch.save ---------------------------------------------------------------------------------
