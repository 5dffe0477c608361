/**
 * The samples the Python side records (`python tests/make_fixtures.py` -> `js/fixtures/`) decode
 * to the numbers computed here by hand, and the streamed messages replay to the same calls as
 * the final payload. Any other `*.json` payload dropped in `js/fixtures/` gets the generic
 * consistency checks.
 */
import { describe, expect, it } from "vitest";
import { type Analysis, type StartMessage } from "./protocol";
import { applyCalls, decodeMessage, decodePayload, peakOwner } from "./decode";
import { aggregate, buildTree, expandToDepth, flatten, nodeName, nodeType } from "./tree";

const files = import.meta.glob<{ default: unknown }>("./fixtures/*.json", { eager: true });
/** A committed sample: missing is a failure (run `python tests/make_fixtures.py`), not a skip. */
const get = (name: string): unknown => {
  const file = files[`./fixtures/${name}`];
  if (file === undefined) throw new Error(`js/fixtures/${name} is missing: run python tests/make_fixtures.py`);
  return file.default;
};
const payloads = Object.entries(files).filter(
  ([, m]) => typeof m.default === "object" && m.default !== null && "modules" in m.default,
);

const byPath = (a: Analysis, path: string): number => a.modules.findIndex((m) => m.path === path);

describe("gpt2-tiny sample", () => {
  // GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64), input (1, 8)
  const a = decodePayload(get("gpt2-tiny.json")) as Analysis;
  const aggs = aggregate(a);

  it("has GPT-2's 34 modules and 30,720 parameters", () => {
    // root, transformer, wte, wpe, drop, h, 2 × 13 per block, ln_f, lm_head
    expect(a.modules).toHaveLength(34);
    expect(a.title).toBe("GPT2LMHeadModel");
    // wte 100·32 + wpe 64·32 + 2 blocks × 12,704 + ln_f 64 (lm_head is tied to wte)
    expect(a.modules[0]?.params).toBe(3200 + 2048 + 2 * 12704 + 64);
    expect(a.modules[byPath(a, "transformer.h.1")]?.params).toBe(
      64 + (32 * 96 + 96) + (32 * 32 + 32) + 64 + (32 * 128 + 128) + (128 * 32 + 32),
    );
  });

  it("counts the FLOPs of each matmul", () => {
    const c_fc = byPath(a, "transformer.h.0.mlp.c_fc");
    expect(aggs[c_fc]?.flops).toBe(2 * 8 * 32 * 128);
    expect(aggs[byPath(a, "lm_head")]?.flops).toBe(2 * 8 * 32 * 100);
    // per block: c_attn + q·kᵀ + att·v + c_proj + c_fc + mlp.c_proj
    const block = 2 * 8 * 32 * 96 + 2 * 2 * 8 * 8 * 16 * 2 + 2 * 8 * 32 * 32 + 2 * 2 * 8 * 32 * 128;
    expect(aggs[byPath(a, "transformer.h.1")]?.flops).toBe(block);
    expect(aggs[0]?.flops).toBe(2 * block + 2 * 8 * 32 * 100);
    expect(a.totals.flops).toBe(2 * block + 2 * 8 * 32 * 100);
  });

  it("records shapes: the input ids and the logits", () => {
    const root = a.calls[a.modules[0]?.calls[0] as number];
    expect(root?.inputs[0]?.shape).toEqual([1, 8]);
    expect(root?.outputs.find((t) => t.name === "logits")?.shape).toEqual([1, 8, 100]);
  });

  it("folds the two identical blocks", () => {
    const tree = buildTree(a);
    const h = tree.nodes[byPath(a, "transformer.h")];
    expect(h?.children).toHaveLength(1);
    const g = h?.children[0];
    expect(g && nodeName(tree, g)).toBe("0–1");
    expect(g && nodeType(tree, g)).toBe("2 × GPT2Block");
  });

  it(
    "replays its streamed messages to the same calls",
    () => {
      const msgs = get("gpt2-tiny.messages.json") as unknown[];
      const start = decodeMessage(msgs[0]) as StartMessage;
      expect(start.type).toBe("start");
      const live = start.payload as Analysis;
      expect(live.modules.map((m) => m.path)).toEqual(a.modules.map((m) => m.path));
      let batches = 0;
      for (const raw of msgs.slice(1)) {
        const m = decodeMessage(raw);
        expect(m).not.toBeNull();
        if (m?.type === "calls") {
          applyCalls(live, m);
          batches += 1;
        }
      }
      expect(batches).toBeGreaterThan(1);
      expect(decodeMessage(msgs[msgs.length - 1])?.type).toBe("done");
      expect(live.callCount).toBe(a.callCount);
      expect(live.calls).toEqual(a.calls);
      expect(live.modules.map((m) => m.calls)).toEqual(a.modules.map((m) => m.calls));
    },
  );
});

describe("gpt2-tiny training sample", () => {
  const a = decodePayload(get("gpt2-tiny.training.json")) as Analysis;
  const aggs = aggregate(a);

  it("credits each module the backward of what it computed", () => {
    expect(a.mode).toBe("training");
    const c_fc = aggs[byPath(a, "transformer.h.0.mlp.c_fc")];
    // forward x·W; backward: grad of the input and of the weight, two matmuls of the same size
    expect(c_fc?.backwardFlops).toBe(2 * 2 * 8 * 32 * 128);
    expect(c_fc?.flops).toBe(3 * 2 * 8 * 32 * 128);
    // the step's FLOPs are the root's forward and backward: nothing left unattributed
    expect(aggs[0]?.flops).toBe(a.totals.flops);
    expect(aggs[0]?.backwardFlops).toBeGreaterThan(aggs[0]?.flops ? aggs[0].flops / 2 : 0);
  });

  it("says whose the peak is: a module, the backward of one, or the optimizer step", () => {
    const at = (phase: string, call: number, module: string): string =>
      peakOwner({
        ...a,
        memory: { ...a.memory, peakPhase: phase },
        peak: { bytes: 1, call, module, op: "aten.mm" },
      });
    expect(at("forward", 3, "transformer.wte")).toBe("transformer.wte");
    expect(at("backward", 3, "transformer.ln_f")).toBe("the backward of transformer.ln_f");
    expect(at("backward", 0, "")).toBe("the backward of GPT2LMHeadModel");
    expect(at("optimizer", -1, "")).toBe("the optimizer step");
    expect(at("forward", -1, "")).toBe("outside any module");
  });
});

describe("failing sample", () => {
  // Failing("shape"): pre Linear(4, 4), inner.block.proj Linear(5, 4) fed 4 features, post
  const a = decodePayload(get("failing.json")) as Analysis;

  it("explains the error where it happened", () => {
    expect(a.status).toBe("error");
    expect(a.error?.type).toBe("RuntimeError");
    expect(a.error?.module).toBe("inner.block.proj");
    const call = a.calls[a.error?.call ?? -1];
    expect(call && a.modules[call.module]?.path).toBe("inner.block.proj");
    expect(call?.error).toBe(true);
    expect(a.modules[0]?.params).toBe(20 + 24 + 20);
  });

  it("keeps what ran before the failure", () => {
    const aggs = aggregate(a);
    expect(aggs[byPath(a, "pre")]?.flops).toBe(2 * 2 * 4 * 4);
    expect(aggs[byPath(a, "post")]?.calls).toBe(0);
  });
});

describe("every recorded payload", () => {
  it("includes the committed samples", () => {
    const names = payloads.map(([file]) => file);
    for (const name of ["gpt2-tiny.json", "gpt2-tiny.training.json", "failing.json"]) {
      expect(names).toContain(`./fixtures/${name}`);
    }
  });

  for (const [file, mod] of payloads) {
    describe(file, () => {
      const a = decodePayload(mod.default) as Analysis;
      const raw = mod.default as { modules: { name: unknown[] }; calls: { module: unknown[] } };

      it("decodes every module and call", () => {
        expect(a.modules).toHaveLength(raw.modules.name.length);
        expect(a.callCount).toBe(raw.calls.module.length);
        for (const c of a.calls) {
          expect(c && a.modules[c.module]).toBeTruthy();
          for (const t of [...(c?.inputs ?? []), ...(c?.outputs ?? [])]) {
            expect(t.dtype).not.toBe("?");
            expect(t.shape.length).toBe(t.stride.length);
          }
        }
        expect(new Set(a.modules.map((m) => m.path)).size).toBe(a.modules.length);
      });

      it("agrees with its totals", () => {
        expect(a.modules[0]?.params).toBe(a.totals.params);
        // under FSDP or TP the tree counts the model, the totals and memory.modules one rank
        const rank = a.memory.modules.paramBytes;
        expect(rank.length ? rank[0] : a.modules[0]?.paramBytes).toBe(a.totals.param_bytes);
        if (a.status === "done") {
          const top = a.calls.filter((c) => c && c.parent === -1);
          // a training step's total holds the backward of every call too
          const step = top.reduce((s, c) => s + (c?.flops ?? 0) + (c?.backwardFlops ?? 0), 0);
          expect(step).toBe(a.totals.flops);
          if (a.timeline.bytes.length) {
            expect(Math.max(...a.timeline.bytes)).toBe(a.totals.peak_bytes);
          }
        }
      });

      it("shows every module when fully open", () => {
        const tree = buildTree(a);
        const open = expandToDepth(tree, 99, true);
        for (const n of tree.nodes) {
          open.add(n.key); // every module, later members of folded groups included
          for (const c of n.children) open.add(c.key);
        }
        const rows = flatten(tree, { expanded: open });
        expect(rows.filter((r) => r.node.kind === "module")).toHaveLength(a.modules.length);
      });
    });
  }
});
