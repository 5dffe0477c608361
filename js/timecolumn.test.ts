/**
 * The tree's Time column (an analysis with `gpu=`): each module's estimated time and what bounds
 * it, sortable like the other numbers, absent without a GPU. The recorded training sample was
 * timed on an H100 by the Python side; its per-module seconds are the truth the cells show.
 */
import { afterEach, describe, expect, it } from "vitest";
import { columnLayout } from "./columns";
import training from "./fixtures/gpt2-tiny.training.json";
import { tiny } from "./testdata";
import { fakeModel } from "./testmodel";
import { formatSeconds } from "./timing";
import { mount, type WidgetModel } from "./widget";

let el: HTMLElement;
afterEach(() => el?.remove());

function setup(payload: unknown) {
  el = document.createElement("div");
  document.body.append(el);
  const r = mount(fakeModel(payload) as unknown as WidgetModel, el);
  r.app.render();
  return r;
}

const rowTexts = (root: HTMLElement): string[] =>
  [...root.querySelectorAll<HTMLElement>(".mw-row")]
    .filter((r) => r.style.display !== "none")
    .sort((a, b) => Number(a.dataset.row) - Number(b.dataset.row))
    .map((r) => r.querySelector(".mw-mname")?.textContent ?? "");
const header = (label: string): HTMLElement =>
  [...el.querySelectorAll<HTMLElement>(".mw-th")].find((th) => th.textContent === label) as HTMLElement;
const timeCell = (row: number): HTMLElement =>
  el.querySelector(`.mw-row[data-row="${row}"] .mw-td.mw-col-time`) as HTMLElement;

/** The tiny model timed by hand: embed 5 ms, head 2 ms, each block 0.1 ms (layers: their sum). */
function timedTiny(): Record<string, unknown> {
  const seconds = [7.3e-3, 5e-3, 0, 1e-4, 8e-5, 2e-5, 1e-4, 8e-5, 2e-5, 1e-4, 8e-5, 2e-5, 2e-3];
  const bound = ["compute", "memory", "", "compute", "compute", "memory", "compute", "compute", "memory", "compute", "compute", "memory", "compute"];
  const time = {
    gpu: "H100",
    memory_bytes: 80 * 2 ** 30,
    step_s: 7.3e-3,
    forward_s: 3e-3,
    backward_s: 4.3e-3,
    optimizer_s: 0,
    comm_s: 0,
    mfu: 0.01,
    hfu: 0.01,
    tokens_per_s: null,
    modules: { time_s: seconds, bound },
  };
  return { ...(tiny().payload as Record<string, unknown>), time };
}

describe("the Time column", () => {
  it("shows each module's time on the GPU and its bound, as the Python side computed them", () => {
    setup(training);
    const wire = (training as unknown as { time: { modules: { time_s: number[]; bound: string[] } } }).time.modules;
    expect(el.querySelector(".mw-table")?.classList.contains("mw-has-time")).toBe(true);
    expect(header("Time")).toBeDefined();
    // row 0 is the root (module 0)
    expect(timeCell(0).textContent).toBe(formatSeconds(wire.time_s[0] as number));
    expect(timeCell(0).dataset.bound).toBe(wire.bound[0]);
    expect(["compute", "memory", "comm"]).toContain(timeCell(0).dataset.bound);
    timeCell(0).dispatchEvent(new MouseEvent("mouseover", { bubbles: true }));
    expect(timeCell(0).title).toContain(`on H100 (${wire.bound[0]}-bound)`);
  });

  it("sorts siblings by time, a container by its children's", () => {
    const { app } = setup(timedTiny());
    expect(rowTexts(el)).toEqual(["TinyNet", "embed", "layers", "0–2", "head"]);
    header("Time").click(); // descending: embed 5 ms, head 2 ms, layers 0.3 ms
    app.render();
    expect(rowTexts(el)).toEqual(["TinyNet", "embed", "head", "layers", "0–2"]);
    header("Time").click(); // ascending
    app.render();
    expect(rowTexts(el)).toEqual(["TinyNet", "layers", "0–2", "head", "embed"]);
    expect(timeCell(0).textContent).toBe("7.3 ms");
    // the folded blocks 0–2: their three times summed, the slowest one's bound
    const group = rowTexts(el).indexOf("0–2");
    expect(timeCell(group).textContent).toBe("0.3 ms");
    expect(timeCell(group).dataset.bound).toBe("compute");
    expect(timeCell(rowTexts(el).indexOf("layers")).textContent).toBe("–"); // a container
  });

  it("is left out without a GPU", () => {
    setup(tiny().payload);
    expect(el.querySelector(".mw-table")?.classList.contains("mw-has-time")).toBe(false);
    expect(timeCell(0).textContent).toBe("");
    expect(timeCell(0).dataset.bound).toBe("");
  });

  it("takes a fixed column of its own", () => {
    const widths = (t: string): number[] => t.split(" ").map((x) => Number.parseInt(x, 10));
    const w = widths(columnLayout(1400, null, true).template);
    expect(w.slice(3)).toEqual([80, 98, 110, 104, 132]);
    expect(w.reduce((x, y) => x + y, 0)).toBeLessThanOrEqual(1400);
    expect(columnLayout(1400, null, true).minWidth).toBe(columnLayout(1400).minWidth + 132);
  });
});
