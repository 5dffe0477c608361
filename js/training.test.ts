import { afterEach, describe, expect, it, vi } from "vitest";
import { categorySegments, phaseSpans, renderCategoryBar } from "./charts";
import { checkpointProblems } from "./checkpoint";
import { type Analysis } from "./protocol";
import { decodePayload } from "./decode";
import { mount, type WidgetModel } from "./widget";
import { fakeModel as standaloneModel } from "./standalone";
import { tiny } from "./testdata";
import { fakeModel } from "./testmodel";

const CATS = {
  parameters: 4424,
  buffers: 0,
  inputs: 128,
  gradients: 4424,
  "optimizer state": 8848,
  activations: 2000,
  temporaries: 1000,
};

/** The tiny payload as a training run: 3 forward, 2 backward, 2 optimizer events. */
function training(extra: Record<string, unknown> = {}): Record<string, unknown> {
  const p = structuredClone(tiny().payload) as Record<string, unknown> & { strings: string[] };
  const sid = (s: string): number => {
    const i = p.strings.indexOf(s);
    if (i >= 0) return i;
    p.strings.push(s);
    return p.strings.length - 1;
  };
  const phases = ["forward", "forward", "forward", "backward", "backward", "optimizer", "optimizer"];
  p.mode = "training";
  p.timeline = {
    bytes: [100, 200, 300, 250, 400, 900, 700],
    call: phases.map(() => -1),
    op: phases.map(() => sid("aten.mm")),
    phase: phases.map(sid),
  };
  p.memory = {
    categories: CATS,
    phases: { forward: 0, backward: 3, optimizer: 5 },
    peak_phase: "optimizer",
    gradient_bytes: 4424,
    optimizer_state_bytes: 8848,
    optimizer_host_bytes: 0,
  };
  return { ...p, ...extra };
}

let el: HTMLElement;
afterEach(() => el?.remove());

function setup(model: unknown) {
  el = document.createElement("div");
  document.body.append(el);
  const r = mount(model as WidgetModel, el);
  r.app.render();
  return r;
}

const q = <T extends Element = HTMLElement>(s: string): T => el.querySelector(s) as T;

describe("kernel switches", () => {
  it("stay off, and say why, on a widget restored without its kernel", () => {
    const model = fakeModel(tiny().payload, { alive: false });
    const { app } = setup(model);
    expect(model.hellos).toBe(1); // the view asked whether a kernel-side widget is there
    const training = q<HTMLButtonElement>('.mw-mode button[data-mode="training"]');
    expect(training.disabled).toBe(true);
    expect(q(".mw-switches").title).toContain("No answer from the kernel");
    training.click();
    expect(model.sent).toEqual([]); // no re-run that nobody would answer
    expect(q(".mw-progress").textContent).not.toContain("Re-running");
    // any message from the kernel shows it is there after all
    model.emit("msg:custom", { type: "ready" });
    app.render();
    expect(training.disabled).toBe(false);
    expect(q(".mw-switches").title).toBe("");
  });

  it("send a rerun message with the chosen mode, optimizer and device", () => {
    const model = fakeModel(tiny().payload);
    const { app } = setup(model);
    const training = q<HTMLButtonElement>('.mw-mode button[data-mode="training"]');
    const opt = q<HTMLSelectElement>(".mw-optimizer");
    const dev = q<HTMLSelectElement>(".mw-device");
    expect(training.disabled).toBe(false);
    expect(opt.disabled).toBe(true); // inference: no optimizer
    dev.value = "cpu";
    training.click();
    expect(model.sent).toEqual([{ type: "rerun", mode: "training", optimizer: "adamw", device: "cpu" }]);
    app.render();
    // re-running: the switches wait for the stream, and the progress line says so
    expect(q(".mw-progress").textContent).toContain("Re-running");
    expect(training.disabled).toBe(true);
    training.click();
    expect(model.sent).toHaveLength(1);
    // the kernel streams a fresh analysis; done ends the state
    model.emit("msg:custom", { type: "start", expected_calls: 1, payload: training as unknown });
    model.emit("msg:custom", { type: "done", elapsed_s: 0.1 });
    app.render();
    expect(q(".mw-progress").textContent).not.toContain("Re-running");
    // where the re-run is in Python
    expect(q(".mw-progress").textContent).toContain("in Python: a.widget().analysis");
    expect(q<HTMLButtonElement>('.mw-mode button[data-mode="training"]').disabled).toBe(false);
  });

  it("say so when a re-run gets no answer for a few seconds", () => {
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "setInterval", "clearInterval", "performance", "Date"] });
    try {
      const model = fakeModel(tiny().payload);
      const { app, cleanup } = setup(model);
      q<HTMLButtonElement>('.mw-mode button[data-mode="training"]').click();
      app.render();
      expect(q(".mw-progress").textContent).toContain("Re-running");
      expect(q(".mw-progress").textContent).not.toContain("No answer");
      vi.advanceTimersByTime(4000); // the kernel is still busy: no message yet
      expect(q(".mw-progress").textContent).not.toContain("No answer");
      vi.advanceTimersByTime(1100); // past RERUN_WAIT_MS: the line says why nothing happens
      expect(q(".mw-progress").textContent).toContain("No answer from the kernel in 5 s");
      expect(q(".mw-progress").classList.contains("mw-rerun-stalled")).toBe(true);
      // the kernel answers late after all: the line follows the trace again
      model.emit("msg:custom", { type: "start", expected_calls: 1, payload: training() });
      app.render();
      expect(q(".mw-progress").textContent).not.toContain("No answer");
      cleanup();
    } finally {
      vi.useRealTimers();
    }
  });

  it("send optimizer null for none, in training", () => {
    const model = fakeModel(training());
    const { app } = setup(model);
    const opt = q<HTMLSelectElement>(".mw-optimizer");
    expect(opt.disabled).toBe(false);
    expect(q('.mw-mode button[data-mode="training"]').classList.contains("mw-active")).toBe(true);
    opt.value = "none";
    opt.dispatchEvent(new Event("change"));
    expect(model.sent).toEqual([{ type: "rerun", mode: "training", optimizer: null, device: "cuda" }]);
    app.render();
  });

  it("show why a re-run was refused and keep the analysis", () => {
    const model = fakeModel(tiny().payload);
    const { app } = setup(model);
    q<HTMLButtonElement>('.mw-mode button[data-mode="training"]').click();
    model.emit("msg:custom", {
      type: "error",
      error: { type: "NoKernelModel", message: "This view has no model in the kernel to re-run" },
    });
    app.render();
    expect(q(".mw-progress").textContent).toContain("Cannot re-run");
    expect(q(".mw-banner").textContent).toBe("");
    expect(q('.mw-mode button[data-mode="inference"]').classList.contains("mw-active")).toBe(true);
  });

  it("are disabled with a tooltip without a kernel, and the cleanup removes every listener", () => {
    const model = standaloneModel(tiny().payload);
    const sent: unknown[] = [];
    model.send = (c: unknown) => void sent.push(c);
    const { cleanup } = setup(model);
    const buttons = [...el.querySelectorAll<HTMLButtonElement>(".mw-mode button")];
    expect(buttons.every((b) => b.disabled && /No kernel/.test(b.title))).toBe(true);
    expect(q<HTMLSelectElement>(".mw-device").disabled).toBe(true);
    buttons[1]?.click();
    expect(sent).toEqual([]);
    cleanup();
    const k = fakeModel(tiny().payload);
    setup(k).cleanup();
    expect(k.count()).toBe(0);
  });
});

describe("training view", () => {
  const a = decodePayload(training()) as Analysis;

  it("decodes phases, categories and the optimizer totals", () => {
    expect(a.timeline.phase).toEqual(["forward", "forward", "forward", "backward", "backward", "optimizer", "optimizer"]);
    expect(a.memory.peakPhase).toBe("optimizer");
    expect(a.memory.optimizerStateBytes).toBe(8848);
  });

  it("splits the timeline into phase spans (from per-event phases, else first indexes)", () => {
    const want = [
      { phase: "forward", start: 0, end: 3 },
      { phase: "backward", start: 3, end: 5 },
      { phase: "optimizer", start: 5, end: 7 },
    ];
    expect(phaseSpans(a)).toEqual(want);
    const noPerEvent = decodePayload({ ...training(), timeline: { ...(training().timeline as object), phase: [] } }) as Analysis;
    expect(phaseSpans(noPerEvent)).toEqual(want);
    expect(phaseSpans(decodePayload(tiny().payload) as Analysis)).toEqual([]);
  });

  it("stacks the peak by the seven categories in order, fractions summing to 1", () => {
    const segs = categorySegments(a.memory);
    expect(segs.map((s) => s.category)).toEqual(Object.keys(CATS));
    const total = Object.values(CATS).reduce((x, y) => x + y, 0);
    expect(segs[4]?.fraction).toBeCloseTo(8848 / total);
    expect(segs.reduce((x, s) => x + s.fraction, 0)).toBeCloseTo(1);
    expect(new Set(segs.map((s) => s.cls)).size).toBe(7);
  });

  it("shows gradients and optimizer state in the header and the category bar", () => {
    setup(fakeModel(training()));
    expect(q(".mw-totals").textContent).toContain("gradients4.32 KiB");
    expect(q(".mw-totals").textContent).toContain("optimizer state8.64 KiB");
    // (the memory tab's uPlot chart needs a canvas, which jsdom lacks: render the bar alone)
    const box = document.createElement("div");
    renderCategoryBar(box, a.memory, 20824);
    const segs = [...box.querySelectorAll<HTMLElement>(".mw-catseg")];
    expect(segs.map((s) => s.dataset.category)).toEqual(Object.keys(CATS).filter((c) => c !== "buffers"));
    expect(box.textContent).toContain("during optimizer");
    expect(box.querySelectorAll("tr")).toHaveLength(7);
  });

  it("has no training items in inference", () => {
    setup(fakeModel(tiny().payload));
    expect(q(".mw-totals").textContent).not.toContain("gradients");
    const box = document.createElement("div");
    renderCategoryBar(box, (decodePayload(tiny().payload) as Analysis).memory, 0);
    expect(box.textContent).toBe("");
  });
});

describe("checkpoint diff", () => {
  const ckpt = {
    matched: ["embed.weight", "head.weight", "head.bias"],
    missing: ["layers.0.fc.weight", "layers.0.fc.bias"],
    unexpected: ["module.extra"],
    shape_mismatches: [{ name: "layers.2.fc.weight", model: [8, 8], checkpoint: [9, 8] }],
    dtype_mismatches: [{ name: "head.bias", model: "torch.float32", checkpoint: "torch.float16" }],
    tied: [],
    hints: ["keys start with 'module.': saved from DataParallel"],
    ok: false,
  };

  it("maps parameters to modules by their path prefix", () => {
    const a = decodePayload({ ...tiny().payload, checkpoint: ckpt }) as Analysis;
    const p = checkpointProblems(a);
    expect([...p.keys()].sort()).toEqual(["layers.0.fc", "layers.2.fc"]);
    expect(p.get("layers.0.fc")).toHaveLength(2);
  });

  it("lists the problems in a banner and marks the rows", () => {
    const { app } = setup(fakeModel({ ...tiny().payload, checkpoint: ckpt }));
    app.setDepth(2); // below "all": the group stays folded
    app.render();
    const banner = q(".mw-checkpoint");
    expect(banner.textContent).toContain("2 missing from the checkpoint: layers.0.fc.weight, layers.0.fc.bias");
    expect(banner.textContent).toContain("1 unexpected");
    expect(banner.textContent).toContain("1 shape mismatches: layers.2.fc.weight (model [8, 8], checkpoint [9, 8])");
    expect(banner.textContent).toContain("1 dtype mismatches");
    expect(banner.textContent).toContain("DataParallel");
    // the folded 0–2 × Block group hides layers.0.fc and layers.2.fc: it carries the marker;
    // the expanded root and layers rows, embed and head (all fine) do not
    const marked = [...el.querySelectorAll<HTMLElement>(".mw-row.mw-ckpt-row")].map((r) => r.dataset.key);
    expect(marked).toEqual(["g3"]);
    const titles = [...el.querySelectorAll<HTMLElement>(".mw-row.mw-ckpt-row .mw-ckpt-icon")].map((x) => x.title).join("\n");
    expect(titles).toContain("layers.0.fc.weight: missing");
    expect(titles).toContain("layers.2.fc.weight: shape [8, 8]");
    // unaffected rows carry no marker
    expect(el.querySelectorAll(".mw-row:not(.mw-ckpt-row) .mw-ckpt-icon:not([style*='none'])").length).toBe(0);
    // a fresh view without the fold: expanding shows it on the Linear rows themselves
    expect(checkpointProblems(decodePayload({ ...tiny().payload, checkpoint: ckpt }) as Analysis).has("layers.1.fc")).toBe(false);
  });

  it("has no banner without a checkpoint", () => {
    setup(fakeModel(tiny().payload));
    expect(q(".mw-checkpoint").style.display).toBe("none");
  });
});
