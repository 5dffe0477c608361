/**
 * Numbers for humans. Conventions, stated once:
 * - bytes are 1024-based: KiB, MiB, GiB, TiB, PiB (1 MiB = 1,048,576 bytes);
 * - counts are 1000-based with short-scale letters: K (thousand), M (million), B (billion),
 *   T (trillion): 70.6 B parameters = 70,600,000,000;
 * - FLOPs are 1000-based: KFLOPs, MFLOPs, GFLOPs, TFLOPs, PFLOPs, EFLOPs;
 * - three significant figures: >= 100 no decimals, >= 10 one, else two, decided on the rounded
 *   value (9.996 -> "10.0"); ties rounded away from zero on the exact value (`toFixed`: 2.625 GiB
 *   is "2.63 GiB"); a value that rounds up to the base is written in the next unit;
 * - what is not finite is "–".
 * meta_widget/units.py follows the same rule: tests/format_cases.json holds both to it.
 */

/** What a missing or non-finite number is written as (`meta_widget.units.NONE`). */
export const NONE = "–";

/** `x` (>= 0) with `d` decimals; every digit past 1e21, where `toFixed` writes an exponent. */
function fixed(x: number, d: number): string {
  if (x < 1e21) return x.toFixed(d);
  return BigInt(x).toString() + (d > 0 ? `.${"0".repeat(d)}` : ""); // integral up there
}

function sig3(x: number): string {
  let text = fixed(x, 2);
  if (Number(text) >= 10) text = fixed(x, 1);
  if (Number(text) >= 100) text = fixed(x, 0);
  return text;
}

function scaled(value: number, base: number, units: readonly string[], sep: string): string {
  if (!Number.isFinite(value)) return NONE;
  let v = Math.abs(value);
  let u = 0;
  while (v >= base && u < units.length - 1) {
    v /= base;
    u += 1;
  }
  let text = u === 0 ? fixed(v, 0) : sig3(v);
  // 999.96 K rounds to "1000 K": move to the next unit instead
  if (Number(text) >= base && u < units.length - 1) {
    v /= base;
    u += 1;
    text = sig3(v);
  }
  const sign = value < 0 && Number(text) !== 0 ? "-" : "";
  return `${sign}${text}${sep}${units[u]}`.trimEnd();
}

const BYTE_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"] as const;
const COUNT_UNITS = ["", "K", "M", "B", "T"] as const;
const FLOP_UNITS = ["FLOPs", "KFLOPs", "MFLOPs", "GFLOPs", "TFLOPs", "PFLOPs", "EFLOPs"] as const;

/** 1024-based: `formatBytes(1536)` is "1.50 KiB". */
export function formatBytes(bytes: number): string {
  return scaled(bytes, 1024, BYTE_UNITS, " ");
}

/** 1000-based, short scale: `formatCount(70_600_000_000)` is "70.6 B". */
export function formatCount(n: number): string {
  return scaled(n, 1000, COUNT_UNITS, " ");
}

/** 1000-based: `formatFlops(2.5e12)` is "2.50 TFLOPs". */
export function formatFlops(flops: number): string {
  return scaled(flops, 1000, FLOP_UNITS, " ");
}

/** `[1, 4096, 8192]`; a scalar is `[]`. */
export function formatShape(shape: readonly number[]): string {
  return `[${shape.join(", ")}]`;
}

/** Several shapes: `[1, 16], [1, 16]`; none: "". */
export function formatShapes(shapes: readonly (readonly number[])[]): string {
  return shapes.map(formatShape).join(", ");
}

/** From microseconds: "850 µs", "12.3 ms", "4.20 s", "2 min 05 s". */
export function formatDuration(us: number): string {
  if (!Number.isFinite(us)) return NONE;
  if (us < 1000) return `${Math.round(us)} µs`;
  if (us < 1e6) return `${sig3(us / 1000)} ms`;
  const s = us / 1e6;
  if (s < 60) return `${sig3(s)} s`;
  const min = Math.floor(s / 60);
  const rest = Math.round(s - min * 60);
  return `${min} min ${String(rest).padStart(2, "0")} s`;
}

/** One formatter for the module: `toLocaleString` builds a new one per call (slow per cell). */
const EXACT = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });

/** Thousands separators for exact values in tooltips: 1234567 -> "1,234,567". */
export function formatExact(n: number): string {
  return EXACT.format(Math.round(n));
}
