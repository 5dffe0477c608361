import { describe, expect, it } from "vitest";
import training from "./fixtures/gpt2-tiny.training.json";
import inference from "./fixtures/gpt2-tiny.json";
import { type Analysis } from "./protocol";
import { decodePayload } from "./decode";
import { STATIC_BAND, stackTimeline } from "./stack";

const decode = (raw: unknown): Analysis => decodePayload(raw) as Analysis;

describe("stackTimeline", () => {
  for (const [name, raw] of [["inference", inference], ["training", training]] as const) {
    it(`${name}: the top band is the live-bytes line at every point, bands in order`, () => {
      const a = decode(raw);
      const n = a.timeline.bytes.length;
      expect(n).toBeGreaterThan(2);
      const bands = stackTimeline(a.timeline.categories, n, false);
      expect(bands[0]?.name).toBe(STATIC_BAND);
      expect(bands.map((b) => b.name)).toContain("activations");
      expect(bands[bands.length - 1]?.top).toEqual(a.timeline.bytes);
      for (let k = 1; k < bands.length; k++) {
        for (let i = 0; i < n; i++) expect(bands[k]!.top[i]).toBe(bands[k - 1]!.top[i]! + bands[k]!.values[i]!);
      }
      if (name === "training") {
        expect(bands.map((b) => b.name)).toEqual(
          expect.arrayContaining(["gradients", "optimizer state", "activations"]),
        );
      }
    });
  }

  it("leaving the constant band out lowers every point by it", () => {
    const a = decode(training);
    const n = a.timeline.bytes.length;
    const t = a.totals;
    const base = t.param_bytes + t.buffer_bytes + t.input_bytes;
    const bands = stackTimeline(a.timeline.categories, n, true);
    expect(bands.map((b) => b.name)).not.toContain(STATIC_BAND);
    expect(bands[bands.length - 1]?.top).toEqual(a.timeline.bytes.map((b) => b - base));
  });

  it("at the peak the bands are the peak's categories", () => {
    const a = decode(training);
    const n = a.timeline.bytes.length;
    const peak = a.timeline.bytes.indexOf(Math.max(...a.timeline.bytes));
    const bands = stackTimeline(a.timeline.categories, n, false);
    for (const b of bands.filter((x) => x.name !== STATIC_BAND)) {
      expect(b.values[peak]).toBe(a.memory.categories[b.name]);
    }
  });

  it("another precision: constant bands replaced, the rest scaled", () => {
    const bands = stackTimeline({ parameters: [10, 10], activations: [4, 8] }, 2, false, {
      staticBytes: { parameters: 5 },
      actScale: 0.5,
    });
    expect(bands.map((b) => b.top)).toEqual([[5, 5], [7, 9]]);
    expect(stackTimeline({}, 3, false)).toEqual([]);
  });
});
