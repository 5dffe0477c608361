import { afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { formatBytes } from "./format";
import { precisionOf, scaledTimeline } from "./precision";
import { decodePayload } from "./decode";
import { mount, type WidgetModel } from "./widget";
import { fakeModel } from "./testmodel";
import inference from "./fixtures/gpt2-tiny.json";
import training from "./fixtures/gpt2-tiny.training.json";

let el: HTMLElement;
afterEach(() => el?.remove());
// jsdom has no canvas: the charts draw into a context that ignores every call
beforeAll(() => {
  const noop = (): void => undefined;
  const ctx = new Proxy({} as Record<string | symbol, unknown>, {
    get: (t, k) => (k in t ? t[k] : k === "measureText" ? () => ({ width: 8 }) : noop),
    set: (t, k, v) => {
      t[k] = v;
      return true;
    },
  });
  vi.spyOn(HTMLCanvasElement.prototype, "getContext").mockImplementation(() => ctx as never);
  vi.stubGlobal(
    "Path2D",
    class {
      constructor() {
        return new Proxy(this, { get: () => noop });
      }
    },
  );
});

function setup(payload: unknown) {
  el = document.createElement("div");
  document.body.append(el);
  const r = mount(fakeModel(payload) as unknown as WidgetModel, el);
  r.app.render();
  return r;
}

const totals = (): Record<string, string> =>
  Object.fromEntries(
    [...el.querySelectorAll(".mw-total")].map((t) => [
      t.querySelector(".mw-total-label")?.textContent ?? "",
      t.querySelector(".mw-total-value")?.textContent ?? "",
    ]),
  );

type WhatIf = Record<string, Record<string, number>>;
const whatIf = (p: unknown): WhatIf => (p as { memory: { what_if: WhatIf } }).memory.what_if;

describe("the precision switch", () => {
  it("shows the kernel's what-if peak and categories, and says what follows it", () => {
    const { app } = setup(inference);
    const bf16 = whatIf(inference).bf16 as Record<string, number>;
    expect(totals().peak).toBe(formatBytes((inference as { totals: { peak_bytes: number } }).totals.peak_bytes));
    (el.querySelector('.mw-seg-btn[data-dtype="bf16"]') as HTMLElement).click();
    app.render();
    expect(totals()["peak (bf16, estimate)"]).toBe(formatBytes(bf16.total as number));
    expect(totals().peak).toBeUndefined();
    // the memory tab: the peak by category at bf16, and the note on what follows the switch
    (el.querySelector('.mw-tab[data-tab="memory"]') as HTMLElement).click();
    app.render();
    const cats = el.querySelector(".mw-categories") as HTMLElement;
    expect(cats.textContent).toContain(`Peak by category (${formatBytes(bf16.total as number)}`);
    expect(cats.textContent).toContain(formatBytes(bf16.activations as number));
    expect(cats.textContent).toContain("activations in bf16");
    // weight-only int4: activations stay as recorded
    (el.querySelector('.mw-seg-btn[data-dtype="int4"]') as HTMLElement).click();
    app.render();
    expect(cats.textContent).toContain("activations stay at their recorded dtype");
  });

  it("re-scales the timeline so that its top is the what-if peak (inference)", () => {
    const a = decodePayload(inference);
    expect(a).not.toBeNull();
    if (!a) return;
    for (const choice of ["fp32", "bf16", "fp16", "int8", "int4"] as const) {
      const p = precisionOf(a, choice);
      expect(p).not.toBeNull();
      if (!p) continue;
      const bytes = scaledTimeline(a, p);
      expect(Math.max(...bytes)).toBe(p.total);
    }
    expect(precisionOf(a, "recorded")).toBeNull();
  });

  it("offers no weight-only formats in training, and scales gradients and state", () => {
    const a = decodePayload(training);
    expect(a && precisionOf(a, "int8")).toBeNull();
    const { app } = setup(training);
    (el.querySelector('.mw-seg-btn[data-dtype="bf16"]') as HTMLElement).click();
    app.render();
    const bf16 = whatIf(training).bf16 as Record<string, number>;
    expect(totals()["optimizer state (est.)"]).toBe(formatBytes(bf16["optimizer state"] as number));
  });
});

describe("the timeline", () => {
  it("leaves the constant parameters out by default where they are most of the peak", () => {
    const { app } = setup(inference);
    (el.querySelector('.mw-tab[data-tab="timeline"]') as HTMLElement).click();
    app.render();
    const box = el.querySelector(".mw-leave-out") as HTMLInputElement;
    const t = (inference as { totals: Record<string, number> }).totals;
    const base = (t.param_bytes ?? 0) + (t.buffer_bytes ?? 0) + (t.input_bytes ?? 0);
    expect(base / (t.peak_bytes ?? 1)).toBeGreaterThan(0.5); // GPT-2 tiny: weights dominate
    expect(box.checked).toBe(true);
    box.checked = false;
    box.dispatchEvent(new Event("change"));
    app.render();
    expect((el.querySelector(".mw-leave-out") as HTMLInputElement).checked).toBe(false); // the choice holds
  });
});
