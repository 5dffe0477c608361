import { describe, expect, it } from "vitest";
import { aggregate, buildTree, foldedPath, frontier, groupLabels } from "./tree";
import { foldBars, memoryBars } from "./charts";
import { decodePayload, type Analysis } from "./protocol";
import gpt2 from "./fixtures/gpt2-tiny.json";

describe("the memory chart", () => {
  it("folds the same module of every repeated layer into one bar, summed", () => {
    const a = decodePayload(gpt2) as Analysis;
    const tree = buildTree(a);
    const aggs = aggregate(a);
    const mods = frontier(a, 4); // transformer.h.N.attn, .mlp, ...: one set per layer
    const raw = memoryBars(a, mods, aggs, (m) => m.paramBytes);
    const labels = groupLabels(tree);
    const folded = foldBars(raw, (m) => foldedPath(tree, m, labels));
    expect(folded.modules.length).toBeLessThan(raw.modules.length);
    const i = folded.labels.indexOf("transformer.h.0–1.mlp (2 ×)");
    expect(i).toBeGreaterThanOrEqual(0);
    // the two layers' mlp, summed: what the tree shows for each, twice
    const mlp = a.modules.filter((m) => /^transformer\.h\.\d+\.mlp$/.test(m.path));
    expect(mlp).toHaveLength(2);
    expect(folded.params[i]).toBe(mlp.reduce((s, m) => s + m.paramBytes, 0));
    expect(folded.activations[i]).toBe(mlp.reduce((s, m) => s + (aggs[m.index]?.activationBytes ?? 0), 0));
    // nothing is lost: the totals are the same
    const sum = (xs: number[]): number => xs.reduce((x, y) => x + y, 0);
    expect(sum(folded.params)).toBe(sum(raw.params));
    expect(sum(folded.activations)).toBe(sum(raw.activations));
  });
});
