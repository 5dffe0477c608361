import { describe, expect, it } from "vitest";
import { barText, barTotal, foldBars, largestBars, memoryBars, shownParts, type MemoryBars } from "./bars";
import { type Analysis } from "./protocol";
import { decodePayload } from "./decode";
import { tiny } from "./testdata";
import { aggregate, buildTree, foldedPath, frontier, groupLabels } from "./tree";
import gpt2 from "./fixtures/gpt2-tiny.json";
import gpt2Training from "./fixtures/gpt2-tiny.training.json";
import fsdpGpt2 from "./fixtures/fsdp-gpt2.json";

const sum = (xs: number[]): number => xs.reduce((x, y) => x + y, 0);

function folded(a: Analysis, depth: number, scale = 1): MemoryBars {
  const tree = buildTree(a);
  const labels = groupLabels(tree);
  const raw = memoryBars(a, frontier(a, depth), aggregate(a), (m) => m.paramBytes, scale);
  return foldBars(raw, (m) => foldedPath(tree, m, labels));
}

describe("the memory chart's bars", () => {
  it("stacks parameters and output mem per module (inference)", () => {
    const a = decodePayload(tiny().payload) as Analysis;
    const bars = memoryBars(a, [1, 3, 12], aggregate(a), (m) => m.paramBytes);
    expect(bars).toEqual({
      modules: [1, 3, 12],
      labels: ["embed", "layers.0", "head"],
      types: ["Embedding", "Block", "Linear"],
      counts: [1, 1, 1],
      params: [3200, 288, 360],
      gradients: [0, 0, 0],
      optimizer: [0, 0, 0],
      activations: [128, 128, 160],
      tied: [0, 0, 0],
    });
    expect(shownParts(bars).map((p) => p.label)).toEqual(["parameters", "output mem"]);
    expect(barTotal(bars, 1)).toBe(288 + 128);
  });

  it("folds the same module of every repeated layer into one bar, summed", () => {
    const a = decodePayload(gpt2) as Analysis;
    const aggs = aggregate(a);
    const raw = memoryBars(a, frontier(a, 4), aggs, (m) => m.paramBytes);
    const bars = folded(a, 4); // transformer.h.N.attn, .mlp, ...: one set per layer
    expect(bars.modules.length).toBeLessThan(raw.modules.length);
    const i = bars.labels.indexOf("transformer.h.0–1.mlp · 2 × GPT2MLP");
    expect(i).toBeGreaterThanOrEqual(0);
    // the two layers' mlp, summed: what the tree shows for each, twice
    const mlp = a.modules.filter((m) => /^transformer\.h\.\d+\.mlp$/.test(m.path));
    expect(mlp).toHaveLength(2);
    expect(bars.counts[i]).toBe(2);
    expect(bars.params[i]).toBe(sum(mlp.map((m) => m.paramBytes)));
    expect(bars.activations[i]).toBe(sum(mlp.map((m) => aggs[m.index]?.activationBytes ?? 0)));
    // nothing is lost: the totals are the same
    expect(sum(bars.params)).toBe(sum(raw.params));
    expect(sum(bars.activations)).toBe(sum(raw.activations));
  });

  it("draws one rank's shards under FSDP, where the tree counts the whole model", () => {
    const a = decodePayload(fsdpGpt2) as Analysis;
    const bars = folded(a, 1); // transformer, lm_head
    expect(bars.labels).toEqual(["transformer", "lm_head"]);
    // the rank's bytes: they add up to its totals, beside its gradients and optimizer state
    expect(sum(bars.params)).toBe(a.totals.param_bytes);
    expect(sum(bars.params)).toBeLessThan(sum(bars.modules.map((m) => a.modules[m]?.paramBytes ?? 0)) / 1.5);
    expect(sum(bars.gradients)).toBe(a.memory.gradientBytes);
    expect(sum(bars.optimizer)).toBe(a.memory.optimizerStateBytes);
    expect(bars.params[0]).toBe(bars.gradients[0]); // fp32 gradients of the same shards
    // lm_head's weight is transformer.wte's: the rank's shard of it, said beside the bar
    const wte = a.modules.find((m) => m.path === "transformer.wte");
    expect(wte).toBeDefined();
    expect([bars.params[1], bars.gradients[1], bars.optimizer[1]]).toEqual([0, 0, 0]);
    expect(bars.tied[1]).toBe(a.memory.modules.paramBytes[wte?.index ?? -1]);
    expect(bars.tied[1]).toBeLessThan(wte?.paramBytes ?? 0);
    // the precision switch scales the rank's floating-point parameters
    const bf16 = memoryBars(a, frontier(a, 1), aggregate(a), (m) => m.floatParams * 2);
    expect(sum(bf16.params)).toBe(a.memory.modules.floatParams[0] as number * 2);
  });

  it("stacks gradients and optimizer state in training, tied weights at their first owner", () => {
    const a = decodePayload(gpt2Training) as Analysis;
    const bars = folded(a, 1); // transformer, lm_head
    expect(bars.labels).toEqual(["transformer", "lm_head"]);
    expect(shownParts(bars).map((p) => p.label)).toEqual(["parameters", "gradients", "optimizer state", "output mem"]);
    // lm_head's weight is transformer.wte's: counted there, once
    const head = a.modules[bars.modules[1] as number];
    expect(head?.paramBytes).toBeGreaterThan(0);
    expect([bars.params[1], bars.gradients[1], bars.optimizer[1]]).toEqual([0, 0, 0]);
    expect(bars.tied[1]).toBe(head?.paramBytes);
    expect(sum(bars.params)).toBe(a.totals.param_bytes);
    expect(sum(bars.gradients)).toBe(a.memory.gradientBytes);
    expect(sum(bars.optimizer)).toBe(a.memory.optimizerStateBytes);
    expect(barText(bars, 1)).toContain("of tied parameters, counted at their first owner");
    // folded layers: each layer's gradients are its parameters, AdamW's state twice them
    const layers = folded(a, 3);
    const i = layers.labels.indexOf("transformer.h.0–1 · 2 × GPT2Block");
    expect(i).toBeGreaterThanOrEqual(0);
    const members = a.modules.filter((m) => /^transformer\.h\.\d+$/.test(m.path));
    expect(layers.gradients[i]).toBe(sum(members.map((m) => m.paramBytes)));
    expect(layers.optimizer[i]).toBe(2 * (layers.gradients[i] as number));
    expect(barText(layers, i)).toMatch(/^transformer\.h\.0–1 · 2 × GPT2Block · parameters .* · gradients .* · optimizer state .* · output mem .* · total /);
  });

  it("scales gradients and optimizer state with the precision switch, as a.what_if() does", () => {
    const a = decodePayload(gpt2Training) as Analysis;
    const bf16 = a.memory.whatIf.bf16 as Record<string, number>;
    const bars = folded(a, 2, bf16.activation_scale);
    // the peak of this step is in the optimizer phase: every gradient and all state are live
    expect(sum(bars.gradients)).toBe(bf16.gradients);
    expect(sum(bars.optimizer)).toBe(bf16["optimizer state"]);
  });

  it("keeps the largest bars, in their order", () => {
    const a = decodePayload(gpt2Training) as Analysis;
    const bars = folded(a, 2);
    const top = largestBars(bars, 2);
    expect(top.modules).toHaveLength(2);
    const totals = bars.modules.map((_, i) => barTotal(bars, i)).sort((x, y) => y - x);
    expect(top.modules.map((_, i) => barTotal(top, i)).sort((x, y) => y - x)).toEqual(totals.slice(0, 2));
    expect(top.modules).toEqual([...top.modules].sort((x, y) => x - y));
    expect(largestBars(bars, 100)).toBe(bars);
  });
});

describe("a bar's label, shortened", () => {
  it("keeps its class and cuts its path in the middle, never from the left", async () => {
    const { truncateLabel } = await import("./barchart");
    const a = truncateLabel("model.layers.0–79.input_layernorm · 80 × LlamaRMSNorm", 40);
    const b = truncateLabel("model.layers.0–79.post_attention_layernorm · 80 × LlamaRMSNorm", 40);
    expect(a.length).toBeLessThanOrEqual(40);
    expect(a.endsWith(" · 80 × LlamaRMSNorm")).toBe(true);
    expect(a.startsWith("mod")).toBe(true); // its start kept: never cut from the left
    expect(a).toContain("input_layernorm");
    expect(a).not.toBe(b); // the two norms never read alike
    expect(truncateLabel("features.0.0 · Conv2d", 40)).toBe("features.0.0 · Conv2d");
  });
});
