/**
 * Recorded samples written by the Python side (`js/fixtures/*.json`, e.g. gpt2-tiny.json) must
 * decode, and their numbers must agree with each other: the totals that Python computed
 * separately against the per-call and per-module columns that the views use.
 * Skipped while no sample has been recorded.
 */
import { describe, expect, it } from "vitest";
import { decodePayload, type Analysis } from "./protocol";
import { aggregate, buildTree, flatten, expandToDepth } from "./tree";

const samples = import.meta.glob<{ default: unknown }>("./fixtures/*.json", { eager: true });
const entries = Object.entries(samples);

describe.skipIf(entries.length === 0)("recorded samples", () => {
  for (const [file, mod] of entries) {
    describe(file, () => {
      const a = decodePayload(mod.default) as Analysis;

      it("decodes every module and call", () => {
        expect(a).not.toBeNull();
        expect(a.version).toBe(1);
        const raw = mod.default as { modules: { name: unknown[] }; calls: { module: unknown[] } };
        expect(a.modules).toHaveLength(raw.modules.name.length);
        expect(a.callCount).toBe(raw.calls.module.length);
        for (const c of a.calls) {
          expect(c && a.modules[c.module]).toBeTruthy();
          for (const t of [...(c?.inputs ?? []), ...(c?.outputs ?? [])]) {
            expect(t.dtype).not.toBe("?");
            expect(t.shape.length).toBe(t.stride.length);
          }
        }
        // a module's qualified name is its parent's plus its own, and paths are unique
        expect(new Set(a.modules.map((m) => m.path)).size).toBe(a.modules.length);
      });

      it("agrees with its totals", () => {
        const root = a.modules[0];
        expect(root?.params).toBe(a.totals.params);
        expect(root?.paramBytes).toBe(a.totals.param_bytes);
        if (a.status === "done") {
          // FLOPs of the top-level calls = total FLOPs; the peak is the timeline's maximum
          const top = a.calls.filter((c) => c && c.parent === -1);
          expect(top.reduce((s, c) => s + (c?.flops ?? 0), 0)).toBe(a.totals.flops);
          expect(aggregate(a)[0]?.flops).toBe(a.totals.flops);
          if (a.timeline.bytes.length) {
            expect(Math.max(...a.timeline.bytes)).toBe(a.totals.peak_bytes);
          }
        }
      });

      it("builds a tree that shows every module when fully open", () => {
        const tree = buildTree(a);
        const open = expandToDepth(tree, 99);
        for (const n of tree.nodes) for (const c of n.children) open.add(c.key);
        const rows = flatten(tree, { expanded: open });
        const modulesShown = rows.filter((r) => r.node.kind === "module").length;
        expect(modulesShown).toBe(a.modules.length);
      });
    });
  }
});
