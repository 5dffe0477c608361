/**
 * The Graph tab's nodes that are no module, on the recorded 4-layer Llama (`graph-llama.json`,
 * a training step, 4 heads of 8, input (1, 8)): the residual stream drawn as the spine through
 * each layer's residual adds, attention a node whenever the attention's body is drawn, the KV
 * cache the model returns a node of its own, and every name as the tree shows it (a folded
 * group's "layers.0–3", never the fold's internal group keys). Expected values by hand.
 */
import { describe, expect, it } from "vitest";
import fixture from "./fixtures/graph-llama.json";
import { decodePayload } from "./decode";
import { foldGraph, levelFor, nodeOfRow, type GraphModel } from "./graph";
import { GraphView } from "./graphview";
import type { Analysis } from "./protocol";
import { aggregate, buildTree } from "./tree";

const a = decodePayload(fixture) as Analysis;
const tree = buildTree(a);
const aggs = aggregate(a);
const row = (path: string): number => a.modules.findIndex((m) => m.path === path);
const at = (depth: number, open: string[] = []): GraphModel =>
  foldGraph(tree, levelFor(a, depth) as NonNullable<ReturnType<typeof levelFor>>, new Set(open), aggs);
/** Edges by the names drawn (a folded group's key is the tree's internal group id). */
const named = (g: GraphModel): { src: string; dst: string; kind: string; ops: string[] }[] => {
  const label = new Map(g.nodes.map((n) => [n.key, n.label]));
  return g.edges.map((e) => ({ ...e, src: label.get(e.src) ?? "?", dst: label.get(e.dst) ?? "?" }));
};
const spine = (g: GraphModel): string[] => named(g).filter((e) => e.kind === "residual").map((e) => `${e.src} -> ${e.dst}`);
const L = "model.layers.0–3";

describe("the residual stream", () => {
  it("runs through each layer's two residual adds, folded with the layers", () => {
    for (const depth of [4, 5]) {
      const g = at(depth);
      expect(spine(g)).toEqual([`model.embed_tokens -> ${L}.<residual 1>`, `${L}.<residual 1> -> ${L}.<residual 2>`]);
      const adds = g.nodes.filter((n) => n.kind === "residual");
      expect(adds.map((n) => [n.label, n.type, n.detail, n.repeats])).toEqual([
        [`${L}.<residual 1>`, "residual add", "+ self_attn", 4],
        [`${L}.<residual 2>`, "residual add", "+ mlp", 4],
      ]);
      const layers = [0, 1, 2, 3].map((i) => row(`model.layers.${i}`));
      expect(adds.map((n) => n.rows)).toEqual([layers, layers]); // the modules whose bodies add
    }
  });

  it("opened in place, chains every layer's adds", () => {
    const g = at(4, [tree.groupOf[row("model.layers.0")] as string]);
    const adds = [0, 1, 2, 3].flatMap((i) => [1, 2].map((k) => `model.layers.${i}.<residual ${k}>`));
    expect(spine(g)).toEqual(["model.embed_tokens", ...adds.slice(0, -1)].map((s, i) => `${s} -> ${adds[i]}`));
  });
});

describe("attention", () => {
  it("is a node once the attention's body is drawn, q, k and v in, o_proj out", () => {
    expect(at(4).nodes.some((n) => n.kind === "attention")).toBe(false); // self_attn is the node
    const g = at(5);
    const node = g.nodes.find((n) => n.kind === "attention");
    expect(node?.label).toBe(`${L}.self_attn.<attention>`);
    expect(node?.repeats).toBe(4);
    // q·kᵀ and weights·v: 2 × 2 · heads · seq² · head_dim, 4 layers
    expect(node?.flops).toBe(4 * 2 * 2 * 4 * 8 * 8 * 8);
    const into = named(g).filter((e) => e.dst === node?.label).map((e) => e.src.split(".").pop());
    expect(into).toEqual(expect.arrayContaining(["q_proj", "k_proj", "v_proj"]));
    expect(named(g).filter((e) => e.dst.endsWith("o_proj")).map((e) => e.src)).toEqual([node?.label]);
    for (const e of g.edges) expect(e.ops.filter((op) => /softmax|bmm|matmul/.test(op))).toEqual([]);
  });

  it("selects the module that runs it, and is never the node marked for a module", () => {
    const g = at(5);
    const node = g.nodes.find((n) => n.kind === "attention");
    expect(node?.rows[0]).toBe(row("model.layers.0.self_attn"));
    expect(nodeOfRow(g, a, row("model.layers.0.self_attn"))).toBeNull();
  });
});

describe("the KV cache", () => {
  it("is its own node, its edges of kind cache from the layer that writes it", () => {
    const srcs = (depth: number): string[] => named(at(depth)).filter((e) => e.dst === "cache").map((e) => e.src);
    expect(srcs(2)).toEqual([L]);
    expect(srcs(4)).toEqual([`${L}.self_attn`]);
    expect(srcs(5)).toEqual(expect.arrayContaining([`${L}.self_attn.k_proj`, `${L}.self_attn.v_proj`]));
    for (const depth of [2, 4, 5]) {
      const g = at(depth);
      expect(g.edges.filter((e) => e.dst === "<cache>").every((e) => e.kind === "cache")).toBe(true);
      expect(g.edges.filter((e) => e.dst === "<output>").map((e) => e.src)).toEqual(["lm_head"]);
      expect(g.nodes.find((n) => n.key === "<cache>")?.kind).toBe("cache");
    }
  });
});

describe("GraphView", () => {
  it("names every node and edge as the tree does, and marks the spine, attention and cache", async () => {
    const view = new GraphView({ onSelect: () => undefined });
    document.body.append(view.el);
    view.render(tree, aggs, 5, 1200);
    await view.ready;
    const titles = [...view.el.querySelectorAll(".mw-graph-edge > title, .mw-graph-node > title")].map((t) => t.textContent ?? "");
    expect(titles.length).toBeGreaterThan(20);
    for (const t of titles) expect(t).not.toMatch(/\.g\d+\b/); // no internal group key
    expect(titles.some((t) => t.startsWith(`model.embed_tokens → ${L}.input_layernorm`))).toBe(true);
    const spineEdges = view.el.querySelectorAll(".mw-graph-edge.mw-residual");
    expect(spineEdges.length).toBe(2);
    expect(spineEdges[0]?.querySelector("title")?.textContent).toContain("the residual stream");
    expect(view.el.querySelectorAll(".mw-graph-node.mw-residual").length).toBe(2);
    const attn = view.el.querySelector<SVGGElement>(".mw-graph-node.mw-attention");
    expect(attn?.dataset.label).toBe(`${L}.self_attn.<attention>`);
    const cache = view.el.querySelectorAll(".mw-graph-edge.mw-cache");
    expect(cache.length).toBeGreaterThan(0);
    for (const e of cache) expect(e.querySelector("title")?.textContent).toContain("KV cache");
    expect(view.el.querySelector(".mw-graph-node.mw-cache .mw-graph-name")?.textContent).toBe("cache");
    view.el.remove();
  });
});
