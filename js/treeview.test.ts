import { describe, expect, it } from "vitest";
import { columnLayout, indentFor, splitType } from "./treeview";

const widths = (template: string): number[] => template.split(" ").map((x) => Number.parseInt(x, 10));

describe("columnLayout", () => {
  it("fills a wide table: numbers keep their widths, the rest is shared 2.4 : 1 : 1", () => {
    const l = columnLayout(1400);
    const w = widths(l.template);
    expect(l.hidden).toEqual([]);
    expect(w.slice(3)).toEqual([80, 98, 110, 104]);
    expect(w[1]).toBe(w[2]);
    expect(Math.abs((w[0] as number) / (w[1] as number) - 2.4)).toBeLessThan(0.02);
    expect(w.reduce((x, y) => x + y, 0)).toBeLessThanOrEqual(1400);
  });

  it("leaves out input shapes, then output shapes, before the table scrolls sideways", () => {
    expect(columnLayout(872).hidden).toEqual([]);
    const mid = columnLayout(800);
    expect(mid.hidden).toEqual(["inputs"]);
    expect(widths(mid.template)).toHaveLength(6);
    const narrow = columnLayout(700);
    expect(narrow.hidden).toEqual(["inputs", "outputs"]);
    expect(widths(narrow.template)).toEqual([308, 80, 98, 110, 104]);
  });

  it("leaves out Param mem, then Output mem, then FLOPs; never Params or Time (a notebook beside Lab's file browser)", () => {
    // ~560 px: a 900 px window with the file browser open
    const lab = columnLayout(560);
    expect(lab.hidden).toEqual(["inputs", "outputs", "paramBytes"]);
    expect(widths(lab.template)).toEqual([266, 80, 110, 104]);
    expect(lab.minWidth).toBeLessThanOrEqual(560);
    const narrower = columnLayout(480);
    expect(narrower.hidden).toEqual(["inputs", "outputs", "paramBytes", "activationBytes"]);
    expect(widths(narrower.template)).toEqual([296, 80, 104]);
    // with the Time column: Output mem goes first, Params and Time stay
    const timed = columnLayout(560, null, true);
    expect(timed.hidden).toEqual(["inputs", "outputs", "paramBytes", "activationBytes"]);
    expect(widths(timed.template)).toEqual([244, 80, 104, 132]);
    const timedNarrow = columnLayout(440, null, true);
    expect(timedNarrow.hidden).toEqual(["inputs", "outputs", "paramBytes", "activationBytes", "flops"]);
    expect(widths(timedNarrow.template)).toEqual([227, 80, 132]);
  });

  it("squeezes the module column to its floor before the table scrolls sideways", () => {
    expect(widths(columnLayout(280).template)).toEqual([200, 80]);
    const tiny = columnLayout(200);
    expect(tiny.minWidth).toBe(250);
    expect(widths(tiny.template)[0]).toBe(170); // never below its floor: scrolls instead
    expect(columnLayout(200, null, true).minWidth).toBe(382);
  });

  it("keeps the columns it shows while a scrollbar comes and goes", () => {
    const all = columnLayout(880);
    expect(all.hidden).toEqual([]);
    // 15 px less (a scrollbar): the columns stay, the module column gives the room
    const squeezed = columnLayout(865, all.hidden.length);
    expect(squeezed.hidden).toEqual([]);
    expect(widths(squeezed.template).reduce((x, y) => x + y, 0)).toBeLessThanOrEqual(865);
    // a fresh layout at that width would have left the input shapes out
    expect(columnLayout(865).hidden).toEqual(["inputs"]);
    // much narrower: they go after all
    expect(columnLayout(840, 0).hidden).toEqual(["inputs"]);
  });

  it("never gives a column less than its minimum", () => {
    for (let width = 300; width <= 2000; width += 7) {
      const l = columnLayout(width);
      const w = widths(l.template);
      expect(w[0]).toBeGreaterThanOrEqual(220);
      const shapes = 2 - l.hidden.filter((c) => c === "inputs" || c === "outputs").length;
      for (const x of w.slice(1, 1 + shapes)) expect(x).toBeGreaterThanOrEqual(130);
      if (width >= l.minWidth) expect(w.reduce((x, y) => x + y, 0)).toBeLessThanOrEqual(width);
    }
  });
});

describe("a narrow module column", () => {
  it("indents deep rows less", () => {
    expect(indentFor(300)).toBe(16);
    expect(indentFor(250)).toBe(12);
    expect(indentFor(210)).toBe(8);
    expect(indentFor(190)).toBe(6);
  });

  it("keeps a short class whole (all tail) and a long one's last words", () => {
    expect(splitType("LlamaRMSNorm")).toEqual(["", "LlamaRMSNorm"]);
    expect(splitType("2 × LlamaDecoderLayer")).toEqual(["2 × Llama", "DecoderLayer"]);
  });
});
