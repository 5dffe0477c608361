/**
 * The GPU's memory as the memory charts' budget line: the recorded training sample was timed on
 * an H100 (80 GB of HBM3: 80 GiB), the inference sample has no GPU and no line. The charts are
 * drawn by uPlot into a recording 2D context, so the test sees the dashed line and its label.
 */
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { MemoryChart } from "./barchart";
import type { MemoryBars } from "./bars";
import { axisTop, budgetInView, budgetLegend, gpuBudget, memoryText } from "./budget";
import { TimelineChart } from "./charts";
import { decodePayload } from "./decode";
import type { Analysis } from "./protocol";

const files = import.meta.glob<{ default: unknown }>("./fixtures/*.json", { eager: true });
const get = (name: string): Analysis => decodePayload(files[`./fixtures/${name}`]?.default) as Analysis;

const GIB = 2 ** 30;

describe("the budget of an analysis timed on a GPU", () => {
  it("is the GPU's memory, labelled with its name", () => {
    const b = gpuBudget(get("gpt2-tiny.training.json"));
    expect(b).toEqual({ bytes: 80 * GIB, label: "H100 80 GiB" });
    expect(gpuBudget(get("gpt2-tiny.json"))).toBeNull();
    expect(memoryText(141 * GIB)).toBe("141 GiB");
    expect(memoryText(23.5 * GIB)).toBe("23.5 GiB");
  });

  it("reaches the axis only when the numbers come within a quarter of it", () => {
    const b = { bytes: 80 * GIB, label: "H100 80 GiB" };
    expect(budgetInView(60 * GIB, b)).toBe(true);
    expect(axisTop(60 * GIB, b, 1.15)).toBeCloseTo(80 * GIB * 1.08);
    expect(axisTop(100 * GIB, b, 1.15)).toBeCloseTo(115 * GIB); // over the budget: the data's top
    expect(budgetInView(1 * GIB, b)).toBe(false);
    expect(axisTop(1 * GIB, b, 1.15)).toBeCloseTo(1.15 * GIB);
    expect(budgetLegend(60 * GIB, b)).toBe("H100 80 GiB (the GPU's memory)");
    expect(budgetLegend(0.8 * GIB, b)).toBe("H100 80 GiB: off the scale, the largest value here is 1 % of it");
  });
});

/** A 2D context that records what is drawn: dashed strokes and text. */
function recordingContext() {
  const log = { dashes: [] as number[][], lines: [] as number[][], texts: [] as string[] };
  let dash: number[] = [];
  let path: number[] = [];
  const ctx: Record<string, unknown> = {
    setLineDash: (d: number[]) => (dash = d),
    getLineDash: () => dash,
    beginPath: () => (path = []),
    moveTo: (x: number, y: number) => path.push(x, y),
    lineTo: (x: number, y: number) => path.push(x, y),
    stroke: () => {
      if (dash.length) {
        log.dashes.push(dash);
        log.lines.push(path.slice(0, 4));
      }
    },
    fillText: (t: string) => log.texts.push(t),
    measureText: (t: string) => ({ width: t.length * 6 }),
  };
  const proxy = new Proxy(ctx, {
    get: (target, key: string) => (key in target ? target[key] : () => undefined),
    set: (target, key: string, value) => {
      target[key] = value;
      return true;
    },
  });
  return { ctx: proxy, log };
}

describe("the budget line on the memory charts", () => {
  let recorded: ReturnType<typeof recordingContext>;
  const original = HTMLCanvasElement.prototype.getContext;
  const path2d = (globalThis as { Path2D?: unknown }).Path2D;
  beforeEach(() => {
    recorded = recordingContext();
    HTMLCanvasElement.prototype.getContext = (() => recorded.ctx) as unknown as typeof original;
    // jsdom has no Path2D: uPlot's series paths draw into one that does nothing
    (globalThis as { Path2D?: unknown }).Path2D = function Path2D() {
      return new Proxy({}, { get: () => () => undefined });
    };
  });
  afterEach(() => {
    HTMLCanvasElement.prototype.getContext = original;
    (globalThis as { Path2D?: unknown }).Path2D = path2d;
  });
  /** uPlot draws on the next microtask. */
  const drawn = (): Promise<void> => new Promise((resolve) => setTimeout(resolve, 0));

  const budget = { bytes: 80 * GIB, label: "H100 80 GiB" };
  const bars = (bytes: number[]): MemoryBars => ({
    modules: bytes.map((_, i) => i),
    labels: bytes.map((_, i) => `layer ${i}`),
    types: bytes.map(() => "Linear"),
    counts: bytes.map(() => 1),
    params: bytes,
    gradients: [],
    optimizer: [],
    activations: bytes.map(() => 0),
    tied: bytes.map(() => 0),
  });

  it("crosses the bars as a vertical dashed line labelled 'H100 80 GiB'", async () => {
    const parent = document.createElement("div");
    const chart = new MemoryChart(parent, () => undefined);
    chart.setData(bars([50 * GIB, 30 * GIB]), 800, budget);
    await drawn();
    expect(recorded.log.texts).toContain("H100 80 GiB");
    const line = recorded.log.lines.at(-1) as number[];
    expect(line[0]).toBe(line[2]); // x1 = x2: vertical
    expect(parent.querySelector(".mw-budget-item")?.textContent).toBe("H100 80 GiB (the GPU's memory)");
    chart.destroy();
  });

  it("is said in the legend, not drawn, far above small bars; absent without a GPU", async () => {
    const parent = document.createElement("div");
    const chart = new MemoryChart(parent, () => undefined);
    chart.setData(bars([2 ** 20]), 800, budget);
    await drawn();
    expect(recorded.log.texts).not.toContain("H100 80 GiB");
    expect(parent.querySelector(".mw-budget-item")?.textContent).toMatch(/^H100 80 GiB: off the scale/);
    chart.setData(bars([50 * GIB]), 800, null);
    expect(parent.querySelector(".mw-budget-item")).toBeNull();
    chart.destroy();
  });

  it("crosses the timeline as a horizontal line, above the constant band when it is left out", async () => {
    const a = get("gpt2-tiny.training.json");
    const parent = document.createElement("div");
    const chart = new TimelineChart(parent);
    const scaled = { ...a, timeline: { ...a.timeline, bytes: a.timeline.bytes.map((_, i) => (60 + (i % 5)) * GIB) } };
    chart.setData(scaled, 800, { bytes: 0, leftOut: false }, [], gpuBudget(a));
    await drawn();
    expect(recorded.log.texts).toContain("H100 80 GiB");
    const line = recorded.log.lines.at(-1) as number[];
    expect(line[1]).toBe(line[3]); // y1 = y2: horizontal
    const drawnAt = line[1] as number;
    // the constant 20 GiB left out: the line sits at 60 GiB on the axis, lower on the canvas
    recorded.log.lines.length = 0;
    chart.setData(scaled, 800, { bytes: 20 * GIB, leftOut: true }, [], gpuBudget(a));
    await drawn();
    expect((recorded.log.lines.at(-1) as number[])[1]).toBeGreaterThan(drawnAt);
    chart.destroy();
  });
});
