/**
 * The precision switch: what the peak, its categories, the timeline and the per-module output
 * memory become at another precision. The numbers are the kernel's (`memory.what_if`, the same
 * as Python's `a.what_if()`); this module only picks them and re-scales the timeline with the
 * factor the kernel sent, so the views never hold a second definition.
 */
import type { DtypeChoice } from "./charts";
import { MEMORY_CATEGORIES, type Analysis } from "./protocol";

/** The switch's tooltip: which quantities follow it. */
export const PRECISION_HINT =
  "Memory at another precision (an estimate scaled from this trace; a.what_if() in Python gives the same numbers). " +
  "fp32/bf16/fp16: weights, gradients, optimizer state and activations in that dtype. " +
  "int8/int4: weight-only quantization (inference); activations stay at their recorded dtype.";

export interface Precision {
  choice: Exclude<DtypeChoice, "recorded">;
  /** Bytes at the peak by category at this precision; they add up to `total`. */
  categories: Record<string, number>;
  total: number;
  /** The factor activations and temporaries get (1 for weight-only formats). */
  actScale: number;
  /** One line for the views: what follows the switch. */
  note: string;
}

/** The precision `choice` of `a`, or null for "recorded" (or a payload without `what_if`). */
export function precisionOf(a: Analysis | null, choice: DtypeChoice): Precision | null {
  if (!a || choice === "recorded") return null;
  const w = a.memory.whatIf[choice];
  if (!w) return null;
  const categories: Record<string, number> = {};
  for (const c of MEMORY_CATEGORIES) if (c in w) categories[c] = w[c] as number;
  const weightOnly = choice === "int8" || choice === "int4";
  return {
    choice,
    categories,
    total: w.total ?? 0,
    actScale: w.activation_scale ?? 1,
    note: weightOnly
      ? `Estimate with ${choice} weights (weight-only quantization): activations stay at their recorded dtype.`
      : `Estimate at ${choice}: weights, gradients, optimizer state and activations in ${choice} (as a.what_if()).`,
  };
}

/**
 * The live-bytes timeline at precision `p`: the constant part (parameters, buffers, inputs) at
 * the new precision, the rest (activations, temporaries, gradients, state) scaled by
 * `p.actScale`: `base' + (bytes − base) × scale`. In inference its maximum is `p.total` exactly.
 */
export function scaledTimeline(a: Analysis, p: Precision): number[] {
  const t = a.totals;
  const base = t.param_bytes + t.buffer_bytes + t.input_bytes;
  const c = p.categories;
  const base2 = (c.parameters ?? 0) + (c.buffers ?? 0) + (c.inputs ?? 0);
  return a.timeline.bytes.map((b) => Math.round(base2 + (b - base) * p.actScale));
}
