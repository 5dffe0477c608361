import { describe, expect, it } from "vitest";
import { type Analysis, type ModuleInfo } from "./protocol";
import { decodePayload } from "./decode";
import { tiny } from "./testdata";
import {
  aggregate,
  buildTree,
  expandToDepth,
  filterModules,
  flatten,
  frontier,
  nodeName,
  nodePath,
  nodeType,
  nodeValues,
  revealKeys,
  signatures,
  visibleWindow,
  type GroupNode,
  type Row,
  type Tree,
} from "./tree";

const load = (opts = {}): Analysis => decodePayload(tiny(opts).payload) as Analysis;
const names = (tree: Tree, rows: Row[]): string[] =>
  rows.map((r) => `${"  ".repeat(r.level)}${nodeName(tree, r.node)}`);

describe("aggregate", () => {
  it("sums each module's calls", () => {
    const g = aggregate(load());
    expect(g[0]).toEqual({ calls: 1, flops: 2176, backwardFlops: 0, activationBytes: 160, error: false, assumed: false });
    expect(g[3]).toEqual({ calls: 1, flops: 512, backwardFlops: 0, activationBytes: 128, error: false, assumed: false });
    expect(g[2]).toEqual({ calls: 0, flops: 0, backwardFlops: 0, activationBytes: 0, error: false, assumed: false });
    expect(g[12]).toEqual({ calls: 1, flops: 640, backwardFlops: 0, activationBytes: 160, error: false, assumed: false });
  });
  it("counts a shared module's calls", () => {
    const g = aggregate(load({ twice: true }));
    expect(g[12]).toEqual({ calls: 2, flops: 1280, backwardFlops: 0, activationBytes: 320, error: false, assumed: false });
  });
  it("marks modules whose call raised", () => {
    const g = aggregate(load({ error: true }));
    expect(g.map((x, i) => (x.error ? i : -1)).filter((i) => i >= 0)).toEqual([0, 6, 7]);
  });
});

describe("folding repeated identical siblings", () => {
  it("gives identical subtrees one signature", () => {
    const s = signatures(load().modules);
    expect(s[3]).toBe(s[6]);
    expect(s[6]).toBe(s[9]);
    expect(s[4]).toBe(s[7]);
    expect(s[3]).not.toBe(s[4]);
    expect(s[1]).not.toBe(s[12]);
  });

  it("folds layers.0-2 into one group with summed numbers", () => {
    const a = load();
    const tree = buildTree(a);
    const layers = tree.nodes[2];
    expect(layers?.children).toHaveLength(1);
    const g = layers?.children[0] as GroupNode;
    expect(g.kind).toBe("group");
    expect(g.members).toEqual([3, 6, 9]);
    expect(nodeName(tree, g)).toBe("0–2");
    expect(nodeType(tree, g)).toBe("3 × Block");
    expect(nodePath(tree, g)).toBe("layers.0–2");
    expect(tree.groupOf[6]).toBe(g.key);
    expect(tree.groupOf[7]).toBeNull();
    expect(nodeValues(tree, g, aggregate(a))).toEqual({
      params: 216,
      paramBytes: 864,
      activationBytes: 384,
      flops: 1536,
      backwardFlops: 0,
      time: 0, // no GPU: no time
      calls: 3,
      error: false,
      assumed: false,
    });
  });

  it("does not fold siblings that differ in parameters", () => {
    const raw = tiny().payload as { modules: { params: number[] } };
    raw.modules.params[6] = 73; // layers.1 now differs from layers.0 and layers.2
    const tree = buildTree(decodePayload(raw) as Analysis);
    expect(tree.nodes[2]?.children.map((c) => c.kind)).toEqual(["module", "module", "module"]);
  });

  it("does not fold named siblings, even identical ones", () => {
    // rename layers.0-2 to a, b, c: three identical Blocks with names are kept apart
    const raw = tiny().payload as { strings: string[]; modules: { name: number[] } };
    for (const [row, name] of [
      [3, "a"],
      [6, "b"],
      [9, "c"],
    ] as [number, string][]) {
      raw.strings.push(name);
      raw.modules.name[row] = raw.strings.length - 1;
    }
    const tree = buildTree(decodePayload(raw) as Analysis);
    expect(tree.nodes[2]?.children.map((c) => c.key)).toEqual(["m3", "m6", "m9"]);
  });

  it("does not fold a single module", () => {
    const tree = buildTree(load());
    expect(tree.nodes[0]?.children.map((c) => c.key)).toEqual(["m1", "m2", "m12"]);
  });
});

describe("flatten", () => {
  const a = load();
  const tree = buildTree(a);
  const aggs = aggregate(a);

  it("shows what is expanded, a group's members one level below it", () => {
    expect(names(tree, flatten(tree, { expanded: expandToDepth(tree, 1) }))).toEqual([
      "TinyNet",
      "  embed",
      "  layers",
      "  head",
    ]);
    const open = expandToDepth(tree, 2);
    expect(names(tree, flatten(tree, { expanded: open }))).toEqual([
      "TinyNet",
      "  embed",
      "  layers",
      "    0–2",
      "  head",
    ]);
    open.add("g3");
    const rows = flatten(tree, { expanded: open });
    expect(names(tree, rows)).toEqual([
      "TinyNet",
      "  embed",
      "  layers",
      "    0–2",
      "      0",
      "      1",
      "      2",
      "  head",
    ]);
    expect(rows[5]?.parentRow).toBe(3);
    expect(rows[3]?.parentRow).toBe(2);
    expect(rows[3]?.expanded).toBe(true);
    expect(rows[4]?.expanded).toBe(false);
    expect(rows[4]?.hasChildren).toBe(true);
    expect(rows[1]?.hasChildren).toBe(false);
  });

  it("filters by name or type, case-insensitive, keeping ancestors open", () => {
    const rows = flatten(tree, { expanded: new Set(), filter: "RELU" });
    // the hits in the three folded layers stay folded: the group, then its first member
    expect(names(tree, rows)).toEqual(["TinyNet", "  layers", "    0–2", "      0", "        act"]);
    expect(rows.filter((r) => r.matched).map((r) => nodePath(tree, r.node))).toEqual(["layers.0.act"]);
    expect(names(tree, flatten(tree, { expanded: new Set(), filter: "emb" }))).toEqual([
      "TinyNet",
      "  embed",
    ]);
    expect(flatten(tree, { expanded: new Set(), filter: "nothing-like-this" })).toEqual([]);
  });

  it("keeps only called modules (and ancestors) with a predicate", () => {
    const f = filterModules(a, "", (m: ModuleInfo) => m.index === 7);
    expect(f?.visible.map((v, i) => (v ? i : -1)).filter((i) => i >= 0)).toEqual([0, 2, 6, 7]);
  });

  it("sorts siblings by a column, ties in definition order", () => {
    const expanded = expandToDepth(tree, 1);
    const desc = flatten(tree, { expanded, aggs, sort: { column: "flops", descending: true } });
    // layers is never called: it sorts by its blocks' 3 × 512 FLOPs, above head's 640
    expect(names(tree, desc)).toEqual(["TinyNet", "  layers", "  head", "  embed"]);
    const asc = flatten(tree, { expanded, aggs, sort: { column: "params", descending: false } });
    expect(names(tree, asc)).toEqual(["TinyNet", "  head", "  layers", "  embed"]);
    const byName = flatten(tree, { expanded, aggs, sort: { column: "name", descending: false } });
    expect(names(tree, byName)).toEqual(["TinyNet", "  embed", "  head", "  layers"]);
  });

  it("reveals a module hidden in a folded group", () => {
    expect(revealKeys(tree, 7).sort()).toEqual(["g3", "m0", "m2", "m6"]);
    const rows = flatten(tree, { expanded: new Set(revealKeys(tree, 7)) });
    expect(rows.some((r) => r.node.key === "m7")).toBe(true);
  });

  it("stays fast on 25,000 modules", () => {
    // root -> 5000 identical blocks -> 4 different leaves each
    const n = 5000;
    const strings = ["", "Big", "Block", "Linear", "ReLU", "LayerNorm", "Dropout"];
    const name: number[] = [0];
    const type: number[] = [1];
    const parent: number[] = [-1];
    for (let b = 0; b < n; b++) {
      strings.push(String(b));
      name.push(strings.length - 1);
      type.push(2);
      parent.push(0);
      const row = parent.length - 1;
      for (let k = 0; k < 4; k++) {
        name.push(0);
        type.push(3 + k); // four different leaves: nothing folds inside a block
        parent.push(row);
      }
    }
    const big = decodePayload({ strings, modules: { name, type, parent } }) as Analysis;
    expect(big.modules).toHaveLength(1 + 5 * n);
    const t = buildTree(big);
    expect(t.nodes[0]?.children).toHaveLength(1); // all 5000 blocks fold
    const all = new Set<string>(["m0", "g1"]);
    for (let b = 0; b < n; b++) all.add(`m${1 + 5 * b}`);
    const t0 = performance.now();
    const rows = flatten(t, { expanded: all });
    const ms = performance.now() - t0;
    expect(rows).toHaveLength(2 + 5 * n);
    expect(ms).toBeLessThan(2000); // generous: a guard against quadratic blow-ups only
  });
});

describe("frontier", () => {
  it("lists modules at a depth plus shallower leaves", () => {
    const a = load();
    expect(frontier(a, 1)).toEqual([1, 2, 12]);
    expect(frontier(a, 2)).toEqual([1, 3, 6, 9, 12]);
  });
});

describe("visibleWindow", () => {
  it("covers the viewport plus overscan", () => {
    expect(visibleWindow(260, 130, 26, 100, 2)).toEqual({ start: 8, end: 17 });
    expect(visibleWindow(0, 130, 26, 100, 2)).toEqual({ start: 0, end: 7 });
  });
  it("clamps to the rows there are", () => {
    expect(visibleWindow(2000, 130, 26, 12, 2)).toEqual({ start: 12, end: 12 });
    expect(visibleWindow(0, 400, 26, 3, 8)).toEqual({ start: 0, end: 3 });
    expect(visibleWindow(0, 400, 26, 0)).toEqual({ start: 0, end: 0 });
  });
});
