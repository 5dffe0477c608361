/**
 * The memory timeline stacked by category (pure, unit tested; drawn by charts.ts).
 *
 * Bands from the bottom: "parameters, buffers, inputs" (constant; left out on request), then
 * the KV cache (mode="generate"), gradients, optimizer state, activations, temporaries, then any category the kernel adds (a
 * parallel trace's unsharded parameters, communication buffers). Each band's top is the running
 * sum of the categories up to it, so the last band's top is the live-bytes line.
 */
import { MEMORY_CATEGORIES } from "./protocol";

/**
 * The colors (`--mw-cat-N`) of the categories a parallel trace adds, each its own: they are
 * not any of the seven (an unsharded parameter is not the rank's shard).
 */
const EXTRA_COLORS: Record<string, number> = {
  "unsharded parameters": 7,
  "communication buffers": 8,
  // mode="generate" (meta_widget.trace.generate.KV_CACHE): the cache, growing step by step
  "KV cache": 10,
  "KV cache (sliding window)": 11,
};

/** The color index of category `name`: its place in MEMORY_CATEGORIES, else its own (7, 8, 9). */
export function categoryColor(name: string): number {
  const known = (MEMORY_CATEGORIES as readonly string[]).indexOf(name);
  return known >= 0 ? known : (EXTRA_COLORS[name] ?? 9);
}

/** The constant categories, drawn as one band at the bottom. */
export const STATIC_CATEGORIES = ["parameters", "buffers", "inputs"] as const;
export const STATIC_BAND = "parameters, buffers, inputs";

export interface StackBand {
  /** Category name, or `STATIC_BAND`. */
  name: string;
  /** Index into MEMORY_CATEGORIES of its color (`--mw-cat-N`). */
  color: number;
  /** Bytes of this band at each point. */
  values: number[];
  /** Top of this band at each point: the sum of this band and all below it. */
  top: number[];
}

/** How the other precision changes the series (see precision.ts): constant bytes, scale of the rest. */
export interface StackScale {
  staticBytes: Record<string, number>;
  actScale: number;
}

/**
 * The bands of `categories` (category -> bytes at each of `n` points), bottom first; bands that
 * are zero everywhere are left out. `leaveOutStatic`: no constant band (the y axis then counts
 * the bytes above it). `scale`: the series at another precision.
 */
export function stackTimeline(
  categories: Record<string, number[]>,
  n: number,
  leaveOutStatic: boolean,
  scale?: StackScale,
): StackBand[] {
  const known = MEMORY_CATEGORIES as readonly string[];
  const isStatic = (c: string): boolean => (STATIC_CATEGORIES as readonly string[]).includes(c);
  const at = (c: string, i: number): number => {
    const v = categories[c]?.[i] ?? 0;
    if (!scale) return v;
    return isStatic(c) ? (scale.staticBytes[c] ?? 0) : v * scale.actScale;
  };
  const order: { name: string; color: number; parts: string[] }[] = [];
  if (!leaveOutStatic) order.push({ name: STATIC_BAND, color: 0, parts: [...STATIC_CATEGORIES] });
  // the KV cache lies on the weights: it lives from its step to the end, and grows each step
  const extra = Object.keys(categories).filter((c) => !known.includes(c));
  const cache = extra.filter((c) => c.startsWith("KV cache"));
  for (const c of cache) order.push({ name: c, color: categoryColor(c), parts: [c] });
  for (const c of known) if (!isStatic(c)) order.push({ name: c, color: known.indexOf(c), parts: [c] });
  for (const c of extra) if (!cache.includes(c)) order.push({ name: c, color: categoryColor(c), parts: [c] });
  const bands: StackBand[] = [];
  let below = new Array<number>(n).fill(0);
  for (const b of order) {
    const values = Array.from({ length: n }, (_, i) => Math.round(b.parts.reduce((s, c) => s + at(c, i), 0)));
    if (!values.some((v) => v !== 0)) continue;
    const top = values.map((v, i) => v + (below[i] ?? 0));
    bands.push({ name: b.name, color: b.color, values, top });
    below = top;
  }
  return bands;
}
