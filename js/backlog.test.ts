/**
 * A view that mounts after the stream began (issue 28, item 6): the kernel sends `start` as soon
 * as it displays the widget, before any view exists. The model's `initialize` keeps the stream,
 * and the view starts from it: the progress line, the table and the header tell one state.
 * Replays the recorded GPT-2 messages.
 */
import { afterEach, describe, expect, it } from "vitest";
import messages from "./fixtures/gpt2-tiny.messages.json";
import { initialize, keepStreamed, mount, type Streamed, type Traits, type WidgetModel } from "./widget";
import { fakeModel } from "./testmodel";
import type { AnyModel, InitializeProps } from "@anywidget/types";

let el: HTMLElement;
afterEach(() => el?.remove());

const msgs = messages as { type: string; calls?: { module: number[] } }[];
const visibleRows = (root: HTMLElement): number =>
  [...root.querySelectorAll<HTMLElement>(".mw-row")].filter((r) => r.style.display !== "none").length;

function initialized(id: string): ReturnType<typeof fakeModel> {
  const model = fakeModel({});
  model.traits.stream_id = id;
  const props = { model: model as unknown as AnyModel<Traits>, signal: new AbortController().signal } as InitializeProps<Traits>;
  void initialize(props);
  return model;
}

describe("the stream's backlog", () => {
  it("keeps the start and what follows it, then only the done", () => {
    const log: Streamed[] = [];
    keepStreamed(log, { type: "calls" }); // no start yet: a refused re-run's error, or stray calls
    keepStreamed(log, { type: "error" });
    expect(log).toEqual([]);
    keepStreamed(log, msgs[0]);
    keepStreamed(log, msgs[1]);
    keepStreamed(log, { type: "phase", phase: "backward" });
    keepStreamed(log, { type: "ready" });
    expect(log.map((m) => (m.content as { type: string }).type)).toEqual(["start", "calls", "phase"]);
    keepStreamed(log, msgs[5], 7);
    expect(log).toEqual([{ content: msgs[5], at: 7 }]);
  });

  it("gives a view mounted mid-stream the module table, the parameters and the calls so far", () => {
    const model = initialized("mid-stream");
    for (const m of msgs.slice(0, 3)) model.emit("msg:custom", m);
    el = document.createElement("div");
    document.body.append(el);
    const { app, cleanup } = mount(model as unknown as WidgetModel, el);
    app.render();
    const n = (msgs[1]?.calls?.module.length ?? 0) + (msgs[2]?.calls?.module.length ?? 0);
    const progress = el.querySelector(".mw-progress")?.textContent ?? "";
    expect(progress).toContain(`${n} calls recorded`);
    // its clock runs from the start's arrival, as the views mounted before it do
    expect(progress).toMatch(/ · 0\.\d s$/);
    expect(visibleRows(el)).toBeGreaterThan(0);
    expect(el.querySelector<HTMLElement>(".mw-table-empty")?.style.display).toBe("none");
    const params = [...el.querySelectorAll<HTMLElement>(".mw-total")].find((t) => t.querySelector(".mw-total-label")?.textContent === "params");
    expect(params?.title).toMatch(/^[1-9][\d,]* parameters/);
    // the rest of the stream reaches it once, as to any view
    model.emit("msg:custom", msgs[3]);
    app.render();
    const more = n + (msgs[3]?.calls?.module.length ?? 0);
    expect(el.querySelector(".mw-progress")?.textContent ?? "").toContain(`${more} calls recorded`);
    cleanup();
  });

  it("is kept per widget, and a model without an id keeps none", () => {
    const a = initialized("widget-a");
    initialized("widget-b");
    a.emit("msg:custom", msgs[0]);
    el = document.createElement("div");
    document.body.append(el);
    const b = fakeModel({});
    b.traits.stream_id = "widget-b";
    const { app, cleanup } = mount(b as unknown as WidgetModel, el);
    app.render();
    expect(el.querySelector(".mw-progress")?.textContent ?? "").toBe("");
    cleanup();
  });
});
