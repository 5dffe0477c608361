/**
 * The Graph tab's model and view on a recorded payload: a 4-layer Llama (tied embeddings) in a
 * training step (`js/fixtures/graph-llama.json`: LlamaConfig(hidden_size=32, 4 layers,
 * vocab_size=100), input (1, 8)). Expected numbers come from that config, by hand.
 */
import { describe, expect, it } from "vitest";
import fixture from "./fixtures/graph-llama.json";
import { decodePayload } from "./decode";
import { foldGraph, graphDepths, levelFor, nodeOfRow, shade, tensorBytes, type GraphModel } from "./graph";
import { GraphView } from "./graphview";
import type { Analysis } from "./protocol";
import { aggregate, buildTree } from "./tree";

const a = decodePayload(fixture) as Analysis;
const tree = buildTree(a);
const aggs = aggregate(a);
const row = (path: string): number => a.modules.findIndex((m) => m.path === path);
const at = (depth: number, open: string[] = []): GraphModel =>
  foldGraph(tree, levelFor(a, depth) as NonNullable<ReturnType<typeof levelFor>>, new Set(open), aggs);
const pairs = (g: GraphModel, tied = false): string[] =>
  g.edges.filter((e) => e.tied === tied).map((e) => `${e.src} -> ${e.dst}`);

describe("decodeGraph", () => {
  it("has a level per depth, the ModuleList's depth the same as its parent's", () => {
    expect(graphDepths(a)).toEqual([1, 2, 3, 4, 5]);
    const two = levelFor(a, 2);
    const three = levelFor(a, 3);
    expect(three?.nodes).toEqual(two?.nodes);
    expect(three?.depth).toBe(3);
  });
  it("falls back to the deepest level at most the depth asked", () => {
    expect(levelFor(a, 99)?.depth).toBe(5);
    expect(levelFor(a, 0)?.depth).toBe(1);
  });
});

describe("foldGraph", () => {
  it("folds the 4 decoder layers into one node, as the tree does", () => {
    const g = at(2);
    const layers = g.nodes.find((n) => n.type === "LlamaDecoderLayer");
    expect(layers?.repeats).toBe(4);
    expect(layers?.label).toBe("model.layers.0–3");
    expect(layers?.rows).toEqual([0, 1, 2, 3].map((i) => row(`model.layers.${i}`)));
    const p = pairs(g);
    expect(p).toContain(`model.embed_tokens -> ${layers?.key}`);
    expect(p).toContain(`${layers?.key} -> model.norm`);
    expect(p).not.toContain(`${layers?.key} -> ${layers?.key}`); // one repeat to the next: left out
    expect(pairs(g, true)).toEqual(["model.embed_tokens -> lm_head"]);
    // its FLOPs are its members' sums
    const flops = [0, 1, 2, 3].reduce((s, i) => s + (aggs[row(`model.layers.${i}`)]?.flops ?? 0), 0);
    expect(layers?.flops).toBe(flops);
  });

  it("opens a group in place: one node per layer, chained", () => {
    const group = tree.groupOf[row("model.layers.0")] as string;
    const g = at(2, [group]);
    const p = pairs(g);
    for (let i = 0; i < 3; i++) expect(p).toContain(`model.layers.${i} -> model.layers.${i + 1}`);
    expect(g.nodes.filter((n) => n.type === "LlamaDecoderLayer").map((n) => n.openGroup)).toEqual([group, group, group, group]);
  });

  it("inside the layers, the residual adds are nodes and edges carry gradient bytes in training", () => {
    const g = at(4);
    const attn = g.nodes.find((n) => n.type === "LlamaAttention");
    expect(attn?.repeats).toBe(4);
    const add = g.nodes.find((n) => n.label === "model.layers.0–3.<residual 1>");
    const branch = g.edges.find((e) => e.src === attn?.key && e.dst === add?.key);
    expect(branch?.ops).toEqual([]);
    expect(branch?.kind).toBe("data");
    expect(branch?.shape).toEqual([1, 8, 32]);
    expect(branch?.bytes).toBe(1 * 8 * 32 * 4);
    expect(branch?.gradBytes).toBe(1 * 8 * 32 * 4);
    const input = g.edges.find((e) => e.src === "<input>");
    expect(input?.dtype).toBe("int64");
    expect(input?.gradBytes).toBe(0); // token ids need no gradient
  });

  it("finds the node showing a module, folded or not", () => {
    const g = at(2);
    expect(nodeOfRow(g, a, row("model.layers.2.mlp"))?.label).toBe("model.layers.0–3");
    expect(nodeOfRow(g, a, row("lm_head"))?.label).toBe("lm_head");
  });
});

describe("helpers", () => {
  it("shades on a log scale", () => {
    expect(shade(10, [10, 1000])).toBe(0);
    expect(shade(1000, [10, 1000])).toBe(1);
    expect(shade(100, [10, 1000])).toBeCloseTo(0.5);
    expect(shade(0, [10, 1000])).toBe(0);
  });
  it("counts tensor bytes by dtype", () => {
    expect(tensorBytes([2, 3], "bfloat16")).toBe(12);
    expect(tensorBytes([2, 3], "int64")).toBe(48);
  });
});

describe("GraphView", () => {
  it("draws every node and edge, selects on click, marks a selection made elsewhere", async () => {
    const picked: number[] = [];
    const view = new GraphView({ onSelect: (r) => picked.push(r) });
    document.body.append(view.el);
    view.render(tree, aggs, 2, 900);
    expect(view.el.querySelectorAll(".mw-graph-node").length).toBe(0); // laid out in a task of its own
    await view.ready;
    const nodes = view.el.querySelectorAll<SVGGElement>(".mw-graph-node");
    const model = at(2);
    expect(nodes.length).toBe(model.nodes.length);
    expect(view.el.querySelectorAll(".mw-graph-edge").length).toBe(model.edges.length);
    const lm = [...nodes].find((n) => n.dataset.key === "lm_head") as SVGGElement;
    lm.dispatchEvent(new MouseEvent("click", { bubbles: true }));
    expect(picked).toEqual([row("lm_head")]);
    expect(lm.classList.contains("mw-selected")).toBe(true);
    view.select(row("model.layers.1.self_attn"));
    const sel = view.el.querySelector(".mw-graph-node.mw-selected") as SVGGElement;
    expect(sel.dataset.key).toBe(model.nodes.find((n) => n.repeats === 4)?.key);
    expect(view.timing?.nodes).toBe(model.nodes.length);
    expect(view.svgText()).toContain("<svg");
    view.el.remove();
  });

  it("opens a folded group in place from its toggle", async () => {
    const view = new GraphView({ onSelect: () => undefined });
    view.render(tree, aggs, 2, 900);
    await view.ready;
    const toggle = view.el.querySelector(".mw-graph-toggle") as SVGTextElement;
    expect(toggle.firstChild?.textContent).toBe("+");
    toggle.dispatchEvent(new MouseEvent("click", { bubbles: true }));
    expect(view.el.querySelectorAll(".mw-graph-node").length).toBe(at(2).nodes.length + 3);
  });
});

describe("shortLabels", () => {
  it("shows a node's last two path parts, more where two nodes would read the same", async () => {
    const { shortLabels } = await import("./graphlabels");
    const folded = at(5);
    const shown = shortLabels(folded.nodes);
    const label = (path: string): string | undefined => shown.get(folded.nodes.find((n) => n.label === path)?.key ?? "");
    expect(label("model.layers.0–3.self_attn.q_proj")).toBe("self_attn.q_proj");
    expect(label("model.embed_tokens")).toBe("model.embed_tokens");
    expect(new Set(shown.values()).size).toBe(folded.nodes.length);
    // the group opened in place: four layers of the same modules, told apart by their index
    const opened = at(5, [tree.groupOf[row("model.layers.0")] as string]);
    const names = shortLabels(opened.nodes);
    expect(new Set(names.values()).size).toBe(opened.nodes.length);
    const q = opened.nodes.filter((n) => n.label.endsWith(".self_attn.q_proj")).map((n) => names.get(n.key));
    expect(q).toEqual(["0.self_attn.q_proj", "1.self_attn.q_proj", "2.self_attn.q_proj", "3.self_attn.q_proj"]);
  });
});
