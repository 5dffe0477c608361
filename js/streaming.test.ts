/**
 * The streamed view agrees with itself (issue 28, item 6): once calls have arrived, the table
 * shows their modules, the header counts the parameters the `start` table already has, and the
 * progress line's count is the calls the table holds. Replays the recorded GPT-2 messages.
 */
import { afterEach, describe, expect, it } from "vitest";
import final from "./fixtures/gpt2-tiny.json";
import messages from "./fixtures/gpt2-tiny.messages.json";
import { keepKeys } from "./app";
import { hideStaticView, mount, type WidgetModel } from "./widget";
import { fakeModel } from "./testmodel";

let el: HTMLElement;
afterEach(() => el?.remove());

const visibleRows = (root: HTMLElement): number =>
  [...root.querySelectorAll<HTMLElement>(".mw-row")].filter((r) => r.style.display !== "none").length;

describe("a streamed analysis", () => {
  it("shows the modules of the calls recorded so far, and the parameters from the start", () => {
    el = document.createElement("div");
    document.body.append(el);
    const model = fakeModel({});
    const { app } = mount(model as unknown as WidgetModel, el);
    const msgs = messages as { type: string; calls?: { module: number[] } }[];
    model.emit("msg:custom", msgs[0]);
    app.render();
    // the start's module table: every module is a row at once, its shapes and costs pending
    expect(el.querySelector<HTMLElement>(".mw-table-empty")?.style.display).toBe("none");
    expect(visibleRows(el)).toBeGreaterThan(1);
    expect(el.querySelectorAll(".mw-row.mw-pending").length).toBeGreaterThan(0);
    expect(el.querySelector(".mw-row.mw-pending .mw-td-pending")?.textContent).toBe("…");
    // the start's module table has the parameters: the header counts them already
    const totals = el.querySelector(".mw-totals")?.textContent ?? "";
    expect(totals).not.toMatch(/params0(?![.\d])/);
    model.emit("msg:custom", msgs[1]);
    app.render();
    const n = msgs[1]?.calls?.module.length ?? 0;
    expect(n).toBeGreaterThan(0);
    const progress = el.querySelector(".mw-progress")?.textContent ?? "";
    expect(progress).toContain(`${n} calls recorded`);
    // the calls' modules are rows; the table does not say it waits for them
    expect(visibleRows(el)).toBeGreaterThan(0);
    const empty = el.querySelector<HTMLElement>(".mw-table-empty");
    expect(empty?.style.display).toBe("none");
  });
});

describe("keys pressed in the widget", () => {
  it("stop at its root, except the host's combinations", () => {
    const host = document.createElement("div");
    const inner = document.createElement("div");
    host.append(inner);
    inner.addEventListener("keydown", keepKeys);
    const heard: string[] = [];
    host.addEventListener("keydown", (e) => heard.push(e.key));
    for (const init of [{ key: "a" }, { key: "d" }, { key: "Escape" }, { key: "s", ctrlKey: true }, { key: "Enter", shiftKey: true }]) {
      inner.dispatchEvent(new KeyboardEvent("keydown", { ...init, bubbles: true }));
    }
    expect(heard).toEqual(["s", "Enter"]);
  });
});

describe("the static view after the widget's output", () => {
  it("is hidden once the widget mounts in the output before it", () => {
    const area = document.createElement("div");
    const widgetOut = document.createElement("div");
    widgetOut.className = "jp-OutputArea-child";
    const staticOut = document.createElement("div");
    staticOut.className = "jp-OutputArea-child";
    staticOut.innerHTML = "<div class='mw-static'><div class='meta-widget-fallback'>static</div></div>";
    const view = document.createElement("div");
    widgetOut.append(view);
    area.append(widgetOut, staticOut);
    const undo = hideStaticView(view);
    expect(staticOut.style.display).toBe("none");
    undo();
    expect(staticOut.style.display).toBe("");
  });
});

describe("a class label in the tree", () => {
  it("keeps a whole CamelCase word at its end", async () => {
    const { splitType } = await import("./treeview");
    expect(splitType("80 × LlamaDecoderLayer")).toEqual(["80 × Llama", "DecoderLayer"]);
    expect(splitType("LlamaRotaryEmbedding")).toEqual(["LlamaRotary", "Embedding"]);
    expect(splitType("Linear")).toEqual(["", "Linear"]);
  });
});

describe("the header of a parallel trace", () => {
  it("says the parameter memory of this GPU, as summary() does (the shard, not the model)", async () => {
    const raw = JSON.parse(JSON.stringify((await import("./fixtures/gpt2-tiny.json")).default));
    const whole = raw.modules.param_bytes[0] as number;
    raw.totals.param_bytes = whole / 8; // fsdp 8: this rank's shard
    raw.settings = [["fsdp 8", "this trace is rank 0 of 8"]];
    el = document.createElement("div");
    document.body.append(el);
    const { app } = mount(fakeModel(raw) as unknown as WidgetModel, el);
    app.render();
    const totals = el.querySelector(".mw-totals")?.textContent ?? "";
    expect(totals).toContain("param memory (this GPU)");
    expect(totals).toContain(`${(whole / 8 / 1024).toFixed(1)} KiB`);
    expect([...el.querySelectorAll(".mw-chip-setting")].map((c) => c.textContent)).toEqual(["fsdp 8"]);
  });
});

describe("the progress line after a stream", () => {
  it("says how long the trace took and, when the cell ran longer, how long it all took", () => {
    el = document.createElement("div");
    document.body.append(el);
    const model = fakeModel({});
    const { app } = mount(model as unknown as WidgetModel, el);
    const msgs = messages as { type: string }[];
    for (const m of msgs.slice(0, -1)) model.emit("msg:custom", m);
    model.set("payload", final); // the kernel sets the final payload before "done"
    model.emit("msg:custom", { type: "done", elapsed_s: 0.1, total_s: 4.83 });
    app.render();
    const text = el.querySelector(".mw-progress")?.textContent ?? "";
    expect(text).toMatch(/calls recorded in 0\.10 s · 4\.83 s in all/);
  });
});
