/**
 * Numbers for humans. Conventions, stated once:
 * - bytes are 1024-based: KiB, MiB, GiB, TiB (1 MiB = 1,048,576 bytes);
 * - counts are 1000-based with short-scale letters: K (thousand), M (million), B (billion),
 *   T (trillion): 70.6 B parameters = 70,600,000,000;
 * - FLOPs are 1000-based: KFLOPs, MFLOPs, GFLOPs, TFLOPs, PFLOPs;
 * - three significant digits, no trailing ".0" noise beyond one decimal.
 */

function sig3(x: number): string {
  if (x >= 100) return x.toFixed(0);
  if (x >= 10) return x.toFixed(1);
  return x.toFixed(2);
}

function scaled(value: number, base: number, units: readonly string[], sep: string): string {
  if (!Number.isFinite(value)) return "–";
  const neg = value < 0;
  let v = Math.abs(value);
  let u = 0;
  while (v >= base && u < units.length - 1) {
    v /= base;
    u += 1;
  }
  // 999.96 K rounds to "1000 K": move to the next unit instead
  if (u < units.length - 1 && Number(sig3(v)) >= base) {
    v /= base;
    u += 1;
  }
  const text = u === 0 ? String(Math.round(v)) : sig3(v);
  return `${neg ? "-" : ""}${text}${sep}${units[u]}`.trimEnd();
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
  if (Math.abs(n) < 1000) return Number.isFinite(n) ? String(Math.round(n)) : "–";
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
  if (!Number.isFinite(us)) return "–";
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
