/**
 * The Stages tab, from the recorded pipeline sample (`tests/make_fixtures.py`: a 4-layer tiny
 * Llama on two pipeline ranks, 1F1B over four micro-batches, on an H100). The schedule's truth
 * is worked out by hand: 1F1B with P ranks and m micro-batches takes m + P - 1 rounds of a
 * forward and a backward, 2 (m + P - 1) = 10 slots, and each rank works 2 m = 8 of them, a
 * bubble of (P - 1) / (m + P - 1) = 20 %.
 */
import { afterEach, describe, expect, it } from "vitest";
import pipeline from "./fixtures/pipeline-llama.json";
import { decodePayload } from "./decode";
import type { Analysis } from "./protocol";
import { decodeStages, formatShare, moduleSummary, StagesView } from "./stages";
import { tiny } from "./testdata";
import { mount, type WidgetModel } from "./widget";
import { fakeModel } from "./testmodel";

const a = decodePayload(pipeline) as Analysis;

let host: HTMLElement | null = null;
afterEach(() => host?.remove());

function draw(analysis: Analysis, width = 900): StagesView {
  const view = new StagesView();
  host = document.createElement("div");
  host.append(view.el);
  document.body.append(host);
  view.render(analysis, width);
  return view;
}

const texts = (el: ParentNode, sel: string): string[] =>
  [...el.querySelectorAll<HTMLElement>(sel)].map((e) => e.textContent ?? "");

describe("a pipeline's stages", () => {
  it("decode with every rank, its actions in their slots and its collectives", () => {
    const s = a.stages;
    expect(s).toBeDefined();
    if (!s) return;
    expect([s.pp, s.schedule, s.microbatches, s.virtualStages]).toEqual([2, "1F1B", 4, 1]);
    expect(s.slots).toBe(2 * (4 + 2 - 1));
    expect(s.ranks.map((r) => r.stages)).toEqual([[0], [1]]);
    for (const r of s.ranks) {
      expect(r.actions).toHaveLength(2 * 4); // a forward and a backward per micro-batch
      expect(r.bubble).toBeCloseTo((2 - 1) / (4 + 2 - 1), 12);
      const slots = r.actions.map((x) => x.slot);
      expect(slots).toEqual([...slots].sort((x, y) => x - y)); // in the order they ran
      expect(new Set(slots).size).toBe(slots.length); // one action a slot
    }
    // 1F1B on the last stage: forward and backward alternate
    expect(s.ranks[1]?.actions.map((x) => `${x.kind}${x.microbatch}`)).toEqual(["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]);
    // a forward waits for the previous stage's forward of its micro-batch
    const f0 = s.ranks[0]?.actions.find((x) => x.kind === "F" && x.microbatch === 0);
    const g0 = s.ranks[1]?.actions.find((x) => x.kind === "F" && x.microbatch === 0);
    expect((g0?.slot ?? 0) > (f0?.slot ?? 0)).toBe(true);
    // the analysis is the rank with the highest peak; the categories add up to each peak
    const peaks = s.ranks.map((r) => r.peakBytes);
    expect(s.ranks[s.shown]?.peakBytes).toBe(Math.max(...peaks));
    expect(a.totals.peak_bytes).toBe(Math.max(...peaks));
    for (const r of s.ranks) {
      expect(Object.values(r.categories).reduce((x, y) => x + y, 0)).toBe(r.peakBytes);
    }
    // each rank sends one activation (or gradient) per micro-batch and receives as many
    for (const r of s.ranks) {
      const pp = r.comms.filter((c) => c.group === "pp");
      expect(pp.map((c) => [c.collective, c.calls])).toEqual(
        r.rank === 0
          ? [["send", 4], ["recv", 4]]
          : [["recv", 4], ["send", 4]],
      );
      expect(pp.find((c) => c.collective === "send")?.bytes).toBe(r.sendBytes);
    }
  });

  it("is absent from a payload without a pipeline, and junk decodes to nothing", () => {
    expect(decodePayload(tiny().payload)?.stages).toBeUndefined();
    expect(decodeStages(undefined)).toBeUndefined();
    expect(decodeStages({ ranks: "x" })).toBeUndefined();
    const s = decodeStages({ ranks: [{ rank: 0, actions: [["X", 0, 0], ["F", 0, 1]], slots: [0, 3] }] });
    expect(s?.ranks[0]?.actions).toEqual([{ kind: "F", stage: 0, microbatch: 1, slot: 3 }]);
  });

  it("says which modules a rank holds in a few words", () => {
    expect(moduleSummary(["model.embed_tokens", "model.layers.0", "model.layers.1"])).toBe("embed_tokens, layers 0–1");
    expect(moduleSummary(["model.layers.2", "model.layers.3", "model.norm", "lm_head"])).toBe("layers 2–3, norm, lm_head");
    expect(moduleSummary(["model.layers.0", "model.layers.4"])).toBe("layers 0, layers 4");
    expect(formatShare(0.2)).toBe("20 %");
    expect(formatShare(1 / 24)).toBe("4.2 %");
    expect(formatShare(0)).toBe("0 %");
  });

  it("draws each rank's peak, the highest marked, and its schedule with the bubble written", () => {
    const view = draw(a);
    const el = view.el;
    expect(el.querySelectorAll(".mw-stage-peak-row")).toHaveLength(2);
    expect(el.querySelectorAll(".mw-stage-sched-row")).toHaveLength(2);
    const worst = el.querySelectorAll<HTMLElement>(".mw-stage-worst");
    expect(worst).toHaveLength(1);
    expect(worst[0]?.dataset.rank).toBe(String(a.stages?.shown));
    expect(texts(el, ".mw-stage-bubble")).toEqual(["bubble 20 %", "bubble 20 %"]);
    // every action a box, in its slot: 8 per rank, at slot / 10 of the track
    const boxes = [...el.querySelectorAll<HTMLElement>('.mw-stage-sched-row[data-rank="1"] .mw-stage-act')];
    expect(boxes.map((b) => b.style.left)).toEqual(["10%", "20%", "30%", "40%", "50%", "60%", "70%", "80%"]);
    expect(texts(el, '.mw-stage-sched-row[data-rank="1"] .mw-stage-act-text')).toEqual(["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]);
    // the budget: an H100's 80 GiB, far off the scale of a tiny model's peaks
    expect(el.querySelector(".mw-stage-budget")).toBeNull();
    expect(el.querySelector(".mw-stage-peaks .mw-stage-legend")?.textContent).toContain("H100 80 GiB: off the scale");
    // a narrow panel: numbers only in the boxes, then nothing
    view.render(a, 440);
    expect(texts(el, '.mw-stage-sched-row[data-rank="1"] .mw-stage-act-text')).toEqual(["0", "0", "1", "1", "2", "2", "3", "3"]);
  });

  it("draws the budget line when the peaks come near the GPU's memory", () => {
    const near = decodePayload(pipeline) as Analysis;
    if (!near.time || !near.stages) throw new Error("the sample is timed and has stages");
    near.time = { ...near.time, memoryBytes: 600_000 };
    const el = draw(near).el;
    const lines = el.querySelectorAll<HTMLElement>(".mw-stage-budget");
    expect(lines).toHaveLength(2); // one across each rank's track
    const left = Number.parseFloat(lines[0]?.style.left ?? "");
    const bar = Number.parseFloat(el.querySelector<HTMLElement>(".mw-stage-worst .mw-stage-bar")?.style.width ?? "");
    expect(left / bar).toBeCloseTo(600_000 / (near.stages.ranks[near.stages.shown]?.peakBytes ?? 1), 6);
  });

  it("shows the collectives per mesh dimension of the rank clicked", () => {
    const el = draw(a).el;
    const heading = () => el.querySelector(".mw-stage-comms .mw-stage-heading")?.textContent;
    expect(heading()).toContain(`pipeline rank ${a.stages?.shown}`);
    const rows = () => [...el.querySelectorAll(".mw-stage-comms-table tr")].slice(1).map((r) => texts(r, "td"));
    expect(rows()).toEqual([
      ["pp", "send", "4", "8.00 KiB"],
      ["pp", "recv", "4", "8.00 KiB"],
    ]);
    (el.querySelector('.mw-stage-table tr[data-rank="1"]') as HTMLElement).click();
    expect(heading()).toContain("pipeline rank 1");
    expect(rows()[0]?.slice(0, 2)).toEqual(["pp", "recv"]);
  });

  it("is a tab of the widget only when the analysis has stages", () => {
    for (const [payload, shown] of [
      [pipeline, true],
      [tiny().payload, false],
    ] as const) {
      const el = document.createElement("div");
      document.body.append(el);
      const { app } = mount(fakeModel(payload) as unknown as WidgetModel, el);
      app.render();
      const button = el.querySelector<HTMLElement>('.mw-tab[data-tab="stages"]');
      expect(button?.style.display !== "none").toBe(shown);
      if (shown) {
        button?.click();
        app.render();
        expect(el.querySelectorAll(".mw-stage-peak-row")).toHaveLength(2);
        expect(el.querySelector<HTMLElement>(".mw-stages")?.style.display).toBe("");
      }
      el.remove();
    }
  });
});
