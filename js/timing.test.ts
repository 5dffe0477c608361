/**
 * The step time on a GPU (`analyze(..., gpu="H100")`): the recorded training sample carries it
 * (timed on an H100), the inference sample does not; the header shows it as text.
 */
import { describe, expect, it } from "vitest";
import { decodePayload } from "./decode";
import { formatBytes } from "./format";
import { Header } from "./header";
import type { Analysis } from "./protocol";
import { decodeTime, formatPercent, formatSeconds, stepText, stepTitle } from "./timing";

const files = import.meta.glob<{ default: unknown }>("./fixtures/*.json", { eager: true });
const get = (name: string): Record<string, unknown> => {
  const file = files[`./fixtures/${name}`];
  if (file === undefined) throw new Error(`js/fixtures/${name} is missing: run python tests/make_fixtures.py`);
  return file.default as Record<string, unknown>;
};

describe("the step time in the payload", () => {
  const raw = get("gpt2-tiny.training.json");
  const a = decodePayload(raw) as Analysis;
  const wire = raw.time as Record<string, unknown> & { modules: { time_s: number[]; bound: string[] } };

  it("decodes the GPU, its memory and the step's numbers as sent", () => {
    expect(a.time?.gpu).toBe("H100");
    expect(a.time?.memoryBytes).toBe(80 * 2 ** 30); // H100 SXM: 80 GB of HBM3
    expect(a.time?.stepS).toBe(wire.step_s);
    expect(a.time?.mfu).toBe(wire.mfu);
    expect(a.time?.hfu).toBe(wire.hfu);
    expect(a.time?.stepS).toBeGreaterThan(0);
  });

  it("has a time and a bound per module row, the root's no more than the step", () => {
    const t = a.time!;
    expect(t.moduleS).toHaveLength(a.modules.length);
    expect(t.bound).toHaveLength(a.modules.length);
    expect(t.moduleS[0]).toBeLessThanOrEqual(t.stepS);
    for (const b of t.bound) expect(["compute", "memory", "comm", ""]).toContain(b);
  });

  it("is absent without gpu=, and from malformed objects", () => {
    expect((decodePayload(get("gpt2-tiny.json")) as Analysis).time).toBeUndefined();
    expect(decodeTime(null)).toBeUndefined();
    expect(decodeTime({ step_s: 1 })).toBeUndefined();
    expect(decodeTime({ gpu: "X", step_s: "junk" })?.stepS).toBe(0);
  });

  it("reads an older payload's MFU as its HFU (no recomputation was told apart then)", () => {
    expect(decodeTime({ gpu: "X", mfu: 0.25 })?.hfu).toBe(0.25);
    expect(decodeTime({ gpu: "X", mfu: 0.25, hfu: 0.33 })?.hfu).toBe(0.33);
  });
});

describe("the step time in the header", () => {
  const time = {
    gpu: "H100",
    memoryBytes: 80 * 2 ** 30,
    stepS: 0.67,
    forwardS: 0.2,
    backwardS: 0.4,
    optimizerS: 0.07,
    commS: 0,
    bubbleS: 0,
    mfu: 0.31,
    hfu: 0.31,
    tokensPerS: 12_000,
    moduleS: [],
    bound: [],
  };

  it("says the HFU in the tooltip only where the recomputation makes it differ", () => {
    expect(stepTitle(time)).not.toContain("HFU");
    expect(stepTitle({ ...time, hfu: 0.4 })).toContain("HFU 40% with the recomputation");
  });

  it("says a pipeline rank's wait in the bubble in the tooltip, and nothing of it without one", () => {
    expect(stepTitle(time)).not.toContain("bubble");
    expect(decodeTime({ gpu: "X" })?.bubbleS).toBe(0); // older payloads: none
    expect(decodeTime({ gpu: "X", bubble_s: 0.2 })?.bubbleS).toBe(0.2);
    expect(stepTitle({ ...time, bubbleS: 0.2 })).toContain("waiting in the pipeline's bubble 0.20 s");
  });

  it("formats seconds and percentages", () => {
    expect(stepText(time)).toBe("0.67 s · MFU 31% on H100");
    expect(formatSeconds(0.0123)).toBe("12.3 ms");
    expect(formatSeconds(4.5e-5)).toBe("45 µs");
    expect(formatPercent(0.0004)).toBe("0.04%");
  });

  it("shows 'step 0.67 s · MFU 31% on H100' when the payload has a time, as text", () => {
    const a = decodePayload(get("gpt2-tiny.training.json")) as Analysis;
    a.time = { ...time, gpu: "<b>H100</b>" };
    const header = new Header();
    header.render(a, undefined, { label: "params", bytes: 0 });
    expect(header.el.textContent).toContain("step0.67 s · MFU 31% on <b>H100</b>");
    expect(header.el.querySelector("b")).toBeNull();
  });

  it("shows what the GPU holds beside the peak, with what its parts are, and not without a time", () => {
    const a = decodePayload(get("gpt2-tiny.training.json")) as Analysis;
    const m = a.memory;
    expect(m.deviceBytes).toBeGreaterThan(m.reservedBytes);
    expect(m.reservedBytes).toBeGreaterThanOrEqual(a.totals.peak_bytes);
    const header = new Header();
    header.render(a, undefined, { label: "params", bytes: 0 });
    const item = [...header.el.querySelectorAll<HTMLElement>("[title]")].find((e) => e.textContent!.startsWith("on the H100"))!;
    expect(item.textContent).toBe(`on the H100${formatBytes(m.deviceBytes)}`);
    expect(item.title).toContain(`caching allocator reserved ${formatBytes(m.reservedBytes)}`);
    expect(item.title).toContain(`${formatBytes(m.deviceBytes - m.reservedBytes)} outside it (the CUDA context`);
    delete a.time;
    header.render(a, undefined, { label: "params", bytes: 0 });
    expect(header.el.textContent).not.toContain("on the H100");
  });

  it("shows no step without a time", () => {
    const header = new Header();
    header.render(decodePayload(get("gpt2-tiny.json")) as Analysis, undefined, { label: "params", bytes: 0 });
    expect(header.el.textContent).not.toContain("MFU");
  });
});
