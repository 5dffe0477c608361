/**
 * The Graph tab's cap on siblings and its chain layout, on graphs built here by hand: a chain of
 * 200 blocks (an `nn.Sequential` opened in place), the same with 2 leaves per block, and a
 * diamond (a skip connection) that is no chain.
 */
import { describe, expect, it } from "vitest";
import type { GEdge, GNode, GraphModel } from "./graph";
import { capSiblings, moreKey, showMore, STEP } from "./graphcap";
import { broadcasters, chains, layoutGraph, RANK_SEP } from "./graphlayout";

const node = (key: string, row: number, flops = 1): GNode => ({
  key, rows: [row], label: key, type: key.startsWith("<") ? "io" : "Block", repeats: 1, calls: 1, flops, memory: 2, group: null, openGroup: null, peak: false, more: null, kind: key.startsWith("<") ? "input" : "module", detail: "",
});
const edge = (src: string, dst: string): GEdge => ({ src, dst, shape: [2, 4], dtype: "float32", bytes: 32, ops: [], count: 1, tied: false, kind: "data", gradBytes: 0 });

/** input → k[0] → k[1] → ... → output. */
function chainOf(keys: string[]): GraphModel {
  const nodes = [node("<input>", -1), ...keys.map((k, i) => node(k, i + 1)), node("<output>", -2)];
  const order = nodes.map((n) => n.key);
  return { depth: 1, nodes, edges: order.slice(1).map((k, i) => edge(order[i] as string, k)) };
}
const blocks = (n: number): string[] => Array.from({ length: n }, (_, i) => String(i));

describe("capSiblings", () => {
  it("draws a module's first children and one node for the rest, their numbers summed", () => {
    const g = capSiblings(chainOf(blocks(200)));
    const more = g.nodes.find((n) => n.more !== null);
    expect(g.nodes.length).toBe(STEP + 3);
    expect(g.nodes.slice(1, STEP + 1).map((n) => n.key)).toEqual(blocks(STEP));
    expect(more?.label).toBe(`… ${200 - STEP} more`);
    expect(more?.rows.length).toBe(200 - STEP);
    expect(more?.flops).toBe(200 - STEP);
    // the chain runs through it; the edges among the hidden ones are left out
    const pairs = g.edges.map((e) => `${e.src}>${e.dst}`);
    expect(pairs).toContain(`${STEP - 1}>${moreKey("")}`);
    expect(pairs).toContain(`${moreKey("")}><output>`);
    expect(g.edges.length).toBe(STEP + 2);
  });

  it("hides whole blocks: their leaves go with them", () => {
    const keys = blocks(100).flatMap((b) => [`${b}.a`, `${b}.b`]);
    const g = capSiblings(chainOf(keys));
    const drawn = g.nodes.filter((n) => n.more === null && (n.rows[0] ?? -1) >= 0);
    expect(drawn.length).toBe(2 * STEP);
    expect(new Set(drawn.map((n) => n.key.split(".")[0])).size).toBe(STEP);
    expect(g.nodes.find((n) => n.more !== null)?.label).toBe(`… ${100 - STEP} more`);
  });

  it("shows twice as many after a click, and all of a short tail", () => {
    const shown = new Map<string, number>();
    showMore(shown, "");
    expect(capSiblings(chainOf(blocks(200)), shown).nodes.length).toBe(2 * STEP + 3);
    const few = chainOf(blocks(STEP + 3));
    expect(capSiblings(few)).toBe(few); // 3 more are drawn, not folded
  });
});

describe("layoutGraph", () => {
  it("finds chains and leaves a branch out of them", () => {
    const diamond = [edge("i", "a"), edge("i", "b"), edge("a", "o"), edge("b", "o"), edge("o", "x"), edge("x", "y")];
    expect(chains(["i", "a", "b", "o", "x", "y"], diamond)).toEqual([["i"], ["a"], ["b"], ["o", "x", "y"]]);
  });

  it("stacks a chain top to bottom, its edges straight", () => {
    const g = chainOf(blocks(12)); // 14 nodes: short enough to stay one column
    const lay = layoutGraph(new Map(g.nodes.map((n) => [n.key, 100])), g.edges, 40);
    const ys = g.nodes.map((n) => lay.boxes.get(n.key)?.y ?? NaN);
    ys.slice(1).forEach((y, i) => expect(y - (ys[i] as number)).toBe(40 + RANK_SEP));
    expect(new Set(g.nodes.map((n) => lay.boxes.get(n.key)?.x)).size).toBe(1);
    expect(lay.height).toBeGreaterThanOrEqual(14 * 40 + 13 * RANK_SEP);
    const first = lay.points[0] ?? [];
    expect(first).toEqual([{ x: lay.boxes.get("<input>")?.x, y: (ys[0] as number) + 20 }, { x: lay.boxes.get("0")?.x, y: (ys[1] as number) - 20 }]);
  });

  it("wraps a long chain into columns, each edge to the next column's top", () => {
    const g = chainOf(blocks(98)); // 100 nodes
    const lay = layoutGraph(new Map(g.nodes.map((n) => [n.key, 100])), g.edges, 40);
    const box = (k: string) => lay.boxes.get(k) ?? { x: NaN, y: NaN, width: 0, height: 0 };
    const xs = [...new Set(g.nodes.map((n) => box(n.key).x))].sort((p, q) => p - q);
    expect(xs.length).toBeGreaterThan(3);
    expect(lay.width).toBeLessThan(3 * lay.height); // a page's shape, not a 7,600 px line
    // reading order: down a column, then the next column from its top
    g.nodes.forEach((n, i) => {
      if (i === 0) return;
      const prev = box((g.nodes[i - 1] as GNode).key);
      const cur = box(n.key);
      expect(cur.x > prev.x || (cur.x === prev.x && cur.y > prev.y)).toBe(true);
    });
    g.edges.forEach((e, i) => {
      const pts = lay.points[i] ?? [];
      expect(pts[0]).toEqual({ x: box(e.src).x, y: box(e.src).y + 20 });
      expect(pts[pts.length - 1]).toEqual({ x: box(e.dst).x, y: box(e.dst).y - 20 });
    });
  });

  it("keeps a short run's nodes apart: each its own rank", () => {
    const edges = [edge("i", "e"), edge("e", "a"), edge("e", "b"), edge("a", "o"), edge("b", "o")];
    const lay = layoutGraph(new Map(["i", "e", "a", "b", "o"].map((k) => [k, 80])), edges, 40);
    const y = (k: string): number => lay.boxes.get(k)?.y ?? NaN;
    expect(y("i")).toBeLessThan(y("e"));
    expect(y("e")).toBeLessThan(y("a"));
    expect(lay.points[0]?.[0]?.y).toBe(y("i") + 20);
  });

  it("keeps a chain whole when one node feeds every member (a rotary embedding)", () => {
    const g = chainOf(blocks(20));
    const members = blocks(20);
    const edges = [...g.edges, ...members.map((k) => edge("r", k))];
    const widths = new Map([...g.nodes.map((n): [string, number] => [n.key, 100]), ["r", 100]]);
    expect(chains([...widths.keys()], edges, broadcasters(edges))).toContainEqual(g.nodes.map((n) => n.key));
    const lay = layoutGraph(widths, edges, 40);
    const last = lay.points[edges.length - 1] ?? [];
    const box = lay.boxes.get("19");
    expect(last[last.length - 1]).toEqual({ x: (box?.x ?? 0) - 50, y: box?.y }); // a stub into its side
  });

  it("breaks a chain where a node feeding a few others (a tied weight) joins it", () => {
    const g = chainOf(blocks(20));
    const edges = [...g.edges, edge("0", "5"), edge("0", "9"), edge("0", "15")]; // "0" feeds 4
    const lay = layoutGraph(new Map(g.nodes.map((n) => [n.key, 100])), edges, 40);
    for (const i of [edges.length - 3, edges.length - 1]) {
      const pts = lay.points[i] ?? [];
      const dst = lay.boxes.get((edges[i] as GEdge).dst);
      expect(pts.length).toBeGreaterThan(1);
      expect(pts[pts.length - 1]?.y).toBe((dst?.y ?? 0) - 20); // into its top, drawn whole
    }
  });

  it("lays a chain out beside a branch, edges meeting the chain's ends", () => {
    const edges = [edge("i", "a"), edge("i", "b"), edge("a", "c"), edge("b", "c"), edge("c", "d"), edge("d", "e"), edge("e", "f")];
    const widths = new Map(["i", "a", "b", "c", "d", "e", "f"].map((k) => [k, 80]));
    const lay = layoutGraph(widths, edges, 40);
    const c = lay.boxes.get("c");
    const into = lay.points[2] ?? [];
    expect(into[into.length - 1]).toEqual({ x: c?.x, y: (c?.y ?? 0) - 20 });
    const ys = ["c", "d", "e", "f"].map((k) => lay.boxes.get(k)?.y ?? 0);
    expect(ys).toEqual([...ys].sort((p, q) => p - q));
    expect((lay.boxes.get("a")?.x ?? 0) !== (lay.boxes.get("b")?.x ?? 0)).toBe(true);
  });
});
