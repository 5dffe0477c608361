import { describe, expect, it } from "vitest";
import { type Analysis, type CallsMessage, type StartMessage } from "./protocol";
import { applyCalls, decode, decodeMessage, decodePayload } from "./decode";
import { tiny } from "./testdata";

describe("decodePayload", () => {
  const a = decodePayload(tiny().payload) as Analysis;

  it("rebuilds modules with paths, depths and children", () => {
    expect(a.modules).toHaveLength(13);
    expect(a.modules[0]?.path).toBe("");
    expect(a.modules[4]?.path).toBe("layers.0.fc");
    expect(a.modules[4]?.depth).toBe(3);
    expect(a.modules[10]?.path).toBe("layers.2.fc");
    expect(a.modules[2]?.children).toEqual([3, 6, 9]);
    expect(a.modules[0]?.children).toEqual([1, 2, 12]);
    expect(a.modules[12]?.type).toBe("Linear");
    expect(a.modules[12]?.paramBytes).toBe(360);
  });

  it("resolves tensors through the dictionaries", () => {
    expect(a.modules[12]?.ownParams).toEqual([
      { name: "weight", shape: [10, 8], dtype: "torch.float32", stride: [8, 1], requiresGrad: true },
      { name: "bias", shape: [10], dtype: "torch.float32", stride: [1], requiresGrad: true },
    ]);
    expect(a.calls[0]?.inputs).toEqual([
      { name: "args[0]", shape: [1, 4], dtype: "torch.int64", stride: [4, 1], requiresGrad: false },
    ]);
    expect(a.calls[0]?.outputs[0]?.name).toBe("logits");
    expect(a.calls[3]?.ops).toEqual([{ op: "aten.addmm", flops: 512 }]);
  });

  it("registers calls with their modules and reads the rest", () => {
    expect(a.callCount).toBe(12);
    expect(a.modules[12]?.calls).toEqual([11]);
    expect(a.modules[2]?.calls).toEqual([]);
    expect(a.calls[6]?.module).toBe(7);
    expect(a.timeline.op[4]).toBe("free");
    expect(a.timeline.bytes[3]).toBe(5000);
    expect(a.timeline.categories).toEqual({}); // an older kernel's payload: no category series
    expect(a.peak).toEqual({ bytes: 5000, call: 11, module: "head", op: "aten.addmm" });
    expect(a.totals.flops).toBe(2176);
    expect(a.notes).toEqual(["Dropout is a no-op in inference mode."]);
    expect(a.status).toBe("done");
    expect(a.error).toBeNull();
  });

  it("reads the error object and the failing calls", () => {
    const e = decodePayload(tiny({ error: true }).payload) as Analysis;
    expect(e.status).toBe("error");
    expect(e.error?.module).toBe("layers.1.fc");
    expect(e.error?.call).toBe(6);
    expect(e.error?.line).toBe(42);
    expect(e.calls[6]?.error).toBe(true);
    expect(e.calls[7]?.error).toBe(false);
  });

  it("reads assumptions and the assumed column (absent: none)", () => {
    expect(a.assumptions).toEqual([]);
    expect(a.calls.every((c) => c?.assumed === false)).toBe(true);
    const b = decodePayload(tiny({ assume: true }).payload) as Analysis;
    expect(b.calls.map((c, j) => (c?.assumed ? j : -1)).filter((j) => j >= 0)).toEqual([6]);
    expect(b.assumptions).toEqual([
      {
        kind: "truth",
        op: "aten.is_nonzero",
        value: "True",
        module: "layers.1.fc",
        call: 6,
        file: "model.py",
        line: 17,
        code: "if mask.all():",
        count: 1,
        site: "model.py:17",
        stack: [],
      },
    ]);
  });

  it("gives null for an empty trait and junk", () => {
    expect(decodePayload({})).toBeNull();
    expect(decodePayload(null)).toBeNull();
    expect(decodePayload("x")).toBeNull();
    expect(decode({})).toBeNull();
  });

  it("tolerates missing columns", () => {
    const b = decodePayload({ strings: ["", "M"], modules: { name: [0], type: [1], parent: [-1] } });
    expect(b?.modules[0]?.type).toBe("M");
    expect(b?.modules[0]?.params).toBe(0);
    expect(b?.calls).toEqual([]);
  });
});

describe("messages", () => {
  it("decodes done, error and unknown messages", () => {
    expect(decodeMessage({ type: "done", elapsed_s: 1.5 })).toEqual({ type: "done", elapsedS: 1.5 });
    expect(decodeMessage({ type: "phase", phase: "backward" })).toEqual({ type: "phase", phase: "backward" });
    expect(decodeMessage({ type: "phase" })).toBeNull();
    expect(decodeMessage({ type: "bogus" })).toBeNull();
    expect(decodeMessage({ type: "error", error: { type: "ValueError", message: "m" } })).toMatchObject({
      type: "error",
      error: { type: "ValueError", message: "m", call: -1 },
    });
    expect(decode({ type: "done", elapsed_s: 2 })).toEqual({ type: "done", elapsedS: 2 });
  });

  it("streams calls in post-order to the same analysis as the final payload", () => {
    const fx = tiny();
    const start = decodeMessage(fx.messages[0]) as StartMessage;
    expect(start.type).toBe("start");
    expect(start.expectedCalls).toBe(12);
    const a = start.payload as Analysis;
    expect(a.status).toBe("running");
    expect(a.callCount).toBe(0);
    expect(a.modules).toHaveLength(13);

    const first = decodeMessage(fx.messages[1]) as CallsMessage;
    // post-order: embed, layers.0.fc, layers.0.act, layers.0, layers.1.fc
    expect(first.calls.index).toEqual([1, 3, 4, 2, 6]);
    // the batch brings the dictionary entries that were new (op names, calls' tensors)
    expect(first.strings).toContain("aten.addmm");
    applyCalls(a, first);
    expect(a.callCount).toBe(5);
    expect(a.calls[0]).toBeUndefined();
    expect(a.calls[6]?.module).toBe(7);
    expect(a.calls[6]?.ops).toEqual([{ op: "aten.addmm", flops: 512 }]);
    expect(a.modules[3]?.calls).toEqual([2]);

    const second = decodeMessage(fx.messages[2]) as CallsMessage;
    // ids in this batch continue after the first batch's
    expect(second.calls.index).toEqual([7, 5, 9, 10, 8, 11, 0]);
    applyCalls(a, second);
    expect(a.callCount).toBe(12);

    const full = decodePayload(fx.payload) as Analysis;
    expect(a.calls).toEqual(full.calls);
    expect(a.modules.map((m) => m.calls)).toEqual(full.modules.map((m) => m.calls));
  });

  it("keeps a module's calls in start order when they arrive out of order", () => {
    const fx = tiny({ twice: true });
    const a = (decodeMessage(fx.messages[0]) as StartMessage).payload as Analysis;
    for (const m of fx.messages.slice(1)) {
      const msg = decodeMessage(m);
      if (msg?.type === "calls") applyCalls(a, msg);
    }
    expect(a.modules[12]?.calls).toEqual([11, 12]);
    expect(a.callCount).toBe(13);
  });
});
