import { describe, expect, it } from "vitest";
import { type Analysis } from "./protocol";
import { decodePayload } from "./decode";
import { buildTree, expandToDepth, flatten, moduleMatcher, nodePath, type Tree } from "./tree";
import gpt2 from "./fixtures/gpt2-tiny.json";

const analysis = (): Analysis => decodePayload(gpt2) as Analysis;
const matches = (a: Analysis, q: string): string[] => {
  const m = moduleMatcher(q);
  return m ? a.modules.filter(m).map((x) => x.path) : [];
};
const shown = (t: Tree, filter: string, expanded = new Set<string>()): string[] =>
  flatten(t, { expanded, filter }).map((r) => nodePath(t, r.node));

describe("search", () => {
  it("finds dotted paths from any depth, as Copy path hands them out", () => {
    const a = analysis();
    expect(matches(a, "mlp.c_fc")).toEqual(["transformer.h.0.mlp.c_fc", "transformer.h.1.mlp.c_fc"]);
    expect(matches(a, "transformer.h.1.attn.c_proj")).toEqual(["transformer.h.1.attn.c_proj"]);
    // the last segment may be unfinished while typing
    expect(matches(a, "mlp.c_f")).toEqual(matches(a, "mlp.c_fc"));
    // whole segments: "lp.c_fc" is not a segment boundary
    expect(matches(a, "lp.c_fc")).toEqual([]);
  });

  it("reads * as one segment (or part of one)", () => {
    const a = analysis();
    expect(matches(a, "h.*.mlp")).toEqual(["transformer.h.0.mlp", "transformer.h.1.mlp"]);
    expect(matches(a, "h.1.attn.c_*")).toEqual(["transformer.h.1.attn.c_attn", "transformer.h.1.attn.c_proj"]);
    expect(matches(a, "*.ln_f")).toEqual(["transformer.ln_f"]);
  });

  it("keeps a name or class substring as before", () => {
    const a = analysis();
    expect(matches(a, "c_fc")).toHaveLength(2);
    expect(matches(a, "conv1d").length).toBeGreaterThan(0); // GPT-2's Conv1D class
  });

  it("shows a hit inside folded layers once: the group, then its first member", () => {
    const t = buildTree(analysis());
    const rows = shown(t, "mlp.c_fc");
    expect(rows).toEqual([
      "",
      "transformer",
      "transformer.h",
      "transformer.h.0–1",
      "transformer.h.0",
      "transformer.h.0.mlp",
      "transformer.h.0.mlp.c_fc",
    ]);
  });
});

describe("depth", () => {
  it("'all' opens folded groups, with only their first member open below", () => {
    const t = buildTree(analysis());
    const max = Math.max(...t.analysis.modules.map((m) => m.depth));
    const all = flatten(t, { expanded: expandToDepth(t, max, true) }).map((r) => nodePath(t, r.node));
    expect(all).toContain("transformer.h.0–1");
    expect(all).toContain("transformer.h.0.mlp.c_fc"); // the first layer, open to the leaves
    expect(all).toContain("transformer.h.1"); // the second one listed ...
    expect(all).not.toContain("transformer.h.1.mlp"); // ... but closed
    // without "all", groups stay folded, and opening one by hand shows one open member
    const deep = expandToDepth(t, max);
    expect(deep.has("g6")).toBe(false);
    deep.add("g6");
    const opened = flatten(t, { expanded: deep }).map((r) => nodePath(t, r.node));
    expect(opened).toContain("transformer.h.0.attn.c_attn");
    expect(opened).toContain("transformer.h.1");
    expect(opened).not.toContain("transformer.h.1.attn");
  });
});
