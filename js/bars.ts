/**
 * The data of the memory-by-module chart (pure, unit tested): one bar per module at a depth,
 * the same module of repeated layers folded into one bar (`model.layers.0–79 · 80 ×
 * LlamaDecoderLayer`, summed), each bar stacked from what the module's subtree owns (Python's
 * `meta_widget.memory.modules`: tied weights at their first owner, so the bars add up to the
 * totals) and what its calls' outputs hold. Python's `a.figure("memory")` draws the same bars
 * (`meta_widget.views.memory_bars`).
 */
import { formatBytes as fmt } from "./format";
import type { Analysis, ModuleInfo } from "./protocol";
import type { Aggregate } from "./tree";

/** The stacked parts of a bar, bottom first, each in its memory category's color. */
export const BAR_PARTS = [
  { key: "params", label: "parameters", color: "--mw-cat-0" },
  { key: "gradients", label: "gradients", color: "--mw-cat-3" },
  { key: "optimizer", label: "optimizer state", color: "--mw-cat-4" },
  { key: "activations", label: "output mem", color: "--mw-cat-5" },
] as const;

export type BarPart = (typeof BAR_PARTS)[number]["key"];

export interface MemoryBars {
  /** The module each bar stands for (the first of a folded bar's: a click selects it). */
  modules: number[];
  labels: string[];
  types: string[];
  /** How many modules each bar sums (repeated layers folded into it). */
  counts: number[];
  /** Parameter bytes the subtree owns. */
  params: number[];
  /** Training: gradient bytes of those parameters. */
  gradients: number[];
  /** Training: optimizer-state bytes of those parameters. */
  optimizer: number[];
  /** Output mem: bytes of new storage the module's calls' outputs hold, summed. */
  activations: number[];
  /** Parameter bytes of the subtree another module owns (tied): counted there, not here. */
  tied: number[];
}

function emptyBars(): MemoryBars {
  return {
    modules: [],
    labels: [],
    types: [],
    counts: [],
    params: [],
    gradients: [],
    optimizer: [],
    activations: [],
    tied: [],
  };
}

/** The columns summed when bars fold. */
const SUMMED = ["counts", "params", "gradients", "optimizer", "activations", "tied"] as const;

/** A bar's stacked total. */
export function barTotal(bars: MemoryBars, i: number): number {
  return BAR_PARTS.reduce((s, p) => s + (bars[p.key][i] ?? 0), 0);
}

/** The parts with any bytes in `bars` (inference: parameters and output mem). */
export function shownParts(bars: MemoryBars): (typeof BAR_PARTS)[number][] {
  return BAR_PARTS.filter((p) => bars[p.key].some((v) => v > 0));
}

/**
 * One bar per module of `rows`, in that order. `paramBytes` gives a module's parameter bytes at
 * the chosen precision (it is handed the module with its tied part taken out); `stepScale`
 * multiplies gradients and optimizer state (the precision switch's factor for them).
 */
export function memoryBars(
  a: Analysis,
  rows: readonly number[],
  aggs: readonly Aggregate[],
  paramBytes: (m: ModuleInfo) => number,
  stepScale = 1,
): MemoryBars {
  const out = emptyBars();
  const own = a.memory.modules;
  for (const i of rows) {
    const m = a.modules[i];
    if (!m) continue;
    const tied = own.tied.get(i);
    const ranked = own.paramBytes.length === a.modules.length;
    const owned = ranked // one rank of several: what the subtree owns on it
      ? { ...m, paramBytes: own.paramBytes[i] ?? 0, floatParams: own.floatParams[i] ?? 0 }
      : tied
        ? { ...m, paramBytes: m.paramBytes - tied.bytes, floatParams: m.floatParams - tied.floatParams }
        : m;
    const pb = paramBytes(owned);
    out.modules.push(i);
    out.labels.push(m.path || a.title);
    out.types.push(m.type);
    out.counts.push(1);
    out.params.push(pb);
    out.tied.push(tied ? paramBytes({ ...m, paramBytes: tied.bytes, floatParams: tied.floatParams }) : 0);
    out.gradients.push(Math.round((own.gradientBytes[i] ?? 0) * stepScale));
    out.optimizer.push(Math.round((own.optimizerStateBytes[i] ?? 0) * stepScale));
    out.activations.push(aggs[i]?.activationBytes ?? 0);
  }
  return out;
}

/**
 * Bars of modules that are the same module of every member of a folded group (`layers.3.mlp`
 * for each of 80 layers) merged into one, summed, labelled by `key` (`layers.0–79.mlp`) with
 * the count and class (`layers.0–79.mlp · 80 × LlamaMLP`); the first module stands for the bar.
 */
export function foldBars(bars: MemoryBars, key: (module: number) => string): MemoryBars {
  const out = emptyBars();
  const at = new Map<string, number>();
  bars.modules.forEach((m, i) => {
    const k = key(m);
    const j = at.get(k);
    if (j === undefined) {
      at.set(k, out.modules.length);
      out.modules.push(m);
      out.labels.push(k);
      out.types.push(bars.types[i] ?? "");
      for (const c of SUMMED) out[c].push(bars[c][i] ?? 0);
    } else {
      for (const c of SUMMED) out[c][j] = (out[c][j] ?? 0) + (bars[c][i] ?? 0);
    }
  });
  out.labels = out.labels.map((l, j) => ((out.counts[j] ?? 1) > 1 ? `${l} · ${out.counts[j]} × ${out.types[j]}` : l));
  return out;
}

/** The `max` bars with the largest totals, in their order; `bars` itself when it has no more. */
export function largestBars(bars: MemoryBars, max: number): MemoryBars {
  if (bars.modules.length <= max) return bars;
  const keep = bars.modules
    .map((_, i) => i)
    .sort((x, y) => barTotal(bars, y) - barTotal(bars, x))
    .slice(0, max)
    .sort((x, y) => x - y);
  const out = emptyBars();
  for (const c of Object.keys(out) as (keyof MemoryBars)[]) {
    (out[c] as unknown[]) = keep.map((i) => bars[c][i]);
  }
  return out;
}

/** Each part's bytes and the total, in words, for a bar's tooltip. */
export function barText(bars: MemoryBars, i: number): string {
  const parts = shownParts(bars).map((p) => `${p.label} ${fmt(bars[p.key][i] ?? 0)}`);
  const tied = bars.tied[i] ?? 0;
  return [
    bars.labels[i] ?? "",
    ...parts,
    `total ${fmt(barTotal(bars, i))}`,
    ...(tied > 0 ? [`+ ${fmt(tied)} of tied parameters, counted at their first owner`] : []),
  ].join(" · ");
}
