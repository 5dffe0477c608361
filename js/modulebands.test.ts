import { describe, expect, it } from "vitest";
import inference from "./fixtures/gpt2-tiny.json";
import training from "./fixtures/gpt2-tiny.training.json";
import { moduleRuns } from "./modulebands";
import { type Analysis } from "./protocol";
import { decodePayload } from "./decode";

describe("moduleRuns", () => {
  for (const [label, raw] of [["inference", inference], ["training", training]] as const) {
    it(`${label}: the blocks of a GPT-2, contiguous runs covering the timeline`, () => {
      const a = decodePayload(raw) as Analysis;
      const runs = moduleRuns(a);
      const names = new Set(runs.map((r) => r.name));
      expect(names.has("h.0") && names.has("h.1")).toBe(true);
      expect(runs[0]?.start).toBe(0);
      expect(runs[runs.length - 1]?.end).toBe(a.timeline.bytes.length);
      for (let k = 1; k < runs.length; k++) {
        expect(runs[k]?.start).toBe(runs[k - 1]?.end);
        expect(runs[k]?.name).not.toBe(runs[k - 1]?.name);
      }
    });
  }
});
