/**
 * The Stages tab of a pipeline-parallel analysis (`analyze(..., parallel=mw.Parallel(pp=P))`):
 * decoded from the payload's `stages` object (absent without a pipeline, so other payloads
 * decode unchanged) and drawn as
 *
 * - each pipeline rank's peak side by side, stacked by memory category, the highest marked and
 *   the GPU's memory as a budget line (`gpu=`);
 * - the schedule each rank ran: its forward (F), backward (B) and weight-gradient (W) actions in
 *   the time slots the kernel laid them out in (every action one slot), the idle slots hatched:
 *   the bubble, its share written for each rank;
 * - each rank's numbers (stages and layers, peak, step time, bytes sent and received) and the
 *   collectives of the selected rank per mesh dimension.
 *
 * Plain DOM, every name as text; the numbers are the kernel's (`views/stages.py`), formatted.
 */
import { budgetInView, budgetLegend, gpuBudget } from "./budget";
import { h } from "./details";
import { formatBytes } from "./format";
import type { Analysis } from "./protocol";
import { categoryColor } from "./stack";
import { formatSeconds } from "./timing";

/** One action a rank's schedule ran: forward, backward (input, or full), weight gradient. */
export interface StageAction {
  kind: "F" | "B" | "W";
  stage: number;
  microbatch: number;
  /** Its time slot (0 ..  `Stages.slots` - 1). */
  slot: number;
}

/** A rank's collectives of one step, summed per mesh dimension and collective. */
export interface DimensionComms {
  group: string;
  collective: string;
  calls: number;
  bytes: number;
}

export interface StageRank {
  rank: number;
  /** The pipeline stages it runs (one, or `virtual_stages` of them). */
  stages: number[];
  /** The model's module paths its stages hold. */
  modules: string[];
  peakBytes: number;
  /** Its peak by memory category. */
  categories: Record<string, number>;
  /** The share of the step's slots it waits. */
  bubble: number;
  /** Its step time on the GPU (`gpu=`), its bubble included; null without one. */
  stepS: number | null;
  sendBytes: number;
  recvBytes: number;
  actions: StageAction[];
  comms: DimensionComms[];
}

export interface Stages {
  pp: number;
  schedule: string;
  virtualStages: number;
  microbatches: number;
  /** The pipeline rank the rest of the view (tree, header, other tabs) shows: the highest peak. */
  shown: number;
  /** The schedule's time slots. */
  slots: number;
  ranks: StageRank[];
}

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);
const num = (v: unknown): number => (typeof v === "number" && Number.isFinite(v) ? v : 0);
const list = (v: unknown): unknown[] => (Array.isArray(v) ? v : []);
const text = (v: unknown): string => (typeof v === "string" ? v : "");
const KINDS = ["F", "B", "W"] as const;

function decodeRank(raw: Obj): StageRank {
  const slots = list(raw.slots).map(num);
  const actions: StageAction[] = [];
  list(raw.actions).forEach((a, i) => {
    const [kind, stage, microbatch] = list(a);
    if (!(KINDS as readonly unknown[]).includes(kind)) return;
    actions.push({ kind: kind as StageAction["kind"], stage: num(stage), microbatch: num(microbatch), slot: slots[i] ?? i });
  });
  const categories: Record<string, number> = {};
  if (isObj(raw.categories)) for (const [k, v] of Object.entries(raw.categories)) categories[k] = num(v);
  return {
    rank: num(raw.rank),
    stages: list(raw.stages).map(num),
    modules: list(raw.modules).map(text),
    peakBytes: num(raw.peak_bytes),
    categories,
    bubble: num(raw.bubble),
    stepS: typeof raw.step_s === "number" ? raw.step_s : null,
    sendBytes: num(raw.send_bytes),
    recvBytes: num(raw.recv_bytes),
    actions,
    comms: list(raw.comms).map((c) => {
      const [group, collective, calls, bytes] = list(c);
      return { group: text(group), collective: text(collective), calls: num(calls), bytes: num(bytes) };
    }),
  };
}

/** The payload's `stages` object; undefined when absent or malformed (no pipeline). */
export function decodeStages(raw: unknown): Stages | undefined {
  if (!isObj(raw)) return undefined;
  const ranks = list(raw.ranks).filter(isObj).map(decodeRank);
  if (!ranks.length) return undefined;
  return {
    pp: num(raw.pp) || ranks.length,
    schedule: text(raw.schedule),
    virtualStages: num(raw.virtual_stages) || 1,
    microbatches: num(raw.microbatches),
    shown: Math.min(num(raw.shown), ranks.length - 1),
    slots: Math.max(num(raw.slots), ...ranks.flatMap((r) => r.actions.map((a) => a.slot + 1))),
    ranks,
  };
}

/**
 * A rank's modules in a few words: "embed_tokens, layers 0–1", "layers 2–3, norm, lm_head"
 * (consecutive layers as a range, `model.` left out).
 */
export function moduleSummary(modules: readonly string[]): string {
  const out: string[] = [];
  let run: { prefix: string; lo: number; hi: number } | null = null;
  const flush = (): void => {
    if (run) out.push(run.lo === run.hi ? `${run.prefix} ${run.lo}` : `${run.prefix} ${run.lo}–${run.hi}`);
    run = null;
  };
  for (const path of modules) {
    const short = path.replace(/^model\./, "");
    const m = /^(.*)\.(\d+)$/.exec(short);
    if (m && m[1] !== undefined && m[2] !== undefined) {
      const i = Number(m[2]);
      const r = run as { prefix: string; lo: number; hi: number } | null;
      if (r && r.prefix === m[1] && r.hi + 1 === i) r.hi = i;
      else {
        flush();
        run = { prefix: m[1], lo: i, hi: i };
      }
      continue;
    }
    flush();
    out.push(short);
  }
  flush();
  return out.join(", ");
}

/** "pipeline rank 1" with its stages: "stage 1", "stages 1, 5". */
function stagesText(r: StageRank): string {
  return `stage${r.stages.length > 1 ? "s" : ""} ${r.stages.join(", ")}`;
}

const ACTION_WORDS: Record<StageAction["kind"], string> = {
  F: "forward",
  B: "backward",
  W: "weight gradient",
};

/** The smallest slot width, in px, that holds "F12"; narrower slots show the number, then nothing. */
const FULL_LABEL_PX = 26;
const NUMBER_LABEL_PX = 14;

/** The categories drawn in the peak bars, in the order of the memory report's. */
function categoryOrder(ranks: readonly StageRank[]): string[] {
  const names: string[] = [];
  for (const r of ranks) for (const k of Object.keys(r.categories)) if (!names.includes(k)) names.push(k);
  return names.filter((k) => ranks.some((r) => (r.categories[k] ?? 0) > 0));
}

/** The Stages tab: renders from the analysis; remembers only which rank's collectives show. */
export class StagesView {
  readonly el = h("div", "mw-stages");
  private selected: number | null = null;
  private last: { a: Analysis; width: number } | null = null;

  /** Draw `a`'s stages (nothing when it has none) for a panel `width` px wide. */
  render(a: Analysis, width: number): void {
    this.last = { a, width };
    this.el.textContent = "";
    const s = a.stages;
    if (!s) return;
    if (this.selected === null || this.selected >= s.ranks.length) this.selected = s.shown;
    const shown = s.ranks[s.shown];
    const head = h("div", "mw-muted mw-chart-note mw-stages-intro");
    head.textContent =
      `${s.pp} pipeline ranks, ${s.ranks.reduce((n, r) => n + r.stages.length, 0)} stages, ` +
      `${s.schedule} over ${s.microbatches} micro-batches. The tree, the header and the other tabs ` +
      `show pipeline rank ${s.shown}${shown ? ` (${stagesText(shown)})` : ""}, the one with the highest peak.`;
    this.el.append(head, this.peaks(a, s), this.schedule(s, width), this.table(s), this.comms(s));
  }

  /** Draw again at a new width (the schedule's labels depend on it). */
  resize(width: number): void {
    if (this.last && this.last.width !== width && this.el.isConnected) this.render(this.last.a, width);
  }

  private select(rank: number): void {
    this.selected = rank;
    if (this.last) this.render(this.last.a, this.last.width);
  }

  /** A row's label cell: "rank 1" and its stages; clicking it selects the rank. */
  private rankLabel(r: StageRank, s: Stages): HTMLElement {
    const label = h("button", "mw-stage-label");
    label.type = "button";
    label.dataset.rank = String(r.rank);
    label.append(h("span", "mw-stage-rank", `rank ${r.rank}`), h("span", "mw-stage-sub", stagesText(r)));
    label.title = `pipeline rank ${r.rank}: ${moduleSummary(r.modules)}. Click to see its collectives below.`;
    label.classList.toggle("mw-selected", r.rank === this.selected);
    label.classList.toggle("mw-shown", r.rank === s.shown);
    label.addEventListener("click", () => this.select(r.rank));
    return label;
  }

  /** Each rank's peak, stacked by category, side by side; the highest marked; the budget. */
  private peaks(a: Analysis, s: Stages): HTMLElement {
    const box = h("div", "mw-stage-section mw-stage-peaks");
    box.append(h("div", "mw-stage-heading", "Peak memory per pipeline rank"));
    const top = Math.max(...s.ranks.map((r) => r.peakBytes), 1);
    const budget = gpuBudget(a);
    const inView = budgetInView(top, budget);
    const scale = inView && budget ? Math.max(top, budget.bytes) * 1.04 : top;
    const worst = s.ranks.reduce((w, r) => (r.peakBytes > w.peakBytes ? r : w), s.ranks[0] as StageRank);
    const order = categoryOrder(s.ranks);
    const chart = h("div", "mw-stage-chart");
    for (const r of s.ranks) {
      const row = h("div", "mw-stage-row mw-stage-peak-row");
      row.dataset.rank = String(r.rank);
      const track = h("div", "mw-stage-track");
      const bar = h("div", "mw-stage-bar");
      bar.style.width = `${(100 * r.peakBytes) / scale}%`;
      bar.title = `pipeline rank ${r.rank} (${stagesText(r)}: ${moduleSummary(r.modules)}): peak ${formatBytes(r.peakBytes)}`;
      const total = Object.values(r.categories).reduce((x, y) => x + y, 0) || 1;
      for (const name of order) {
        const bytes = r.categories[name] ?? 0;
        if (bytes <= 0) continue;
        const seg = h("span", `mw-stage-seg mw-cat-${categoryColor(name)}`);
        seg.style.width = `${(100 * bytes) / total}%`;
        seg.title = `${name}: ${formatBytes(bytes)} at rank ${r.rank}'s peak`;
        bar.append(seg);
      }
      track.append(bar);
      if (inView && budget) {
        const line = h("span", "mw-stage-budget");
        line.style.left = `${(100 * budget.bytes) / scale}%`;
        track.append(line);
      }
      const value = h("div", "mw-stage-value");
      value.append(h("span", "mw-stage-bytes", formatBytes(r.peakBytes)));
      if (r === worst && s.ranks.length > 1) {
        row.classList.add("mw-stage-worst");
        value.append(h("span", "mw-stage-tag", "highest"));
      }
      row.append(this.rankLabel(r, s), track, value);
      chart.append(row);
    }
    box.append(chart);
    const legend = h("div", "mw-stage-legend");
    for (const name of order) {
      const item = h("span", "mw-stage-legend-item");
      item.append(h("span", `mw-swatch mw-cat-${categoryColor(name)}`), document.createTextNode(name));
      legend.append(item);
    }
    if (budget) {
      const item = h("span", "mw-stage-legend-item");
      item.append(h("span", "mw-swatch mw-budget-swatch"), document.createTextNode(budgetLegend(top, budget)));
      legend.append(item);
    }
    box.append(legend);
    return box;
  }

  /** The schedule: each rank's actions in their slots, the idle slots (the bubble) hatched. */
  private schedule(s: Stages, width: number): HTMLElement {
    const box = h("div", "mw-stage-section mw-stage-schedule");
    box.append(h("div", "mw-stage-heading", `Schedule: ${s.schedule}, ${s.microbatches} micro-batches`));
    const slots = Math.max(s.slots, 1);
    // the track's width: the panel less the label and value columns (stages.css)
    const slotPx = Math.max(width - 110 - 96 - 16, 40) / slots;
    const chart = h("div", "mw-stage-chart");
    for (const r of s.ranks) {
      const row = h("div", "mw-stage-row mw-stage-sched-row");
      row.dataset.rank = String(r.rank);
      const track = h("div", "mw-stage-track mw-stage-slots");
      for (const act of r.actions) {
        const chunk = s.virtualStages > 1 ? r.stages.indexOf(act.stage) : 0;
        const cell = h("span", `mw-stage-act mw-stage-act-${act.kind}${chunk > 0 ? " mw-stage-chunk" : ""}`);
        cell.style.left = `${(100 * act.slot) / slots}%`;
        cell.style.width = `${100 / slots}%`;
        cell.dataset.kind = act.kind;
        cell.title = `rank ${r.rank}, stage ${act.stage}: ${ACTION_WORDS[act.kind]} of micro-batch ${act.microbatch} (slot ${act.slot + 1} of ${slots})`;
        const label = slotPx >= FULL_LABEL_PX ? `${act.kind}${act.microbatch}` : slotPx >= NUMBER_LABEL_PX ? `${act.microbatch}` : "";
        if (label) cell.append(h("span", "mw-stage-act-text", label));
        track.append(cell);
      }
      const value = h("div", "mw-stage-value mw-stage-bubble", `bubble ${formatShare(r.bubble)}`);
      value.title = `rank ${r.rank} works ${r.actions.length} of the ${slots} slots and waits ${slots - r.actions.length}: ${formatShare(r.bubble)} of the step`;
      row.append(this.rankLabel(r, s), track, value);
      chart.append(row);
    }
    box.append(chart);
    const legend = h("div", "mw-stage-legend");
    const kinds = KINDS.filter((k) => s.ranks.some((r) => r.actions.some((a) => a.kind === k)));
    for (const k of kinds) {
      const item = h("span", "mw-stage-legend-item");
      item.append(h("span", `mw-swatch mw-stage-act-${k}`), document.createTextNode(`${k} ${ACTION_WORDS[k]}`));
      legend.append(item);
    }
    const idle = h("span", "mw-stage-legend-item");
    idle.append(h("span", "mw-swatch mw-stage-idle-swatch"), document.createTextNode("idle: the bubble"));
    legend.append(idle);
    if (s.virtualStages > 1) legend.append(h("span", "mw-stage-legend-item", "darker: a rank's later stages"));
    box.append(legend);
    box.append(
      h(
        "div",
        "mw-muted mw-chart-note",
        `The actions each rank's schedule ran in its first step, in its order, each one time slot (a send none): a forward waits for the previous stage's forward of its micro-batch, a backward for the next stage's backward. The step takes ${slots} slots; a rank's bubble is its idle slots over all of them.${slotPx >= NUMBER_LABEL_PX ? " Numbers in the boxes are micro-batches." : " Hover a box for its micro-batch."}`,
      ),
    );
    return box;
  }

  /** One row per rank: its stages and layers, peak, step time, bytes sent and received. */
  private table(s: Stages): HTMLElement {
    const box = h("div", "mw-stage-section");
    const table = h("table", "mw-stage-table");
    const head = table.insertRow();
    const timed = s.ranks.some((r) => r.stepS !== null);
    // the bubble is written beside each rank's schedule: not again here (narrow panels)
    const names = ["rank", "holds", "peak", ...(timed ? ["step"] : []), "sent", "received"];
    names.forEach((name, i) => head.append(h("th", i >= 2 ? "mw-num" : "", name)));
    for (const r of s.ranks) {
      const row = table.insertRow();
      row.dataset.rank = String(r.rank);
      row.classList.toggle("mw-selected", r.rank === this.selected);
      row.addEventListener("click", () => this.select(r.rank));
      const cells = [
        String(r.rank),
        `${stagesText(r)}: ${moduleSummary(r.modules)}`,
        formatBytes(r.peakBytes),
        ...(timed ? [r.stepS === null ? "–" : formatSeconds(r.stepS)] : []),
        formatBytes(r.sendBytes),
        formatBytes(r.recvBytes),
      ];
      cells.forEach((v, i) => {
        const td = row.insertCell();
        td.textContent = v;
        if (i >= 2) td.className = "mw-num";
      });
    }
    box.append(table);
    if (timed) {
      const slowest = s.ranks.reduce((w, r) => ((r.stepS ?? 0) > (w.stepS ?? 0) ? r : w), s.ranks[0] as StageRank);
      box.append(
        h(
          "div",
          "mw-muted mw-chart-note",
          `step: the rank's forward and backward time stretched by its bubble, plus its optimizer step and exposed communication. The ranks step together: the pipeline's step is the longest, ${formatSeconds(slowest.stepS ?? 0)} (rank ${slowest.rank}); the header's step is that one too, rank ${s.shown}'s own time and the time it waits.`,
        ),
      );
    }
    return box;
  }

  /** The selected rank's collectives of one step, per mesh dimension. */
  private comms(s: Stages): HTMLElement {
    const r = s.ranks.find((x) => x.rank === this.selected) ?? s.ranks[s.shown];
    const box = h("div", "mw-stage-section mw-stage-comms");
    if (!r) return box;
    box.append(h("div", "mw-stage-heading", `Collectives of pipeline rank ${r.rank} per step, by mesh dimension`));
    if (!r.comms.length) {
      box.append(h("div", "mw-muted", "none"));
      return box;
    }
    const table = h("table", "mw-stage-table mw-stage-comms-table");
    const head = table.insertRow();
    ["dimension", "collective", "calls", "bytes"].forEach((name, i) => head.append(h("th", i >= 2 ? "mw-num" : "", name)));
    for (const c of r.comms) {
      const row = table.insertRow();
      [c.group, c.collective.replace(/_/g, "-"), String(c.calls), formatBytes(c.bytes)].forEach((v, i) => {
        const td = row.insertCell();
        td.textContent = v;
        if (i >= 2) td.className = "mw-num";
      });
    }
    box.append(table);
    box.append(
      h("div", "mw-muted mw-chart-note", "bytes as a.comms counts them: a send's tensor, an all-gather's output, a reduce-scatter's input. Click a rank to see its own."),
    );
    return box;
  }
}

/** A bubble as a percentage: "20 %", "4.2 %", "0 %". */
export function formatShare(f: number): string {
  const p = f * 100;
  if (p === 0) return "0 %";
  return `${p >= 10 || Math.abs(p - Math.round(p)) < 0.05 ? Math.round(p).toString() : p.toFixed(1)} %`;
}

