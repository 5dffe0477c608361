/**
 * The step time on a GPU (`analyze(..., gpu=...)`): decoded from the payload's `time` object
 * (absent without `gpu=`, so older payloads decode unchanged), shown in the header as
 * "step 0.67 s · MFU 31% on H100", per module as the tree's Time column, and the GPU's memory
 * as the memory chart's budget line. Every name reaches the DOM as text.
 */

export interface StepTime {
  /** The GPU's name (`mw.gpus()`'s index, or a user's `mw.GPU`). */
  gpu: string;
  /** The GPU's memory, bytes: the memory chart's budget line. */
  memoryBytes: number;
  stepS: number;
  forwardS: number;
  backwardS: number;
  optimizerS: number;
  commS: number;
  /** A pipeline rank (`pp > 1`): the time it waits in its schedule's idle slots, part of `stepS`. */
  bubbleS: number;
  /** Model FLOPs utilisation: activation checkpointing's recomputation left out (PaLM's). */
  mfu: number;
  /** Hardware FLOPs utilisation: the recomputation counted; equal to `mfu` without it. */
  hfu: number;
  /** null for inputs that are not tokens. */
  tokensPerS: number | null;
  /** Per module row: its calls' time, forward and backward, sub-modules included. */
  moduleS: number[];
  /** Per module row: "compute", "memory", "comm", or "" (no op ran in it). */
  bound: string[];
}

type Obj = Record<string, unknown>;

function isObj(v: unknown): v is Obj {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}
function num(v: unknown): number {
  return typeof v === "number" && Number.isFinite(v) ? v : 0;
}

/** The payload's `time` object; undefined when absent or malformed (no `gpu`). */
export function decodeTime(raw: unknown): StepTime | undefined {
  if (!isObj(raw) || typeof raw.gpu !== "string") return undefined;
  const m = isObj(raw.modules) ? raw.modules : {};
  const seconds = Array.isArray(m.time_s) ? m.time_s : [];
  const bound = Array.isArray(m.bound) ? m.bound : [];
  return {
    gpu: raw.gpu,
    memoryBytes: num(raw.memory_bytes),
    stepS: num(raw.step_s),
    forwardS: num(raw.forward_s),
    backwardS: num(raw.backward_s),
    optimizerS: num(raw.optimizer_s),
    commS: num(raw.comm_s),
    bubbleS: num(raw.bubble_s), // older payloads: none
    mfu: num(raw.mfu),
    hfu: typeof raw.hfu === "number" ? num(raw.hfu) : num(raw.mfu), // older payloads: no hfu
    tokensPerS: typeof raw.tokens_per_s === "number" ? raw.tokens_per_s : null,
    moduleS: seconds.map(num),
    bound: bound.map((b) => (typeof b === "string" ? b : "")),
  };
}

/** Seconds as "0.67 s", "12.3 ms", "45.6 µs". */
export function formatSeconds(s: number): string {
  if (s >= 100) return `${s.toFixed(0)} s`;
  if (s >= 0.1) return `${s.toFixed(2)} s`;
  if (s >= 1e-4) return `${Number((s * 1e3).toPrecision(3))} ms`;
  if (s > 0) return `${Number((s * 1e6).toPrecision(3))} µs`;
  return "0 s";
}

/** A fraction as a percentage: "31%", or "0.04%" under 1 %. */
export function formatPercent(f: number): string {
  const p = f * 100;
  return p >= 1 || p === 0 ? `${p.toFixed(0)}%` : `${Number(p.toPrecision(1))}%`;
}

/** The header's value: "0.67 s · MFU 31% on H100". */
export function stepText(t: StepTime): string {
  return `${formatSeconds(t.stepS)} · MFU ${formatPercent(t.mfu)} on ${t.gpu}`;
}

/** The header's tooltip: the phases, the communication and the rate. */
export function stepTitle(t: StepTime): string {
  const rate = t.tokensPerS !== null ? `; ${Math.round(t.tokensPerS).toLocaleString("en-US")} tokens/s` : "";
  return (
    `estimated step time on ${t.gpu}: forward ${formatSeconds(t.forwardS)}, backward ${formatSeconds(t.backwardS)}, ` +
    `optimizer ${formatSeconds(t.optimizerS)}, communication ${formatSeconds(t.commS)} (before overlap)` +
    (t.bubbleS > 0 ? `, waiting in the pipeline's bubble ${formatSeconds(t.bubbleS)} (the pipeline's step: the ranks step together)` : "") +
    `${rate}. ` +
    "MFU: the model's FLOPs (FlopCounterMode's, activation checkpointing's recomputation left out) " +
    "over the step time times the GPU's dense peak" +
    (t.hfu !== t.mfu ? `; HFU ${formatPercent(t.hfu)} with the recomputation.` : ".")
  );
}
