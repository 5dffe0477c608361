/**
 * The plan view of `mw.plan`, drawn from the Python side's own payload of a real plan (the tiny
 * Llama on 2 H100s in 700 MiB each: `python tests/test_explore_view.py` writes
 * `js/fixtures/plan.json`), and the analysis the kernel sends back when a point is clicked (the
 * recorded training sample stands in for it).
 */
import { afterEach, describe, expect, it } from "vitest";
import { draw } from "./explore";
import training from "./fixtures/gpt2-tiny.training.json";
import { decodePlan, failedGroups, indexRuns, planColumns, planVerdict, sortCandidates } from "./plan";
import { candidateText, gpuHoursText, isDrawn, labelBox, layoutText, paretoFront, tickSeconds, ticks, xRange } from "./planchart";
import type { PlanCandidate } from "./protocol";
import { fakeModel } from "./testmodel";

const files = import.meta.glob<{ default: unknown }>("./fixtures/plan.json", { eager: true });
const raw = files["./fixtures/plan.json"]?.default as Record<string, unknown> & { candidates: Record<string, unknown>[] };

/** The sample with one more candidate, refused before any trace (as a layout `analyze` refuses). */
function withRefused(): Record<string, unknown> {
  const refused = {
    ...raw.candidates[0],
    index: raw.candidates.length,
    tp: 2,
    fsdp: 1,
    peakBytes: null,
    fits: false,
    stepS: null,
    mfu: null,
    tokensPerS: null,
    samplesPerS: null,
    error: "LayoutError: tp=2 does not divide the 3 heads",
    openable: false,
  };
  return { ...raw, candidates: [...raw.candidates, refused] };
}

let el: HTMLElement;
afterEach(() => el?.remove());

function show(payload: unknown) {
  el = document.createElement("div");
  document.body.append(el);
  const model = fakeModel(payload);
  const cleanup = draw(el, "plan", payload, model as never);
  return { model, cleanup };
}

describe("the plan view", () => {
  const plan = decodePlan(raw)!;
  const traced = plan.candidates.filter(isDrawn);

  it("draws every candidate traced: fitting ones filled, the others hollow, the best ringed", () => {
    show(raw);
    const dots = [...el.querySelectorAll<SVGCircleElement>(".mw-plan-dot")];
    expect(dots).toHaveLength(traced.length);
    const fits = traced.filter((c) => (c.deviceBytes ?? Infinity) <= plan.budget).length; // 700 MiB on the GPU
    expect(el.querySelectorAll(".mw-plan-dot.mw-plan-in")).toHaveLength(fits);
    expect(el.querySelectorAll(".mw-plan-dot.mw-plan-out")).toHaveLength(traced.length - fits);
    expect(fits).toBeGreaterThan(0);
    expect(fits).toBeLessThan(traced.length);
    // the best: the most tokens per second among those that fit
    const fastest = traced.filter((c) => c.fits).sort((a, b) => (b.tokensPerS ?? 0) - (a.tokensPerS ?? 0))[0]!;
    const ring = el.querySelector(".mw-plan-best-ring")!.closest("g")!;
    expect(ring.getAttribute("data-index")).toBe(String(fastest.index));
    expect(el.querySelector(".mw-plan-verdict")!.textContent).toContain(`Fastest that fits: ${fastest.fsdp > 1 ? `fsdp=${fastest.fsdp}` : ""}`);
  });

  it("puts the budget where its bytes are, as a vertical dashed line", () => {
    show(raw);
    const line = el.querySelector<SVGLineElement>(".mw-plan-budget")!;
    expect(line.getAttribute("x1")).toBe(line.getAttribute("x2"));
    // every filled point is left of it, every hollow one right of it
    const x = Number(line.getAttribute("x1"));
    for (const d of el.querySelectorAll(".mw-plan-dot.mw-plan-in")) expect(Number(d.getAttribute("cx"))).toBeLessThanOrEqual(x);
    for (const d of el.querySelectorAll(".mw-plan-dot.mw-plan-out")) expect(Number(d.getAttribute("cx"))).toBeGreaterThan(x);
    expect(el.textContent).toContain("budget 700 MiB");
    // far above every peak (the default budget, a GPU's memory), it is an arrow at the edge
    expect(xRange({ ...plan, budget: 80 * 2 ** 30 }).budgetShown).toBe(false);
  });

  it("says that a candidate by the per-layer rule is traced at full depth when opened", () => {
    const ruled = { ...raw, candidates: raw.candidates.map((c) => ({ ...c, tracedLayers: [2, 3, 4] })) };
    show(ruled);
    const c = traced[0]!;
    (el.querySelector(`.mw-plan-point[data-index="${c.index}"]`) as SVGGElement).dispatchEvent(new MouseEvent("click"));
    expect(el.querySelector(".mw-plan-detail-head")!.textContent).toContain("tracing it at full depth");
  });

  it("says the candidate on hover: layout, checkpointing, precision, micro-batches, bytes on the GPU and peak, step, MFU", () => {
    show(raw);
    const c = traced[0]!;
    const g = el.querySelector(`.mw-plan-point[data-index="${c.index}"]`)!;
    g.dispatchEvent(new MouseEvent("mouseenter"));
    const tip = el.querySelector(".mw-plan-tip")!.textContent!;
    expect(tip).toBe(`#${c.index} ${candidateText(c)}`);
    expect(tip).toMatch(/^#0 fsdp=2 · no checkpointing · as given · 1 micro-batch: 620 MiB on the GPU \(peak 355 KiB\) · step 1.27 ms · MFU 0.0027%$/);
  });

  it("names a pipeline's degrees, schedule and stages a rank; the plan's own fixture has none", () => {
    expect(plan.candidates.every((c) => c.pp === 1 && c.schedule === null)).toBe(true);
    const piped = { ...raw.candidates[0], fsdp: 2, tp: 1, pp: 4, schedule: "interleaved-1F1B", virtualStages: 2 };
    const decoded = decodePlan({ ...raw, candidates: [piped] })!.candidates[0]!;
    expect(layoutText(decoded)).toBe("fsdp=2 pp=4 interleaved-1F1B x2");
    expect(candidateText(decoded)).toMatch(/^fsdp=2 pp=4 interleaved-1F1B x2 · /);
  });

  it("marks sequence parallelism after the degrees, and only with tensor-parallel ranks", () => {
    const sp = { ...raw.candidates[0], fsdp: 2, tp: 4, pp: 2, schedule: "1F1B", sequenceParallel: true };
    const decoded = decodePlan({ ...raw, candidates: [sp, { ...sp, tp: 1 }] })!.candidates;
    expect(layoutText(decoded[0]!)).toBe("fsdp=2 tp=4 pp=2 sp 1F1B");
    expect(layoutText(decoded[1]!)).toBe("fsdp=2 pp=2 1F1B");
    // the fixture's default layouts: its tensor-parallel ones shard the sequence, the others cannot
    expect(decodePlan(raw)!.candidates.every((c) => c.sequenceParallel === c.tp > 1)).toBe(true);
  });

  it("asks the kernel for a clicked candidate's analysis and shows it below when it comes", () => {
    const { model, cleanup } = show(raw);
    const c = traced[traced.length - 1]!;
    (el.querySelector(`.mw-plan-point[data-index="${c.index}"]`) as SVGGElement).dispatchEvent(new MouseEvent("click"));
    expect(model.sent).toEqual([{ type: "open", index: c.index }]);
    expect(el.querySelector(".mw-plan-detail-head")!.textContent).toMatch(/^Opening candidate/);
    // the kernel's answer: the detail trait
    model.set("detail", { index: c.index, payload: training });
    model.emit("change:detail");
    expect(el.querySelector(".mw-plan-detail-head")!.textContent).toBe(`Candidate #${c.index}: ${candidateText(c)}`);
    const detail = el.querySelector(".mw-plan-detail")!;
    expect(detail.querySelector(".mw-table")).not.toBeNull(); // the analysis widget's tree
    expect(detail.textContent).toContain("MFU"); // its header: the step on the H100
    expect(el.querySelector(`tr[data-index="${c.index}"]`)!.classList.contains("mw-plan-opened")).toBe(true);
    // a row of the table opens too
    (el.querySelector(`tr[data-index="${traced[0]!.index}"]`) as HTMLElement).click();
    expect(model.sent.at(-1)).toEqual({ type: "open", index: traced[0]!.index });
    cleanup();
    expect(model.count()).toBe(0);
  });

  it("lists the candidates not traced with their reason, and draws them not", () => {
    show(withRefused());
    expect(el.querySelectorAll(".mw-plan-dot")).toHaveLength(traced.length);
    expect(el.querySelectorAll(".mw-plan-table tr.mw-plan-row")).toHaveLength(traced.length);
    const failed = [...el.querySelectorAll(".mw-plan-failed li")].map((li) => li.textContent);
    expect(failed).toEqual([`#${traced.length} tp=2 · no checkpointing · as given · 1 micro-batch: LayoutError: tp=2 does not divide the 3 heads`]);
  });

  it("sorts the table by a column", () => {
    show(raw);
    const th = [...el.querySelectorAll<HTMLElement>(".mw-plan-table th")].find((e) => e.textContent === "step")!;
    th.click();
    const steps = (): number[] =>
      [...el.querySelectorAll<HTMLElement>(".mw-plan-table tr.mw-plan-row")].map((tr) => plan.candidates[Number(tr.dataset.index)]!.stepS!);
    expect(steps()).toEqual([...traced.map((c) => c.stepS)].sort((a, b) => a - b));
    [...el.querySelectorAll<HTMLElement>(".mw-plan-table th")].find((e) => e.textContent === "step")!.click();
    expect(steps()).toEqual([...traced.map((c) => c.stepS)].sort((a, b) => b - a));
    const byPeak = sortCandidates(traced as PlanCandidate[], 5, false).map((c) => c.peakBytes);
    expect(byPeak).toEqual([...traced.map((c) => c.peakBytes)].sort((a, b) => a - b));
  });

  it("keeps names as text and refuses what is not a plan", () => {
    show({ ...raw, gpu: "<img src=x onerror=alert(1)>" });
    expect(el.querySelector("img")).toBeNull();
    expect(planVerdict(decodePlan({ ...raw, best: null })!)).toMatch(/none fits\.$/);
    expect(decodePlan({ rows: [] })).toBeNull();
    expect(ticks(1e-3).at(-1)).toBeLessThanOrEqual(1e-3);
  });

  it("draws the Pareto front: the fitting candidates none beats on both step time and memory", () => {
    const fitting = traced.filter((c) => c.fits);
    const held = (c: PlanCandidate) => c.deviceBytes ?? c.peakBytes!;
    // the independent truth: a brute-force dominance check
    const truth = fitting
      .filter((c) => !fitting.some((o) => held(o) <= held(c) && o.stepS! <= c.stepS! && (held(o) < held(c) || o.stepS! < c.stepS!)))
      .map((c) => c.index)
      .sort((a, b) => a - b);
    expect(truth.length).toBeGreaterThan(0);
    expect(paretoFront(plan.candidates).map((c) => c.index).sort((a, b) => a - b)).toEqual(truth);
    show(raw);
    expect([...el.querySelectorAll(".mw-plan-pareto-mark")].map((m) => Number(m.getAttribute("data-front"))).sort((a, b) => a - b)).toEqual(truth);
    // the kernel's own flags win when every row has one
    const flagged = decodePlan({ ...raw, candidates: raw.candidates.map((c, i) => ({ ...c, pareto: i === 0 })) })!;
    expect(paretoFront(flagged.candidates).map((c) => c.index)).toEqual(flagged.candidates[0]!.fits ? [0] : []);
  });

  it("puts the best label where it covers no point, and lets clicks through it", () => {
    const area = { x0: 0, y0: 0, x1: 640, y1: 300 };
    // a point right of the best: the label goes left
    const b = labelBox([300, 150], [[330, 150]], 30, 12, area);
    expect(b.x1).toBeLessThan(300);
    // points right and left: above
    expect(labelBox([300, 150], [[330, 150], [270, 150]], 30, 12, area).y1).toBeLessThan(150);
    show(raw);
    const label = el.querySelector(".mw-plan-best-label")!;
    expect(label.getAttribute("pointer-events")).toBe("none");
    expect(label.closest(".mw-plan-point")).toBeNull();
  });

  it("puts 4 to 6 nice ticks on the step axis, in the fewest digits, clear of the axis title", () => {
    // 82 s: a step of 20 (not 50, which left one tick above 0)
    expect(ticks(82, 5)).toEqual([0, 20, 40, 60, 80]);
    expect(ticks(0.0082, 5)).toEqual([0, 0.002, 0.004, 0.006, 0.008]);
    expect(ticks(1.3, 5)).toEqual([0, 0.2, 0.4, 0.6, 0.8, 1, 1.2]);
    for (const max of [3e-5, 0.7, 1.12, 9.9, 82, 640]) {
      const t = ticks(max, 5);
      expect(t.length).toBeGreaterThanOrEqual(4);
      expect(t.length).toBeLessThanOrEqual(8);
      expect(t.at(-1)).toBeLessThanOrEqual(max);
    }
    expect([0, 50, 0.25, 0.0015, 4e-5, 0.30000000000000004].map(tickSeconds)).toEqual(["0", "50 s", "250 ms", "1.5 ms", "40 µs", "300 ms"]);
    show(raw);
    const yTicks = [...el.querySelectorAll<SVGTextElement>(".mw-plan-tick[text-anchor='end']")];
    expect(yTicks.length).toBeGreaterThanOrEqual(3);
    for (const t of yTicks) {
      // its text ends at its x; at 11px about 6.5px a character: it starts right of the title (x 12, 11px high)
      expect(Number(t.getAttribute("x")) - 6.5 * (t.textContent ?? "").length).toBeGreaterThan(18);
    }
  });

  it("draws only the candidates that fit when asked, their axes spanning them", () => {
    show(raw);
    const fitting = traced.filter((c) => c.fits);
    const buttons = [...el.querySelectorAll<HTMLButtonElement>(".mw-plan-zoom .mw-seg-btn")];
    expect(buttons.map((b) => b.textContent)).toEqual(["all traced", "those that fit"]);
    buttons[1]!.click();
    expect(el.querySelectorAll(".mw-plan-dot")).toHaveLength(fitting.length);
    expect(el.querySelectorAll(".mw-plan-dot.mw-plan-out")).toHaveLength(0);
    expect(buttons[1]!.classList.contains("mw-active")).toBe(true);
    // the x axis spans the fitting points (and the budget): never the larger ones left out
    const largest = Math.max(...traced.map((c) => c.deviceBytes ?? c.peakBytes!));
    expect(xRange(plan, fitting as never).max).toBeLessThan(xRange(plan).max + 1);
    expect(xRange(plan, fitting as never).max).toBeLessThanOrEqual(Math.max(largest, plan.budget) * 1.1);
    buttons[0]!.click();
    expect(el.querySelectorAll(".mw-plan-dot")).toHaveLength(traced.length);
    // a plan where everything fits has no switch
    show({ ...raw, candidates: raw.candidates.filter((c) => c.fits === true) });
    expect(el.querySelector(".mw-plan-zoom")).toBeNull();
  });

  it("says each reason once for the candidates that share it, folded when there are many", () => {
    expect(indexRuns([12, 0, 1, 2, 3, 8, 10, 11])).toBe("#0–3, #8, #10–12");
    expect(indexRuns([5])).toBe("#5");
    const base = raw.candidates[0]!;
    const refused = (index: number, tp: number, error: string) => ({ ...base, index, tp, fsdp: 1, peakBytes: null, stepS: null, fits: false, error, openable: false });
    const n = raw.candidates.length;
    const same = "LayoutError: global_batch=4 does not divide over the 8 data-parallel ranks";
    const payload = {
      ...raw,
      candidates: [...raw.candidates, refused(n, 2, same), refused(n + 1, 2, same), refused(n + 2, 2, same), refused(n + 3, 4, "LayoutError: tp=4 does not divide the 3 heads")],
    };
    const groups = failedGroups(decodePlan(payload)!.candidates.filter((c) => !isDrawn(c)));
    expect(groups.map((g) => g.candidates.length)).toEqual([3, 1]);
    show(payload);
    const box = el.querySelector<HTMLDetailsElement>(".mw-plan-failed-box")!;
    expect(box.open).toBe(true);
    expect(box.querySelector("summary")!.textContent).toBe("Not traced or failed (4, 2 reasons)");
    const items = [...box.querySelectorAll(".mw-plan-failed li")].map((li) => li.textContent);
    expect(items[0]).toBe(`#${n}–${n + 2} (3 candidates of tp=2): ${same}`);
    expect(items[1]).toMatch(new RegExp(`^#${n + 3} tp=4 · `));
    // 11 reasons: folded under the count
    const many = { ...raw, candidates: [...raw.candidates, ...Array.from({ length: 11 }, (_, i) => refused(n + i, 2, `reason ${i}`))] };
    show(many);
    expect(el.querySelector<HTMLDetailsElement>(".mw-plan-failed-box")!.open).toBe(false);
  });

  it("prices a plan for its tokens: a GPU-hours column, sortable, and the best's cost in the verdict", () => {
    expect(plan.tokens).toBeNull();
    show(raw);
    expect([...el.querySelectorAll(".mw-plan-table th")].map((th) => th.textContent)).not.toContain("GPU-h");
    // priced as Plan.for_tokens(1e9) prices it: devices x tokens / tokens_per_s / 3600
    const tokens = 1e9;
    const priced = {
      ...raw,
      tokens,
      candidates: raw.candidates.map((c) => ({ ...c, gpuHours: typeof c.tokensPerS === "number" ? (plan.devices * tokens) / c.tokensPerS / 3600 : null })),
    };
    const p = decodePlan(priced)!;
    expect(p.tokens).toBe(tokens);
    expect(planColumns(p).at(-1)!.label).toBe("GPU-h");
    show(priced);
    const heads = [...el.querySelectorAll<HTMLElement>(".mw-plan-table th")];
    expect(heads.at(-1)!.textContent).toBe("GPU-h");
    expect(heads.at(-1)!.title).toContain("1.00 B tokens");
    const best = p.candidates.find((c) => c.index === p.best)!;
    const cell = el.querySelector(`tr[data-index="${best.index}"] td:last-child`)!;
    expect(cell.textContent).toBe(gpuHoursText(best.gpuHours!));
    expect(planVerdict(p)).toContain(`; ${gpuHoursText(best.gpuHours!)} GPU-hours for 1.00 B tokens.`);
    // sorted by it: the fastest rate first, the cheapest
    heads.at(-1)!.click();
    const first = el.querySelector<HTMLElement>(".mw-plan-table tr.mw-plan-row")!;
    const fastest = Math.max(...p.candidates.filter(isDrawn).map((c) => c.tokensPerS!));
    expect(p.candidates[Number(first.dataset.index)]!.tokensPerS).toBe(fastest);
    expect([30_840_000, 1234.5, 4.567].map(gpuHoursText)).toEqual(["30,800,000", "1,230", "4.57"]);
  });

  it("names each checkpointing setting (none, modules, selective, whole blocks) and sorts them by what is recomputed", () => {
    // the sample's candidates, every other one with checkpointing True made "selective" and
    // two without it given modules, as plan(activation_checkpointing=[False, ["LlamaMLP"],
    // "selective", True]) sends them
    let n = 0;
    let m = 0;
    const names = [["LlamaMLP"], ["layers.0", "layers.1", "layers.2", "layers.3"]];
    const mixed = {
      ...raw,
      candidates: raw.candidates.map((c) =>
        c.checkpointing === true ? (n++ % 2 === 0 ? { ...c, checkpointing: "selective" } : c) : m < 2 ? { ...c, checkpointing: names[m++] } : c,
      ),
    };
    const p = decodePlan(mixed)!;
    expect(new Set(p.candidates.map((c) => c.checkpointing))).toEqual(new Set(["none", "modules", "selective", "full"]));
    const [mlp, blocks] = p.candidates.filter((c) => c.checkpointing === "modules");
    expect(candidateText(mlp!)).toContain(" · checkpointing LlamaMLP · ");
    expect(candidateText(blocks!)).toContain(" · checkpointing layers.0, layers.1 and 2 more · ");
    const sel = p.candidates.find((c) => c.checkpointing === "selective" && isDrawn(c))!;
    const full = p.candidates.find((c) => c.checkpointing === "full" && isDrawn(c))!;
    expect(candidateText(sel)).toContain(" · selective checkpointing · ");
    expect(candidateText(full)).toMatch(/ · checkpointing · /);
    show(mixed);
    const heads = [...el.querySelectorAll<HTMLElement>(".mw-plan-table th")];
    const k = heads.findIndex((th) => th.textContent === "ckpt");
    const cells = () => [...el.querySelectorAll<HTMLElement>(".mw-plan-table tr.mw-plan-row")].map((tr) => tr.children[k]!.textContent);
    expect(new Set(cells())).toEqual(new Set(["no", "LlamaMLP", "layers.0, layers.1 and 2 more", "selective", "full"]));
    heads[k]!.click(); // ascending: none, then modules named, then selective, then whole blocks
    const order = cells();
    expect(order.lastIndexOf("no")).toBeLessThan(order.indexOf("LlamaMLP"));
    expect(order.lastIndexOf("LlamaMLP")).toBeLessThan(order.indexOf("selective"));
    expect(order.lastIndexOf("selective")).toBeLessThan(order.indexOf("full"));
    const kind = (t: string) => ({ no: "none", selective: "selective", full: "full" })[t] ?? "modules";
    expect(sortCandidates(p.candidates, k, false).map((c) => c.checkpointing)).toEqual(order.map((t) => kind(t!)));
  });

  it("shows what the traces said of the model (Plan.notes) under the verdict, and nothing without", () => {
    show(raw);
    expect(el.querySelectorAll(".mw-plan-note")).toHaveLength(0);
    const note = "plan: the candidates' traces say: LlamaDecoderLayer ran checkpointed with a KV cache to write";
    expect(decodePlan({ ...raw, notes: [note, 3] })!.notes).toEqual([note]);
    show({ ...raw, notes: [note] });
    const shown = [...el.querySelectorAll<HTMLElement>(".mw-plan-note")];
    expect(shown.map((n) => n.textContent)).toEqual([note]);
    expect(shown[0]!.previousElementSibling!.classList.contains("mw-plan-verdict")).toBe(true);
  });
});
