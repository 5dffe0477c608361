/**
 * The view state reducer: each user action's transition on its own, on the tiny model
 * (root > embed, layers > 0..2 (Block > fc, act, folded into one group), head; depth 3).
 */
import { describe, expect, it } from "vitest";
import { decodePayload } from "./decode";
import type { Analysis } from "./protocol";
import { tiny } from "./testdata";
import { buildTree, moduleKey, type Tree } from "./tree";
import { initialViewState, reduceView, sameModel, treeDepth, type ViewState } from "./viewstate";

const load = (): Analysis => decodePayload(tiny().payload) as Analysis;
const tree = (): Tree => buildTree(load());
const keys = (s: ViewState): string[] => [...s.expanded].sort();
/** The group key of the folded blocks layers.0..2 (the tree names it). */
const groupKey = (t: Tree): string => t.groupOf[3] as string;

describe("view state", () => {
  it("opens a new model to the preferred depth, groups folded, its root selected", () => {
    const t = tree();
    expect(treeDepth(t)).toBe(3);
    const s = reduceView(initialViewState, { type: "model", tree: t });
    expect(s.depth).toBe(2);
    // root and layers open (depth < 2 with children); the folded group stays closed
    expect(keys(s)).toEqual([moduleKey(0), moduleKey(2)]);
    expect(s.selectedKey).toBe(moduleKey(0));
    expect(reduceView(initialViewState, { type: "model", tree: null })).toMatchObject({ depth: 1, selectedKey: null });
  });

  it("never changes the state it is given", () => {
    const t = tree();
    const s = reduceView(initialViewState, { type: "model", tree: t });
    const before = keys(s);
    const next = reduceView(s, { type: "toggle", key: moduleKey(1), open: true });
    expect(keys(next)).toContain(moduleKey(1));
    expect(keys(s)).toEqual(before);
    expect(reduceView(next, { type: "toggle", key: moduleKey(1), open: true })).toBe(next);
  });

  it("clamps the depth trait to the model and keeps it for the next model", () => {
    const t = tree();
    let s = reduceView(initialViewState, { type: "preferDepth", depth: 9, tree: t });
    expect([s.preferredDepth, s.depth]).toEqual([9, 3]);
    expect(keys(s)).not.toContain(groupKey(t)); // the trait opens to a depth, groups stay folded
    s = reduceView(s, { type: "model", tree: t });
    expect(s.depth).toBe(3);
    expect(reduceView(s, { type: "preferDepth", depth: 0, tree: t })).toBe(s);
    expect(reduceView(s, { type: "preferDepth", depth: Number.NaN, tree: t })).toBe(s);
  });

  it("the depth menu's last entry opens folded groups too", () => {
    const t = tree();
    const s = reduceView(initialViewState, { type: "model", tree: t });
    expect(keys(reduceView(s, { type: "depth", depth: 2, tree: t }))).not.toContain(groupKey(t));
    expect(keys(reduceView(s, { type: "depth", depth: 3, tree: t }))).toContain(groupKey(t));
    expect(keys(reduceView(s, { type: "depth", depth: 1, tree: t }))).toEqual([moduleKey(0)]);
  });

  it("a filter freezes the open rows: toggles and opening below are ignored", () => {
    const t = tree();
    const s = reduceView(reduceView(initialViewState, { type: "model", tree: t }), { type: "filter", text: "fc" });
    expect(s.filter).toBe("fc");
    expect(reduceView(s, { type: "toggle", key: moduleKey(0), open: false })).toBe(s);
    expect(reduceView(s, { type: "openBelow", node: t.root as NonNullable<Tree["root"]> })).toBe(s);
  });

  it("opens everything below a row, and collapses all to the root", () => {
    const t = tree();
    const s = reduceView(reduceView(initialViewState, { type: "model", tree: t }), { type: "collapseAll", tree: t });
    expect(keys(s)).toEqual([moduleKey(0)]);
    const all = reduceView(s, { type: "openBelow", node: t.root as NonNullable<Tree["root"]> });
    // every node with children: root, layers, the group, and the blocks under it
    expect(keys(all)).toEqual(expect.arrayContaining([moduleKey(0), moduleKey(2), groupKey(t), moduleKey(3)]));
    expect(keys(all)).not.toContain(moduleKey(1)); // embed is a leaf
  });

  it("sorts numeric columns descending, then ascending, then back to model order", () => {
    let s = reduceView(initialViewState, { type: "sort", column: "flops" });
    expect(s.sort).toEqual({ column: "flops", descending: true });
    s = reduceView(s, { type: "sort", column: "flops" });
    expect(s.sort).toEqual({ column: "flops", descending: false });
    s = reduceView(s, { type: "sort", column: "flops" });
    expect(s.sort).toEqual({ column: "order", descending: true });
    expect(reduceView(s, { type: "sort", column: "name" }).sort).toEqual({ column: "name", descending: false });
  });

  it("reveals a module: opens what hides it, selects it and clears the filter", () => {
    const t = tree();
    let s = reduceView(initialViewState, { type: "model", tree: t });
    s = reduceView(reduceView(s, { type: "collapseAll", tree: t }), { type: "filter", text: "head" });
    const r = reduceView(s, { type: "reveal", module: 10, tree: t }); // layers.2.fc
    expect(r.selectedKey).toBe(moduleKey(10));
    expect(r.filter).toBe("");
    expect(keys(r)).toEqual(expect.arrayContaining([moduleKey(0), moduleKey(2), moduleKey(9), groupKey(t)]));
  });

  it("keeps precision, tab, selection and the timeline's choice as set", () => {
    let s = reduceView(initialViewState, { type: "dtype", dtype: "bf16" });
    s = reduceView(s, { type: "tab", tab: "timeline" });
    s = reduceView(s, { type: "select", key: moduleKey(4) });
    s = reduceView(s, { type: "leaveOut", value: false });
    expect(s).toMatchObject({ dtype: "bf16", tab: "timeline", selectedKey: moduleKey(4), leaveOut: false });
    expect(reduceView(s, { type: "tab", tab: "timeline" })).toBe(s);
  });

  it("tells a re-run of the same model from a new model", () => {
    const a = load();
    expect(sameModel(a, load())).toBe(true);
    expect(sameModel(null, a)).toBe(false);
    const other = load();
    (other.modules[4] as { type: string }).type = "Conv1d";
    expect(sameModel(a, other)).toBe(false);
  });
});
