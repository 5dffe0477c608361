/**
 * The plan view of `mw.plan` (`meta_widget/explore/plan_view.py`): the answer in one line,
 * the chart of every candidate traced (`planchart.ts`), a table of them (click a header to
 * sort), the candidates not traced with their reason, and below, the analysis of the
 * candidate the user opened. Opening (a click on a point or a row) sends
 * `{type: "open", index}`; the kernel answers with the `detail` trait (`{index, payload}`),
 * drawn here by the analysis widget's own view (`App`, no kernel behind it). Text only
 * through `textContent`.
 */
import { App } from "./app";
import { decodePayload } from "./decode";
import { h } from "./details";
import { formatBytes, formatCount } from "./format";
import { canZoom, candidateText, checkpointingText, gpuHoursText, heldBytes, isDrawn, layoutText, modulesText, planChart, precisionClasses, RECOMPUTED } from "./planchart";
import type { PlanCandidate, PlanPayload } from "./protocol";
import { formatSeconds } from "./timing";

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);
const numOrNull = (v: unknown): number | null => (typeof v === "number" && Number.isFinite(v) ? v : null);
const int = (v: unknown, fallback = 1): number => (typeof v === "number" && Number.isInteger(v) ? v : fallback);

/** `activation_checkpointing` as the kernel sends it: false, true, "selective" or names. */
function decodeCheckpointing(raw: unknown): Pick<PlanCandidate, "checkpointing" | "checkpointedModules"> {
  const names = Array.isArray(raw) ? raw.filter((n): n is string => typeof n === "string") : [];
  if (names.length) return { checkpointing: "modules", checkpointedModules: names };
  return { checkpointing: raw === true ? "full" : raw === "selective" ? "selective" : "none", checkpointedModules: [] };
}

function decodeCandidate(raw: Obj, i: number): PlanCandidate {
  return {
    index: int(raw.index, i),
    replicate: int(raw.replicate),
    fsdp: int(raw.fsdp),
    tp: int(raw.tp),
    pp: int(raw.pp),
    cp: int(raw.cp),
    ep: int(raw.ep),
    schedule: typeof raw.schedule === "string" ? raw.schedule : null,
    virtualStages: int(raw.virtualStages),
    sequenceParallel: raw.sequenceParallel === true,
    ...decodeCheckpointing(raw.checkpointing),
    precision: typeof raw.precision === "string" ? raw.precision : "",
    microBatches: int(raw.microBatches),
    peakBytes: numOrNull(raw.peakBytes),
    deviceBytes: numOrNull(raw.deviceBytes),
    fits: raw.fits === true,
    stepS: numOrNull(raw.stepS),
    mfu: numOrNull(raw.mfu),
    tokensPerS: numOrNull(raw.tokensPerS),
    samplesPerS: numOrNull(raw.samplesPerS),
    error: typeof raw.error === "string" ? raw.error : null,
    openable: raw.openable === true,
    tracedLayers: Array.isArray(raw.tracedLayers) ? raw.tracedLayers.filter((d): d is number => typeof d === "number") : [],
    ...(typeof raw.pareto === "boolean" ? { pareto: raw.pareto } : {}),
    ...(raw.gpuHours !== undefined || raw.gpu_hours !== undefined ? { gpuHours: numOrNull(raw.gpuHours ?? raw.gpu_hours) } : {}),
  };
}

/** The payload as sent by `plan_view.plan_payload`, or null. */
export function decodePlan(raw: unknown): PlanPayload | null {
  if (!isObj(raw) || !Array.isArray(raw.candidates) || typeof raw.budget !== "number") return null;
  return {
    title: typeof raw.title === "string" ? raw.title : "model",
    gpu: typeof raw.gpu === "string" ? raw.gpu : "GPU",
    devices: int(raw.devices),
    mode: typeof raw.mode === "string" ? raw.mode : "training",
    budget: raw.budget,
    best: numOrNull(raw.best),
    tokens: numOrNull(raw.tokens),
    notes: Array.isArray(raw.notes) ? raw.notes.filter((n): n is string => typeof n === "string") : [],
    candidates: raw.candidates.filter(isObj).map(decodeCandidate),
  };
}

/** The answer in one line: the best candidate, or that none fits. */
export function planVerdict(p: PlanPayload): string {
  const traced = p.candidates.filter(isDrawn);
  const fit = traced.filter((c) => c.fits).length;
  const head = `${p.candidates.length} candidates on ${p.devices} × ${p.gpu}, ${traced.length} traced, ${fit} fit ${formatBytes(p.budget)} per device`;
  const best = p.candidates.find((c) => c.index === p.best);
  if (!best || !isDrawn(best)) return `${head}; none fits.`;
  const rate = best.tokensPerS !== null ? `, ${Math.round(best.tokensPerS).toLocaleString("en-US")} tokens/s` : "";
  const cost = p.tokens !== null && typeof best.gpuHours === "number" ? `; ${gpuHoursText(best.gpuHours)} GPU-hours for ${formatCount(p.tokens)} tokens` : "";
  return `${head}. Fastest that fits: ${layoutText(best)}, ${checkpointingText(best)}, ${best.precision}, ${best.microBatches} micro-batch${best.microBatches === 1 ? "" : "es"}: step ${formatSeconds(best.stepS)}${rate}, ${formatBytes(heldBytes(best))} on the GPU (peak ${formatBytes(best.peakBytes)})${cost}.`;
}

export interface TableColumn {
  label: string;
  /** What the column holds: its header's tooltip. */
  hint: string;
  text: (c: PlanCandidate) => string;
  /** What it sorts by; absent: not sortable. */
  value?: (c: PlanCandidate) => number | string;
  numeric?: boolean;
  /** Left out of a narrow table (its values stay in the row's tooltip): 1 first, then 2. */
  drop?: 1 | 2;
  /** Its text may wrap (words, not numbers). */
  wraps?: boolean;
}

const or = (v: number | null, f: (n: number) => string): string => (v === null ? "–" : f(v));

const TABLE: TableColumn[] = [
  { label: "#", hint: "the candidate's index in plan.candidates", text: (c) => String(c.index), value: (c) => c.index, numeric: true },
  { label: "layout", hint: "how the devices split the model", text: layoutText, value: layoutText, wraps: true },
  {
    label: "ckpt",
    hint: "activation checkpointing",
    text: (c) => (c.checkpointing === "modules" ? modulesText(c.checkpointedModules) : { none: "no", full: "full", selective: "selective" }[c.checkpointing]),
    value: (c) => RECOMPUTED[c.checkpointing],
    drop: 2,
    wraps: true,
  },
  { label: "precision", hint: "the precision tried", text: (c) => c.precision, value: (c) => c.precision, wraps: true },
  { label: "µ-batches", hint: "micro-batches per step", text: (c) => String(c.microBatches), value: (c) => c.microBatches, numeric: true, drop: 2 },
  {
    label: "peak",
    hint: "rank 0's traced peak: what its tensors hold",
    text: (c) => or(c.peakBytes, formatBytes),
    value: (c) => c.peakBytes ?? Infinity,
    numeric: true,
  },
  {
    label: "on GPU",
    hint: "what rank 0's GPU holds at that peak (as nvidia-smi shows it): what fits holds against the budget",
    text: (c) => or(c.deviceBytes ?? c.peakBytes, formatBytes),
    value: (c) => c.deviceBytes ?? c.peakBytes ?? Infinity,
    numeric: true,
    drop: 1,
  },
  { label: "fits", hint: "on the GPU within the budget", text: (c) => (c.fits ? "yes" : "no"), value: (c) => Number(c.fits) },
  { label: "step", hint: "the estimated step time", text: (c) => or(c.stepS, formatSeconds), value: (c) => c.stepS ?? Infinity, numeric: true },
  {
    label: "MFU",
    hint: "model FLOPs utilization",
    text: (c) => or(c.mfu, (m) => `${(m * 100).toPrecision(2)}%`),
    value: (c) => c.mfu ?? -1,
    numeric: true,
  },
  {
    label: "tokens/s",
    hint: "tokens per second, all devices",
    text: (c) => or(c.tokensPerS, (t) => Math.round(t).toLocaleString("en-US")),
    value: (c) => c.tokensPerS ?? -1,
    numeric: true,
    drop: 1,
  },
];

/** The GPU-hours column, in a priced plan's table only (`Plan.for_tokens`). */
function gpuHoursColumn(tokens: number): TableColumn {
  return {
    label: "GPU-h",
    hint: `the GPU-hours (all devices) ${formatCount(tokens)} tokens take: devices x tokens / tokens per second`,
    text: (c) => or(c.gpuHours ?? null, gpuHoursText),
    value: (c) => c.gpuHours ?? Infinity,
    numeric: true,
  };
}

/** The table's columns: a priced plan's have its GPU-hours last. */
export function planColumns(p: PlanPayload): TableColumn[] {
  return p.tokens === null ? TABLE : [...TABLE, gpuHoursColumn(p.tokens)];
}

/** A cell's classes: numeric, wrapping, and when a narrow table leaves its column out. */
function cellClass(col: TableColumn): string {
  return [col.numeric ? "mw-num" : "", col.wraps ? "mw-plan-wraps" : "", col.drop ? `mw-plan-drop${col.drop}` : ""].filter(Boolean).join(" ");
}

/** `rows` sorted by column `k` of `columns` (`descending`), equal ones in their order. */
export function sortCandidates(rows: readonly PlanCandidate[], k: number, descending: boolean, columns: readonly TableColumn[] = TABLE): PlanCandidate[] {
  const value = columns[k]?.value;
  if (!value) return [...rows];
  return rows
    .map((c, i) => ({ c, i, v: value(c) }))
    .sort((a, b) => {
      const d = a.v < b.v ? -1 : a.v > b.v ? 1 : 0;
      return (descending ? -d : d) || a.i - b.i;
    })
    .map((e) => e.c);
}

export interface PlanHandlers {
  /** Ask for candidate `index`'s analysis (the kernel answers with `detail`). */
  onOpen(index: number): void;
}

export interface PlanView {
  /** Show the `detail` trait: `{index, payload}`, or `{}` (nothing opened). */
  showDetail(detail: unknown): void;
  destroy(): void;
}

/** Render the plan view into `el` (replacing what was there). */
export function renderPlan(el: HTMLElement, p: PlanPayload, handlers: PlanHandlers): PlanView {
  el.replaceChildren();
  const root = h("div", "mw-root mw-plan");
  root.append(h("div", "mw-plan-title", `Plan: ${p.title}, ${p.mode} on ${p.devices} × ${p.gpu}`));
  root.append(h("div", "mw-plan-verdict", planVerdict(p)));
  for (const note of p.notes) root.append(h("div", "mw-note mw-plan-note", note));
  const tip = h("div", "mw-plan-tip", "Hover a point for its candidate; click one to open its analysis.");
  let opened = -1;
  const table = h("table", "mw-plan-table");
  const open = (c: PlanCandidate): void => {
    if (!c.openable) return;
    opened = c.index;
    mark();
    const full = c.tracedLayers?.length ? " (tracing it at full depth: its numbers came from the per-layer rule)" : "";
    detailHead.textContent = `Opening candidate #${c.index}: ${candidateText(c)}${full}…`;
    handlers.onOpen(c.index);
  };
  const chartHandlers = {
    onHover: (c: PlanCandidate | null) =>
      (tip.textContent = c ? `#${c.index} ${candidateText(c)}` : "Hover a point for its candidate; click one to open its analysis."),
    onOpen: open,
  };
  // drawn at its box's width in pixels (not a fixed drawing scaled down), so that its text keeps
  // its size in a narrow notebook; redrawn when the box's width changes
  const chartBox = h("div", "mw-plan-chart-box");
  let chartWidth = 0;
  let fitting = false; // the chart shows only the candidates that fit
  const drawChart = (): void => {
    const width = chartSize(chartBox.clientWidth);
    if (width === chartWidth) return;
    chartWidth = width;
    chartBox.replaceChildren(planChart(p, chartHandlers, width, CHART_HEIGHT, fitting));
    mark();
  };
  const resize = typeof ResizeObserver === "undefined" ? null : new ResizeObserver(drawChart);
  resize?.observe(chartBox);
  const zoom = canZoom(p)
    ? zoomSwitch((only) => {
        fitting = only;
        chartWidth = 0; // drawn again, at the same width
        drawChart();
      })
    : null;
  root.append(legend(p), ...(zoom ? [zoom] : []), chartBox, tip);
  const sort = { column: -1, descending: false };
  const columns = planColumns(p);
  const drawTable = (): void => {
    const rows = sort.column < 0 ? p.candidates.filter(isDrawn) : sortCandidates(p.candidates.filter(isDrawn), sort.column, sort.descending, columns);
    table.replaceChildren(tableHead(columns, sort, (k) => {
      sort.descending = sort.column === k ? !sort.descending : false;
      sort.column = k;
      drawTable();
    }));
    for (const c of rows) table.append(tableRow(columns, c, p.best, open));
    mark();
  };
  const mark = (): void => {
    for (const e of root.querySelectorAll("[data-index]")) {
      e.classList.toggle("mw-plan-opened", Number(e.getAttribute("data-index")) === opened);
    }
  };
  drawTable();
  drawChart();
  const scroller = h("div", "mw-plan-table-wrap");
  scroller.append(table);
  root.append(h("div", "mw-plan-subhead", "Candidates traced (click a header to sort, a row to open its analysis)"), scroller);
  const failed = p.candidates.filter((c) => !isDrawn(c));
  if (failed.length) root.append(failedList(failed));
  const detailHead = h("div", "mw-plan-detail-head");
  const detailHost = h("div", "mw-plan-detail");
  root.append(detailHead, detailHost);
  el.append(root);
  let app: App | null = null;
  return {
    showDetail(detail: unknown): void {
      app?.destroy();
      app = null;
      detailHost.replaceChildren();
      const index = isObj(detail) ? numOrNull(detail.index) : null;
      const c = p.candidates.find((x) => x.index === index);
      const analysis = isObj(detail) ? decodePayload(detail.payload) : null;
      if (!c || !analysis) {
        if (opened < 0) detailHead.textContent = "";
        return;
      }
      opened = c.index;
      mark();
      detailHead.textContent = `Candidate #${c.index}: ${candidateText(c)}`;
      app = new App(detailHost);
      app.setAnalysis(analysis);
      app.render();
    },
    destroy(): void {
      resize?.disconnect();
      app?.destroy();
      app = null;
    },
  };
}

const CHART_HEIGHT = 300;

/** "all traced | those that fit": which candidates the chart draws (`onPick(true)`: those that fit). */
function zoomSwitch(onPick: (fitting: boolean) => void): HTMLDivElement {
  const box = h("div", "mw-seg mw-plan-zoom");
  box.title = "Which candidates the chart draws (its axes span them): every one traced, or those that fit the budget";
  const buttons = (["all traced", "those that fit"] as const).map((label, i) => {
    const b = h("button", `mw-seg-btn${i === 0 ? " mw-active" : ""}`, label);
    b.type = "button";
    b.dataset.fitting = String(i === 1);
    b.addEventListener("click", () => {
      for (const o of buttons) o.classList.toggle("mw-active", o === b);
      onPick(i === 1);
    });
    return b;
  });
  box.append(...buttons);
  return box;
}

/** The candidates not traced (or failed) by reason, in the order of each reason's first. */
export function failedGroups(failed: readonly PlanCandidate[]): { reason: string; candidates: PlanCandidate[] }[] {
  const groups = new Map<string, PlanCandidate[]>();
  for (const c of failed) {
    const reason = c.error ?? "not traced";
    (groups.get(reason) ?? groups.set(reason, []).get(reason))?.push(c);
  }
  return [...groups].map(([reason, candidates]) => ({ reason, candidates }));
}

/** "#3", "#0–11", "#0–3, #8, #10–12": indices, runs of consecutive ones joined. */
export function indexRuns(indices: readonly number[]): string {
  const sorted = [...indices].sort((a, b) => a - b);
  const runs: string[] = [];
  for (let i = 0; i < sorted.length; ) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === (sorted[j] as number) + 1) j++;
    runs.push(j > i ? `#${sorted[i]}–${sorted[j]}` : `#${sorted[i]}`);
    i = j + 1;
  }
  return runs.join(", ");
}

/** The candidates not traced, each reason said once for all its candidates; open while short
 * (10 reasons or fewer), else folded under its count. */
function failedList(failed: readonly PlanCandidate[]): HTMLElement {
  const groups = failedGroups(failed);
  const box = h("details", "mw-plan-failed-box");
  box.open = groups.length <= 10;
  const reasons = groups.length === failed.length ? "" : `, ${groups.length} reasons`;
  box.append(h("summary", "mw-plan-subhead", `Not traced or failed (${failed.length}${reasons})`));
  const list = h("ul", "mw-plan-failed");
  for (const { reason, candidates } of groups) {
    const [first] = candidates;
    if (candidates.length === 1 && first) {
      list.append(h("li", "", `#${first.index} ${candidateText(first)}`));
      continue;
    }
    const layouts = [...new Set(candidates.map(layoutText))];
    const which = layouts.length <= 3 ? ` of ${layouts.join(", ")}` : "";
    list.append(h("li", "", `${indexRuns(candidates.map((c) => c.index))} (${candidates.length} candidates${which}): ${reason}`));
  }
  box.append(list);
  return box;
}

/** The chart's width for a box `box` pixels wide: the box's, from 320 to 680 (640 unknown). */
export function chartSize(box: number): number {
  return box > 0 ? Math.round(Math.min(680, Math.max(320, box))) : 640;
}

/** The precisions' colors, and what filled and hollow mean. */
function legend(p: PlanPayload): HTMLDivElement {
  const box = h("div", "mw-plan-legend");
  for (const [precision, cls] of precisionClasses(p.candidates)) {
    const item = h("span");
    item.append(h("span", `mw-plan-swatch ${cls}`), document.createTextNode(precision));
    box.append(item);
  }
  box.append(h("span", "mw-plan-key", "filled: fits · hollow: over the budget · ringed: the best · line: the Pareto front"));
  return box;
}

function tableHead(columns: readonly TableColumn[], sort: { column: number; descending: boolean }, onSort: (k: number) => void): HTMLTableRowElement {
  const tr = h("tr");
  columns.forEach((col, k) => {
    const th = h("th", cellClass(col), col.label);
    th.title = col.hint;
    if (col.value) {
      th.classList.add("mw-sortable");
      th.title = `${col.hint} (click to sort, again to reverse)`;
      if (sort.column === k) th.dataset.dir = sort.descending ? "desc" : "asc";
      th.addEventListener("click", () => onSort(k));
    }
    tr.append(th);
  });
  return tr;
}

function tableRow(columns: readonly TableColumn[], c: PlanCandidate, best: number | null, open: (c: PlanCandidate) => void): HTMLTableRowElement {
  const tr = h("tr", `mw-plan-row${c.fits ? "" : " mw-plan-over"}${c.index === best ? " mw-plan-best" : ""}`);
  tr.dataset.index = String(c.index);
  for (const col of columns) tr.append(h("td", cellClass(col), col.text(c)));
  tr.title = candidateText(c);
  tr.addEventListener("click", () => open(c));
  return tr;
}
