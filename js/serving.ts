/**
 * The serving view of `mode="generate"` (`payload.serving`, meta_widget/views/serving.py): the
 * header in serving words (time to first token, time per output token, tokens/s, the KV cache,
 * the batch × context that fits on the GPU paged as vLLM pages it) and the line that says why
 * nothing fits. Every number is the analysis' own (`a.kv_cache`, `a.time`); this only formats.
 */
import { formatBytes, formatExact } from "./format";
import { formatSeconds } from "./timing";

export interface Paged {
  gpu: string;
  budgetBytes: number;
  /** `a.kv_cache.paged(gpu memory)`: sequences of `length` positions that fit. */
  sequences: number;
  length: number;
  block: number;
  sequenceBytes: number;
  weightBytes: number;
  /** Why (`PagedFit.reason`): what bounds the count, why 0 when nothing fits. */
  reason: string;
}

export interface Serving {
  batch: number;
  promptTokens: number;
  newTokens: number;
  cacheType: string;
  kvBytes: number;
  kvBytesPerToken: number;
  /** Layer kind ("full", "sliding", "none") -> [layers, bytes]. */
  layers: Record<string, [number, number]>;
  /** With `gpu=` (`a.time`), else null. */
  prefillS: number | null;
  perTokenS: number | null;
  tokensPerS: number | null;
  decodeTokensPerS: number | null;
  paged: Paged | null;
}

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);
const num = (v: unknown): number => (typeof v === "number" && Number.isFinite(v) ? v : 0);
const opt = (v: unknown): number | null => (typeof v === "number" && Number.isFinite(v) ? v : null);
const str = (v: unknown): string => (typeof v === "string" ? v : "");

/** `payload.serving`; undefined when absent or malformed. */
export function decodeServing(raw: unknown): Serving | undefined {
  if (!isObj(raw) || typeof raw.kv_bytes !== "number") return undefined;
  const layers: Record<string, [number, number]> = {};
  if (isObj(raw.layers)) {
    for (const [kind, v] of Object.entries(raw.layers)) {
      if (Array.isArray(v)) layers[kind] = [num(v[0]), num(v[1])];
    }
  }
  const p = raw.paged;
  return {
    batch: num(raw.batch),
    promptTokens: num(raw.prompt_tokens),
    newTokens: num(raw.new_tokens),
    cacheType: str(raw.cache_type),
    kvBytes: num(raw.kv_bytes),
    kvBytesPerToken: num(raw.kv_bytes_per_token),
    layers,
    prefillS: opt(raw.prefill_s),
    perTokenS: opt(raw.per_token_s),
    tokensPerS: opt(raw.tokens_per_s),
    decodeTokensPerS: opt(raw.decode_tokens_per_s),
    paged: isObj(p)
      ? {
          gpu: str(p.gpu),
          budgetBytes: num(p.budget_bytes),
          sequences: num(p.sequences),
          length: num(p.length),
          block: num(p.block),
          sequenceBytes: num(p.sequence_bytes),
          weightBytes: num(p.weight_bytes),
          reason: str(p.reason),
        }
      : null,
  };
}

/** "80 full + 40 sliding window layers". */
function layerWords(s: Serving): string {
  const kinds = Object.entries(s.layers).filter(([k]) => k !== "none");
  return kinds.map(([k, [n]]) => `${n} ${k === "sliding" ? "sliding window" : k}`).join(" + ") + " layers";
}

/** The header's serving totals as `[label, value, tooltip]` (they replace the step's). */
export function servingTotals(s: Serving): [string, string, string][] {
  const items: [string, string, string][] = [];
  if (s.prefillS !== null) {
    items.push(["time to first token", formatSeconds(s.prefillS), "the prefill's forward pass over the prompt (a.time.prefill_s)"]);
  }
  if (s.perTokenS !== null) {
    items.push([
      "per output token",
      formatSeconds(s.perTokenS),
      `each decode step: the rest of generate() over its ${formatExact(Math.max(0, s.newTokens - 1))} decode steps (a.time.per_token_s); ${s.decodeTokensPerS !== null ? `${formatExact(Math.round(s.decodeTokensPerS))} tokens/s while decoding` : ""}`,
    ]);
  }
  if (s.tokensPerS !== null) {
    items.push([
      "tokens/s",
      formatExact(Math.round(s.tokensPerS)),
      `the tokens made (${formatExact(s.batch)} × ${formatExact(s.newTokens)}) over the whole generate(), prefill included (a.time.tokens_per_s)`,
    ]);
  }
  items.push([
    "KV cache",
    formatBytes(s.kvBytes),
    `the ${s.cacheType} generate() returned (a.kv_cache.bytes): ${s.batch} × (${formatExact(s.promptTokens)} + ${formatExact(s.newTokens)}) tokens, ${formatExact(Math.round(s.kvBytesPerToken))} B per token over ${layerWords(s)}`,
  ]);
  const p = s.paged;
  if (p) {
    items.push([
      `fits on the ${p.gpu}`,
      `${formatExact(p.sequences)} × ${formatExact(p.length)} tokens`,
      `a.kv_cache.paged("${formatBytes(p.budgetBytes)}"): sequences of ${formatExact(p.length)} positions whose cache fits, in blocks of ${p.block} as vLLM allocates it, beside the weights (${formatBytes(p.weightBytes)}); activations not set aside. ${p.reason}`,
    ]);
  }
  return items;
}

/** The note under the header: the paged capacity in words, and why nothing fits. */
export function servingNote(s: Serving): string | null {
  const p = s.paged;
  if (!p) return null;
  const where = `On the ${p.gpu} (${formatBytes(p.budgetBytes)}), its KV cache paged in blocks of ${p.block} as vLLM does`;
  if (p.sequences === 0) return `${where}: no sequence of ${formatExact(p.length)} tokens fits: ${p.reason}.`;
  return `${where}: ${formatExact(p.sequences)} sequences × ${formatExact(p.length)} tokens fit (${formatExact(p.sequences * p.length)} tokens of cache): ${p.reason}.`;
}
