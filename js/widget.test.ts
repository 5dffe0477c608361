import { afterEach, describe, expect, it, vi } from "vitest";
import type { RenderProps } from "@anywidget/types";
import widget, { mount, type Traits, type WidgetModel } from "./widget";
import { tiny } from "./testdata";
import { fakeModel } from "./testmodel";
import training from "./fixtures/gpt2-tiny.training.json";

const rowTexts = (el: HTMLElement): string[] =>
  [...el.querySelectorAll<HTMLElement>(".mw-row")]
    .filter((r) => r.style.display !== "none")
    .sort((x, y) => Number(x.dataset.row) - Number(y.dataset.row))
    .map((r) => (r.querySelector(".mw-mname") as HTMLElement).textContent ?? "");

let el: HTMLElement;
afterEach(() => el?.remove());

function setup(payload: unknown) {
  el = document.createElement("div");
  document.body.append(el);
  const model = fakeModel(payload);
  const r = mount(model as unknown as WidgetModel, el);
  r.app.render();
  return { model, ...r };
}

describe("widget", () => {
  it("exports render for anywidget, which returns a cleanup", () => {
    el = document.createElement("div");
    const model = fakeModel(tiny().payload);
    const props = { model, el } as unknown as RenderProps<Traits>;
    const cleanup = widget.render(props) as () => void;
    expect(model.count()).toBe(3);
    expect(el.querySelector(".mw-root")).not.toBeNull();
    cleanup();
    expect(model.count()).toBe(0);
    expect(el.querySelector(".mw-root")).toBeNull();
  });

  it("renders the tree down to depth 2 with totals", () => {
    const { model } = setup(tiny().payload);
    void model;
    expect(rowTexts(el)).toEqual(["TinyNet", "embed", "layers", "0–2", "head"]);
    expect(el.querySelector(".mw-title")?.textContent).toBe("TinyNet");
    const totals = el.querySelector(".mw-totals")?.textContent ?? "";
    expect(totals).toContain("1.11 K"); // 1106 params
    expect(totals).toContain("2.18 KFLOPs"); // 2176
    expect(totals).toContain("4.32 KiB"); // 4424 bytes
    expect(el.querySelector(".mw-notes")?.textContent).toContain("Dropout is a no-op");
  });

  it("expands on a caret click and selects on a name click", () => {
    const { model, app } = setup(tiny().payload);
    const caret = el.querySelector('.mw-row[data-row="3"] .mw-caret') as HTMLElement;
    caret.click();
    app.render();
    expect(rowTexts(el)).toEqual(["TinyNet", "embed", "layers", "0–2", "0", "1", "2", "head"]);
    (el.querySelector('.mw-row[data-row="7"] .mw-mname') as HTMLElement).click();
    expect(model.sent).toEqual([{ type: "select", module: 12 }]);
    expect(model.traits.selected).toBe(12);
    expect(model.saves).toBe(1);
    expect(el.querySelector(".mw-details .mw-path")?.textContent).toBe("head");
  });

  it("navigates with the keyboard", () => {
    const { model, app } = setup(tiny().payload);
    const table = el.querySelector(".mw-table") as HTMLElement;
    const key = (k: string) => {
      table.dispatchEvent(new KeyboardEvent("keydown", { key: k, bubbles: true }));
      app.render();
    };
    key("ArrowDown"); // the root is selected at first: down to embed
    key("End"); // head
    key("ArrowUp"); // 0–2 group
    key("ArrowRight"); // open it
    expect(rowTexts(el)).toContain("1");
    key("ArrowRight"); // to its first member
    key("ArrowLeft"); // back to the group
    key("ArrowLeft"); // close the group
    expect(rowTexts(el)).not.toContain("1");
    const modules = model.sent.map((m) => (m as { module: number }).module);
    expect(modules).toEqual([1, 12, 3, 3, 3]);
  });

  it("filters with the search box", () => {
    const { app } = setup(tiny().payload);
    const search = el.querySelector(".mw-search") as HTMLInputElement;
    search.value = "head";
    search.dispatchEvent(new Event("input"));
    app.render();
    expect(rowTexts(el)).toEqual(["TinyNet", "head"]);
  });

  it("sorts siblings from the column headers", () => {
    const { app } = setup(tiny().payload);
    const header = (label: string) =>
      [...el.querySelectorAll<HTMLElement>(".mw-th")].find((th) => th.textContent === label) as HTMLElement;
    // FLOPs: layers holds 3 × 512 (it is never called itself: sorts by its children's), head 640
    header("FLOPs").click(); // descending first
    app.render();
    expect(rowTexts(el)).toEqual(["TinyNet", "layers", "0–2", "head", "embed"]);
    header("FLOPs").click(); // ascending
    app.render();
    expect(rowTexts(el)).toEqual(["TinyNet", "embed", "head", "layers", "0–2"]);
    header("Params").click(); // another column: descending (embed 800, layers 216, head 90)
    app.render();
    expect(rowTexts(el)).toEqual(["TinyNet", "embed", "layers", "0–2", "head"]);
    header("Params").click();
    header("Params").click(); // third click: back to definition order
    app.render();
    expect(rowTexts(el)).toEqual(["TinyNet", "embed", "layers", "0–2", "head"]);
    expect(header("Params").classList.contains("mw-sorted")).toBe(false);
  });

  it("keeps user strings as text", () => {
    const evil = "<img src=x onerror=alert(1)>";
    setup(tiny({ rootType: evil }).payload);
    expect(el.querySelector("img")).toBeNull();
    expect(el.querySelector(".mw-title")?.textContent).toBe(evil);
    expect(rowTexts(el)[0]).toBe(evil);
  });

  it("shows the explained error and marks the failing rows", () => {
    const { app } = setup(tiny({ error: true }).payload);
    const banner = el.querySelector(".mw-banner") as HTMLElement;
    expect(banner.textContent).toContain("RuntimeError");
    expect(banner.textContent).toContain("layers.1.fc");
    expect(banner.textContent).toContain("model.py:42");
    expect(banner.textContent).toContain("Make in_features match");
    (banner.querySelector("button") as HTMLButtonElement).click();
    app.render();
    const selected = el.querySelector(".mw-row.mw-selected") as HTMLElement;
    expect(selected.querySelector(".mw-mname")?.textContent).toBe("fc");
    expect(selected.classList.contains("mw-error-row")).toBe(true);
  });

  it("marks rows that rest on an assumption and explains it", () => {
    const { app } = setup(tiny({ assume: true }).payload);
    expect(el.querySelector(".mw-notes")?.textContent).toContain("assumed 1 value");
    app.selectModule(7); // layers.1.fc, inside the folded group
    app.render();
    const selected = el.querySelector(".mw-row.mw-selected") as HTMLElement;
    expect((selected.querySelector(".mw-assumed-icon") as HTMLElement).style.display).toBe("");
    const other = el.querySelector('.mw-row[data-key="m8"]') as HTMLElement; // layers.1.act
    // a mark is made the first time a row needs it, and hidden after
    const mark = other.querySelector(".mw-assumed-icon") as HTMLElement | null;
    expect(mark === null || mark.style.display === "none").toBe(true);
    const details = el.querySelector(".mw-details")?.textContent ?? "";
    expect(details).toContain("Assumptions");
    expect(details).toContain("model.py:17");
    expect(details).toContain("if mask.all():");
  });

  it("streams: the module rows at once, their cells as calls arrive, then the final payload", () => {
    const fx = tiny();
    const { model, app } = setup({});
    expect(el.querySelectorAll(".mw-row:not([style*='none'])").length).toBe(0);
    model.emit("msg:custom", fx.messages[0]);
    app.render();
    expect(el.querySelector(".mw-progress")?.textContent).toContain("0 calls recorded / 12 expected");
    // the module tree from the start: every row, each pending
    expect(rowTexts(el)).toEqual(["TinyNet", "embed", "layers", "0–2", "head"]);
    expect(el.querySelectorAll(".mw-row.mw-pending").length).toBe(5);
    model.emit("msg:custom", fx.messages[1]);
    app.render();
    expect(el.querySelector(".mw-progress")?.textContent).toContain("5 calls recorded / 12 expected");
    // embed, layers.0 (fc, act) and layers.1.fc have been called: head not yet
    expect(rowTexts(el)).toEqual(["TinyNet", "embed", "layers", "0–2", "head"]);
    const pending = [...el.querySelectorAll<HTMLElement>(".mw-row.mw-pending")].map((r) => r.querySelector(".mw-mname")?.textContent);
    expect(pending).toEqual(["TinyNet", "head"]);
    model.emit("msg:custom", fx.messages[2]);
    model.traits.payload = fx.payload;
    model.emit("msg:custom", fx.messages[3]);
    app.render();
    expect(rowTexts(el)).toEqual(["TinyNet", "embed", "layers", "0–2", "head"]);
    expect(el.querySelector(".mw-progress")?.textContent).toContain("12 calls recorded in 0.25 s");
  });

  it("says which phase of a training step runs after the forward pass", () => {
    const fx = tiny();
    const { model, app } = setup({});
    model.emit("msg:custom", fx.messages[0]);
    model.emit("msg:custom", fx.messages[1]);
    model.emit("msg:custom", fx.messages[2]);
    model.emit("msg:custom", { type: "phase", phase: "backward" });
    app.render();
    const progress = (): string => el.querySelector(".mw-progress")?.textContent ?? "";
    expect(progress()).toContain("forward pass done (12 calls) · backward pass…");
    expect((el.querySelector(".mw-progress-fill") as HTMLElement).style.width).toBe("100%");
    model.emit("msg:custom", { type: "phase", phase: "optimizer" });
    app.render();
    expect(progress()).toContain("optimizer step…");
    model.traits.payload = fx.payload;
    model.emit("msg:custom", fx.messages[3]);
    app.render();
    expect(progress()).toContain("12 calls recorded in 0.25 s");
  });

  it("opens to the depth trait", () => {
    el = document.createElement("div");
    document.body.append(el);
    const model = fakeModel(tiny().payload);
    model.traits.depth = 1;
    const r = mount(model as unknown as WidgetModel, el);
    r.app.render();
    expect(rowTexts(el)).toEqual(["TinyNet", "embed", "layers", "head"]);
    model.traits.depth = 3;
    model.emit("change:depth");
    r.app.render();
    expect(rowTexts(el)).toEqual(["TinyNet", "embed", "layers", "0–2", "head"]); // groups stay folded
    // "all" picked in the menu opens the folded group, with only its first member open
    const menu = el.querySelector(".mw-select") as HTMLSelectElement;
    menu.value = "3";
    menu.dispatchEvent(new Event("change"));
    r.app.render();
    expect(rowTexts(el)).toEqual(["TinyNet", "embed", "layers", "0–2", "0", "fc", "act", "1", "2", "head"]);
    // Alt+click on a caret opens everything below it, every folded member too
    const caret = el.querySelector('.mw-row[data-row="0"] .mw-caret') as HTMLElement;
    caret.dispatchEvent(new MouseEvent("click", { bubbles: true, altKey: true }));
    r.app.render();
    expect(rowTexts(el)).toEqual(["TinyNet", "embed", "layers", "0–2", "0", "fc", "act", "1", "fc", "act", "2", "fc", "act", "head"]);
    r.cleanup();
  });

  it("makes a cell's tooltip when the pointer reaches it, and keeps it current", () => {
    const { app } = setup(tiny().payload);
    const rootRow = el.querySelector('.mw-row[data-row="0"]') as HTMLElement;
    const paramMem = rootRow.querySelectorAll(".mw-td")[4] as HTMLElement;
    expect(paramMem.hasAttribute("title")).toBe(false); // none made for rows scrolled past
    paramMem.dispatchEvent(new MouseEvent("mouseover", { bubbles: true }));
    expect(paramMem.title).toBe("4,424 bytes");
    (el.querySelector('.mw-seg-btn[data-dtype="bf16"]') as HTMLButtonElement).click();
    app.render();
    expect(paramMem.title).toBe("2,212 bytes");
    const name = rootRow.querySelector(".mw-mname") as HTMLElement;
    name.dispatchEvent(new MouseEvent("mouseover", { bubbles: true }));
    expect((rootRow.querySelector(".mw-name") as HTMLElement).title).toBe("TinyNet");
  });

  it("counts a training step's FLOPs, forward and backward, and says so", () => {
    const { app } = setup(training);
    const head = el.querySelector(".mw-th.mw-col-flops") as HTMLElement;
    expect(head.textContent).toBe("Step FLOPs");
    const flops = el.querySelector('.mw-row[data-row="0"] .mw-col-flops') as HTMLElement;
    flops.dispatchEvent(new MouseEvent("mouseover", { bubbles: true }));
    expect(flops.title).toMatch(/forward [\d,]+ \+ backward [\d,]+$/);
    expect(el.querySelector(".mw-details")?.textContent).toContain("backward");
    // a Linear's own ops: forward and backward FLOPs side by side
    const fc = app as unknown as { selectModule(i: number): void; render(): void };
    const decoded = training as { modules: { name: number[] }; strings: string[] };
    const row = decoded.modules.name.findIndex((sid) => decoded.strings[sid] === "c_fc");
    fc.selectModule(row);
    fc.render();
    const ops = el.querySelector(".mw-details .mw-ops") as HTMLElement;
    expect([...ops.querySelectorAll("th")].map((t) => t.textContent)).toEqual(["op", "forward", "backward"]);
    expect(ops.textContent).toContain("aten.mm");
  });

  it("recomputes parameter memory for another dtype", () => {
    const { app } = setup(tiny().payload);
    const bf16 = el.querySelector('.mw-seg-btn[data-dtype="bf16"]') as HTMLButtonElement;
    bf16.click();
    app.render();
    // 1106 float params × 2 bytes = 2212 bytes = 2.16 KiB (recorded: 4424 = 4.32 KiB)
    expect(el.querySelector(".mw-totals")?.textContent).toContain("param memory (bf16)2.16 KiB");
    const rootRow = el.querySelector('.mw-row[data-row="0"]') as HTMLElement;
    expect(rootRow.querySelectorAll(".mw-td")[4]?.textContent).toBe("2.16 KiB");
    (el.querySelector('.mw-seg-btn[data-dtype="int4"]') as HTMLButtonElement).click();
    app.render();
    expect(rootRow.querySelectorAll(".mw-td")[4]?.textContent).toBe("553 B");
  });

  it("copies a module path", async () => {
    const writeText = vi.fn(async () => undefined);
    Object.defineProperty(window, "isSecureContext", { value: true, configurable: true });
    Object.defineProperty(navigator, "clipboard", { value: { writeText }, configurable: true });
    setup(tiny().payload);
    (el.querySelector('.mw-row[data-row="1"] .mw-mname') as HTMLElement).click();
    const copy = [...el.querySelectorAll<HTMLButtonElement>(".mw-details button")].find(
      (b) => b.textContent === "Copy path",
    );
    copy?.click();
    await Promise.resolve();
    expect(writeText).toHaveBeenCalledWith("embed");
  });
});
