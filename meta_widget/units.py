"""Numbers for humans: bytes, counts, FLOPs, shapes. Views format with these; they never count."""

from __future__ import annotations

from collections.abc import Sequence

#: bytes per element of the dtypes offered as what-ifs; int4 packs two weights in a byte
DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "int8": 1.0, "int4": 0.5}


def is_floating(dtype: str) -> bool:
    """True for floating-point dtype names (``float32``, ``bfloat16``, ``float8_e4m3fn``...)."""
    return dtype.startswith(("float", "bfloat", "complex"))


def format_bytes(n: float) -> str:
    """Bytes in binary units: ``1.50 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _scaled(n: float, units: Sequence[str]) -> str:
    value = float(n)
    for unit in units:
        if abs(value) < 1000 or unit == units[-1]:
            return f"{value:.2f} {unit}".rstrip() if unit else f"{int(value)}"
        value /= 1000
    raise AssertionError("unreachable")


def format_count(n: float) -> str:
    """A count in decimal units: ``70.55 B`` for 70,553,706,496."""
    return _scaled(n, ("", "K", "M", "B", "T"))


def format_flops(n: float) -> str:
    """FLOPs in decimal units: ``295.67 TFLOPs``."""
    if n < 1000:
        return f"{int(n)} FLOPs"
    return _scaled(n, ("", "KFLOPs", "MFLOPs", "GFLOPs", "TFLOPs", "PFLOPs"))


def format_shape(shape: Sequence[int]) -> str:
    """``[1, 4096, 8192]``."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


def format_shapes(shapes: Sequence[Sequence[int]]) -> str:
    """Every shape, runs of equal shapes written once with a count: ``[1, 16]; 4 × [1, 2, 16]``."""
    parts: list[str] = []
    i = 0
    while i < len(shapes):
        j = i
        while j + 1 < len(shapes) and tuple(shapes[j + 1]) == tuple(shapes[i]):
            j += 1
        run = j - i + 1
        text = format_shape(shapes[i])
        parts.append(f"{run} × {text}" if run > 1 else text)
        i = j + 1
    return "; ".join(parts)


#: byte units a budget may be written in: decimal (GB = 10**9) and binary (GiB = 2**30)
BYTE_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def parse_bytes(text: str) -> int:
    """``"80GiB"`` -> 85899345920, ``"80 GB"`` -> 80000000000, ``"512MiB"``, ``"1.5TiB"``.

    Units are case-insensitive and required (a bare number is ambiguous); ``G`` alone is refused
    because it could mean either. Raises ``ValueError`` for anything else.
    """
    value, unit = text.strip(), ""
    while value and (value[-1].isalpha()):
        unit = value[-1] + unit
        value = value[:-1]
    value = value.strip()
    factor = BYTE_UNITS.get(unit.upper())
    if factor is None or not value:
        raise ValueError(text)
    number = float(value)
    if not number == number or number in (float("inf"), float("-inf")):
        raise ValueError(text)
    return int(number * factor)
