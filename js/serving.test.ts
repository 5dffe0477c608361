/**
 * The serving view of `mode="generate"` from the Python side's sample (`js/fixtures/
 * llama-generate.json`: a tiny Llama's generate() of 40 tokens on an H100): the header speaks
 * in serving words with the payload's numbers, the tree counts the calls the model ran (decode
 * steps summed by the rule stand for every step), and the KV cache is a band of its own.
 */
import { describe, expect, it } from "vitest";
import { decodePayload } from "./decode";
import { Header } from "./header";
import type { Analysis } from "./protocol";
import { decodeServing, servingNote, servingTotals } from "./serving";
import { stackTimeline } from "./stack";
import { aggregate } from "./tree";

const files = import.meta.glob<{ default: unknown }>("./fixtures/llama-generate.json", { eager: true });
const raw = files["./fixtures/llama-generate.json"]?.default as Record<string, unknown>;
const a = decodePayload(raw) as Analysis;
const wire = raw.serving as Record<string, unknown>;

describe("the serving view", () => {
  it("decodes payload.serving as sent", () => {
    const s = decodeServing(wire);
    expect(s?.kvBytes).toBe(wire.kv_bytes);
    expect(s?.prefillS).toBe(wire.prefill_s);
    expect(s?.paged?.sequences).toBe((wire.paged as Record<string, unknown>).sequences);
    expect(decodeServing({})).toBeUndefined();
  });

  it("says time to first token, per output token, tokens/s, KV cache and what fits", () => {
    const labels = servingTotals(a.serving!).map(([label]) => label);
    expect(labels).toEqual(["time to first token", "per output token", "tokens/s", "KV cache", "fits on the H100"]);
    const header = new Header();
    header.render(a, undefined, { label: "param memory", bytes: 0 });
    const text = header.el.textContent ?? "";
    expect(text).toContain("time to first token");
    expect(text).not.toContain("MFU");
    expect(header.notesEl.textContent).toContain("vLLM");
  });

  it("says why nothing fits", () => {
    const s = decodeServing({ ...wire, paged: { ...(wire.paged as object), sequences: 0, reason: "the weights alone (131 GiB) exceed the 80.0 GiB budget" } });
    expect(servingNote(s!)).toContain("no sequence of");
    expect(servingNote(s!)).toContain("the weights alone (131 GiB) exceed");
  });

  it("counts the calls the model ran: one forward pass per token", () => {
    const aggs = aggregate(a);
    expect(aggs[0]?.calls).toBe(a.serving!.newTokens);
    expect(a.calls.some((c) => c !== undefined && c.repeats > 1)).toBe(true); // steps summed
    // one call's output memory, never a sum over the steps above the peak
    expect(aggs[0]!.activationBytes).toBeLessThanOrEqual(a.totals.peak_bytes);
  });

  it("stacks the KV cache on the weights, growing over the decode steps", () => {
    const bands = stackTimeline(a.timeline.categories, a.timeline.bytes.length, false);
    expect(bands.map((b) => b.name).slice(0, 2)).toEqual(["parameters, buffers, inputs", "KV cache"]);
    const kv = bands[1]!.values;
    const decode = a.memory.phases.decode ?? 0;
    expect(kv[kv.length - 1]).toBeGreaterThan(kv[decode] ?? 0);
  });
});
