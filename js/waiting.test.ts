/**
 * What the widget says while an analysis runs, before its first traced row (issue 40, warm
 * start): the kernel's `waiting` states in the session and the progress line (with the page's
 * own clock), the module tree as pending rows from `start`, the layers traced so far, the
 * backlog a later view starts from, and an error before the module tree ends the wait.
 */
import { afterEach, describe, expect, it } from "vitest";
import { decodeMessage, decodePayload } from "./decode";
import { renderProgress } from "./header";
import type { Message } from "./protocol";
import { emptyText, layerProgress } from "./rows";
import { canRerun, initialSession, reduce, type Session } from "./session";
import { tiny } from "./testdata";
import { fakeModel } from "./testmodel";
import { aggregate, buildTree } from "./tree";
import { keepStreamed, mount, type Streamed, type WidgetModel } from "./widget";

const msg = (m: Record<string, unknown>): Message => decodeMessage(m) as Message;
const waiting = (state: string, text: string, elapsed = 0): Message => msg({ type: "waiting", state, text, elapsed_s: elapsed });
const WARM = "waiting for PyTorch's meta kernels to load (the warm-up)";
const BUILD = "building the model from its transformers config on the meta device";
const TRACE = "tracing: waiting for the first module call";

function progress(s: Session, now: number, layers: ReturnType<typeof layerProgress> = null): string {
  const el = document.createElement("div");
  renderProgress(el, s, now, layers);
  return el.style.display === "none" ? "" : (el.textContent ?? "");
}

describe("the waiting states", () => {
  it("say what the analysis waits for, counting the seconds in the page", () => {
    // the warm-up had run 2 s when the analysis began to wait for it
    let s = reduce(initialSession, waiting("warm-up", WARM, 2), 10_000);
    expect(s.wait).toEqual({ state: "warm-up", text: WARM, since: 8_000 });
    expect(progress(s, 11_100)).toBe(`${WARM} · 3.1 s so far`);
    s = reduce(s, waiting("build", BUILD), 12_000);
    expect(progress(s, 12_500)).toBe(`${BUILD} · 0.5 s so far`);
    // the module tree: the wait ends, the trace's own line takes over
    const [start] = tiny().messages;
    s = reduce(s, msg(start as Record<string, unknown>), 13_000);
    expect(s.wait).toBeNull();
    s = reduce(s, waiting("trace", TRACE), 13_000);
    expect(progress(s, 14_000)).toBe(`${TRACE} · 1.0 s`);
  });

  it("count calls and layers once calls arrive, then say the trace is analyzed", () => {
    const fx = tiny();
    const [start, first] = fx.messages.map((m) => msg(m as Record<string, unknown>));
    let s = reduce(initialSession, start as Message, 0);
    s = reduce(s, waiting("trace", TRACE), 0);
    s = reduce(s, first as Message, 500);
    const a = s.analysis;
    if (!a) throw new Error("no analysis");
    const layers = layerProgress(buildTree(a), aggregate(a));
    // TinyNet's three repeated layers: layers.0 ended, layers.1 runs (its fc is recorded)
    expect(layers).toMatchObject({ done: 1, total: 3 });
    expect(progress(s, 1_500, layers)).toBe("tracing: 1 of 3 layers traced · 5 calls recorded / 12 expected (estimate) · 1.5 s");
    s = reduce(s, waiting("analyze", "analyzing the trace: the memory timeline and the totals per module"), 2_000);
    expect(progress(s, 2_500, layers)).toBe(
      "analyzing the trace: the memory timeline and the totals per module · 5 calls recorded · 2.5 s",
    );
    s = reduce(s, msg({ type: "done", elapsed_s: 2.4 }), 3_000);
    expect(s.wait).toBeNull();
    expect(progress(s, 3_000)).toBe("5 calls recorded in 2.40 s");
  });

  it("keep the switches off: nothing to re-run while the analysis waits", () => {
    let s = reduce(initialSession, msg({ type: "ready" }), 0);
    expect(canRerun(s, true)).toBe(true);
    s = reduce(s, waiting("build", BUILD), 0);
    expect(canRerun(s, true)).toBe(false);
  });

  it("end with a structural analysis's payload, which has no done", () => {
    let s = reduce(initialSession, waiting("build", BUILD), 0);
    s = reduce(s, { type: "payload", analysis: decodePayload({ ...tiny().payload, status: "structural" }) }, 100);
    expect(s.wait).toBeNull();
  });

  it("end with an error before the module tree: the banner says why", () => {
    let s = reduce(initialSession, waiting("build", BUILD), 0);
    s = reduce(s, msg({ type: "error", error: { type: "ZeroDivisionError", message: "the factory failed" } }), 100);
    expect(s.wait).toBeNull();
    expect(s.analysis?.status).toBe("error");
    expect(s.analysis?.error?.message).toBe("the factory failed");
    expect(emptyText(s.analysis, 0, "")).toBe("No module tree: the analysis stopped before the model was built.");
  });

  it("a re-run's wait keeps the analysis shown until its module tree comes", () => {
    const fx = tiny();
    let s = reduce(initialSession, { type: "payload", analysis: decodePayload(fx.payload) }, 0);
    s = reduce(s, { type: "rerun", mode: "training", optimizer: "adamw", device: "cuda" }, 0);
    s = reduce(s, waiting("build", "preparing the meta model again"), 100);
    expect(s.analysis?.status).toBe("done");
    expect(progress(s, 600)).toBe("Re-running · preparing the meta model again · 0.5 s so far");
  });
});

describe("the table while waiting", () => {
  let el: HTMLElement;
  afterEach(() => el?.remove());

  it("says where the tree will be, then shows every module pending from the start", () => {
    el = document.createElement("div");
    document.body.append(el);
    const model = fakeModel({});
    const { app, cleanup } = mount(model as unknown as WidgetModel, el);
    model.emit("msg:custom", { type: "waiting", state: "build", text: BUILD, elapsed_s: 0 });
    app.render();
    expect(el.querySelector(".mw-table-empty")?.textContent).toBe("The module tree shows here as soon as the model is built.");
    expect(el.querySelector(".mw-progress .mw-waiting")?.textContent).toMatch(/^building the model .* s so far$/);
    const fx = tiny();
    model.emit("msg:custom", fx.messages[0]);
    model.emit("msg:custom", { type: "waiting", state: "trace", text: TRACE, elapsed_s: 0 });
    app.render();
    const rows = [...el.querySelectorAll<HTMLElement>(".mw-row")].filter((r) => r.style.display !== "none");
    expect(rows.length).toBe(5);
    expect(rows.every((r) => r.classList.contains("mw-pending"))).toBe(true);
    // the structure is known: parameters shown; shapes, output memory and FLOPs pending
    const head = rows.find((r) => r.querySelector(".mw-mname")?.textContent === "head") as HTMLElement;
    const cells = [...head.querySelectorAll<HTMLElement>(".mw-td:not(.mw-name)")];
    expect(cells.filter((c) => c.classList.contains("mw-td-pending")).map((c) => c.textContent)).toEqual(["…", "…", "…", "…"]);
    expect(cells.some((c) => !c.classList.contains("mw-td-pending") && /\d/.test(c.textContent ?? ""))).toBe(true);
    expect(el.querySelector(".mw-progress")?.textContent).toContain(TRACE);
    // the root's details: its structure, and no zeros for the numbers the trace has not made
    const details = el.querySelector(".mw-details")?.textContent ?? "";
    expect(details).toContain("Not traced yet");
    expect(details).not.toContain("0 FLOPs (0)");
    expect(details).not.toContain("output mem (its");
    cleanup();
  });
});

describe("the backlog before the module tree", () => {
  it("keeps the latest state, and an error after it", () => {
    const log: Streamed[] = [];
    const types = (): string[] => log.map((m) => (m.content as { type: string; state?: string }).state ?? (m.content as { type: string }).type);
    keepStreamed(log, { type: "waiting", state: "warm-up" }, 1);
    keepStreamed(log, { type: "waiting", state: "build" }, 2);
    expect(types()).toEqual(["build"]);
    keepStreamed(log, { type: "error" }, 3);
    expect(types()).toEqual(["build", "error"]);
    keepStreamed(log, { type: "waiting", state: "build" }, 4); // a re-run begins
    keepStreamed(log, { type: "start" }, 5);
    keepStreamed(log, { type: "waiting", state: "trace" }, 6);
    keepStreamed(log, { type: "calls" }, 7);
    keepStreamed(log, { type: "waiting", state: "analyze" }, 8);
    expect(types()).toEqual(["start", "trace", "calls", "analyze"]);
    keepStreamed(log, { type: "done" }, 9);
    expect(types()).toEqual(["done"]);
  });
});
