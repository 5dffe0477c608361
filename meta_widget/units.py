"""Numbers for humans: bytes, counts, FLOPs, shapes. Views format with these; they never count."""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import ROUND_HALF_UP, Context, Decimal

#: bytes per element of the dtypes offered as what-ifs; int4 packs two weights in a byte
DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "int8": 1.0, "int4": 0.5}


def is_floating(dtype: str) -> bool:
    """True for floating-point dtype names (``float32``, ``bfloat16``, ``float8_e4m3fn``...)."""
    return dtype.startswith(("float", "bfloat", "complex"))


#: the one symbol for "none" (missing, not finite; in tables also zero), as the widget writes it
NONE = "–"
_BYTES = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_COUNTS = ("", "K", "M", "B", "T")
_FLOPS = ("FLOPs", "KFLOPs", "MFLOPs", "GFLOPs", "TFLOPs", "PFLOPs", "EFLOPs")
#: enough digits for any float written without an exponent
_EXACT = Context(prec=400)


def _fixed(value: float, decimals: int) -> str:
    """``value`` (>= 0) with ``decimals`` decimals, ties away from zero on its exact binary value:
    what JavaScript's ``toFixed`` writes (``f"{2.625:.2f}"`` rounds half to even: 2.62)."""
    step = Decimal(1).scaleb(-decimals)
    return f"{Decimal(value).quantize(step, ROUND_HALF_UP, _EXACT):f}"


def _three_figures(value: float) -> str:
    """Three significant figures, the decimals chosen on the rounded value (9.996 -> ``10.0``)."""
    text = _fixed(value, 2)
    if float(text) >= 10:
        text = _fixed(value, 1)
    if float(text) >= 100:
        text = _fixed(value, 0)
    return text


def _scaled(n: float, base: int, units: Sequence[str]) -> str:
    """The rule ``js/format.ts`` follows too, checked on both sides by ``tests/format_cases.json``.

    The largest unit the number reaches; in the first unit an integer, else three figures; a
    number that rounds up to ``base`` is written in the next unit (1023.995 KiB: ``1.00 MiB``).
    """
    value = float(n)
    if not math.isfinite(value):
        return NONE
    size, unit = abs(value), 0
    while size >= base and unit < len(units) - 1:
        size, unit = size / base, unit + 1
    text = _fixed(size, 0) if unit == 0 else _three_figures(size)
    if float(text) >= base and unit < len(units) - 1:
        size, unit = size / base, unit + 1
        text = _three_figures(size)
    sign = "-" if value < 0 and float(text) else ""
    return f"{sign}{text} {units[unit]}".rstrip()


def format_bytes(n: float) -> str:
    """Bytes in binary units (1 KiB = 1024 B): ``2.63 GiB``, ``512 B``; ``–`` if not finite."""
    return _scaled(n, 1024, _BYTES)


def format_count(n: float) -> str:
    """A count in decimal units (K, M, B for billions, T): ``70.6 B`` for 70,553,706,496."""
    return _scaled(n, 1000, _COUNTS)


def format_flops(n: float) -> str:
    """FLOPs in decimal units: ``605 TFLOPs``, ``512 FLOPs``."""
    return _scaled(n, 1000, _FLOPS)


def format_seconds(s: float) -> str:
    """Seconds in the unit that reads best, three figures: ``15.1 s``, ``918 ms``, ``927 µs``,
    ``4.2 ns``; never an exponent (``1.51e+04 ms``)."""
    value = float(s)
    if not math.isfinite(value):
        return NONE
    size = abs(value)
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if size >= scale * 0.9995:
            return f"{'-' if value < 0 else ''}{_three_figures(size / scale)} {unit}"
    return f"{'-' if value < 0 else ''}{_three_figures(size / 1e-9)} ns" if size else "0 s"


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
