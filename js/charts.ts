/**
 * Charts: the memory timeline: live bytes over the forward pass, one point per allocation or
 * free, the peak marked with its module name; the peak by category. (The memory-by-module bars
 * are in `bars.ts` and `barchart.ts`.)
 *
 * Drawn with uPlot (about 50 KB, canvas, fast on timelines of 100k+ points).
 *
 * Also here: the dtype what-if for parameter memory (pure, unit tested).
 */
import uPlot from "uplot";
import { axisTop, budgetInView, budgetItem, budgetLegend, drawBudgetLine, type Budget } from "./budget";
import { formatBytes } from "./format";
import { MEMORY_CATEGORIES, PRECISIONS, type Analysis, type Memory, type ModuleInfo, type PrecisionName } from "./protocol";
import { drawBands, fitText } from "./chartdraw";
import { peakOwner } from "./decode";
import { overlaps, type LabelBox } from "./labels";
import { moduleRuns, type ModuleRun } from "./modulebands";
import { categoryColor, STATIC_BAND, type StackBand } from "./stack";

// ---------------------------------------------------------------------------------------------
// dtype what-if
// ---------------------------------------------------------------------------------------------

/** The precision switch: as recorded, or one of `PRECISIONS` (`choices.Precision`). */
export type DtypeChoice = "recorded" | PrecisionName;
export const DTYPE_CHOICES: readonly DtypeChoice[] = ["recorded", ...PRECISIONS];

/** Bytes per element of each what-if dtype; int4 packs two values per byte. */
export const DTYPE_BYTES: Record<Exclude<DtypeChoice, "recorded">, number> = {
  fp32: 4,
  bf16: 2,
  fp16: 2,
  int8: 1,
  int4: 0.5,
};

const TORCH_FLOAT_BYTES: Record<string, number> = {
  float64: 8,
  double: 8,
  float32: 4,
  float: 4,
  float16: 2,
  half: 2,
  bfloat16: 2,
  float8_e4m3fn: 1,
  float8_e5m2: 1,
  float8_e4m3fnuz: 1,
  float8_e5m2fnuz: 1,
};

/** Element size of a floating-point torch dtype name ("torch.float32" or "float32"), else null. */
export function floatDtypeBytes(dtype: string): number | null {
  return TORCH_FLOAT_BYTES[dtype.replace(/^torch\./, "")] ?? null;
}

/**
 * Bytes per element of the model's floating-point parameters as recorded: the element size of
 * the float dtype that holds the most parameters (from `own_params`); 4 (fp32) when unknown.
 */
export function recordedFloatBytes(a: Analysis): number {
  const count = new Map<number, number>();
  for (const m of a.modules) {
    for (const p of m.ownParams) {
      const b = floatDtypeBytes(p.dtype);
      if (b === null) continue;
      const numel = p.shape.reduce((x, y) => x * y, 1);
      count.set(b, (count.get(b) ?? 0) + numel);
    }
  }
  let best = 4;
  let bestN = -1;
  for (const [b, n] of count) {
    if (n > bestN) {
      best = b;
      bestN = n;
    }
  }
  return best;
}

/**
 * Parameter bytes of a module if its floating-point parameters were stored as `dtype`:
 *
 *     new_param_bytes = float_params × bytes_per_element(dtype)
 *                     + (param_bytes − float_params × recorded_bytes_per_element)
 *
 * The second term is the bytes of the non-float parameters (integer, bool), kept as recorded;
 * `recorded_bytes_per_element` is 4 for an fp32 model (see `recordedFloatBytes`).
 * int4 counts 0.5 byte per element. "recorded" returns `param_bytes` unchanged.
 */
export function paramBytesAt(m: ModuleInfo, dtype: DtypeChoice, recordedBpe: number): number {
  if (dtype === "recorded") return m.paramBytes;
  const nonFloat = Math.max(0, m.paramBytes - m.floatParams * recordedBpe);
  return Math.ceil(m.floatParams * DTYPE_BYTES[dtype] + nonFloat);
}

// ---------------------------------------------------------------------------------------------
// Chart data (pure)
// ---------------------------------------------------------------------------------------------

export interface PhaseSpan {
  phase: string;
  /** First and one-past-last timeline event of the phase. */
  start: number;
  end: number;
}

/**
 * Contiguous runs of one phase over the timeline (forward, backward, optimizer), from the
 * per-event `timeline.phase`, else from `memory.phases` (phase -> first event). Empty when the
 * payload carries neither (older kernels, inference without phases).
 */
export function phaseSpans(a: Analysis): PhaseSpan[] {
  const n = a.timeline.bytes.length;
  const out: PhaseSpan[] = [];
  const ph = a.timeline.phase;
  if (ph.length === n && n > 0) {
    for (let i = 0; i < n; i++) {
      const p = ph[i] as string;
      const last = out[out.length - 1];
      if (last && last.phase === p) last.end = i + 1;
      else out.push({ phase: p, start: i, end: i + 1 });
    }
    return out;
  }
  const starts = Object.entries(a.memory.phases)
    .filter(([, i]) => i >= 0 && i < n)
    .sort((x, y) => x[1] - y[1]);
  starts.forEach(([phase, start], k) => {
    const next = starts[k + 1];
    out.push({ phase, start, end: next ? next[1] : n });
  });
  return out;
}

export interface CategorySegment {
  category: string;
  bytes: number;
  /** 0..1 of the sum of all categories. */
  fraction: number;
  /** CSS class of its color (`mw-cat-0` … `mw-cat-9`, see `categoryColor`). */
  cls: string;
}

/**
 * The peak split by category, in `MEMORY_CATEGORIES` order (categories the kernel adds later
 * follow, in its order). Empty when the payload has no categories.
 */
export function categorySegments(memory: Memory): CategorySegment[] {
  const cats = memory.categories;
  const names = [
    ...MEMORY_CATEGORIES.filter((c) => c in cats),
    ...Object.keys(cats).filter((c) => !(MEMORY_CATEGORIES as readonly string[]).includes(c)),
  ];
  const total = names.reduce((s, c) => s + Math.max(0, cats[c] ?? 0), 0);
  return names.map((category) => {
    const bytes = cats[category] ?? 0;
    return {
      category,
      bytes,
      fraction: total > 0 ? Math.max(0, bytes) / total : 0,
      cls: `mw-cat-${categoryColor(category)}`,
    };
  });
}

/** "Peak by category": one horizontal stacked bar and a table of the categories. */
export function renderCategoryBar(parent: HTMLElement, memory: Memory, peakBytes: number): void {
  parent.textContent = "";
  const segs = categorySegments(memory);
  if (segs.length === 0) return;
  const head = document.createElement("div");
  head.className = "mw-subhead";
  head.textContent = `Peak by category (${formatBytes(peakBytes || segs.reduce((s, x) => s + x.bytes, 0))}${memory.peakPhase ? `, during ${memory.peakPhase}${memory.peakStep ? ` of step ${memory.peakStep}` : ""}` : ""})`;
  const bar = document.createElement("div");
  bar.className = "mw-catbar";
  bar.setAttribute("role", "img");
  bar.setAttribute(
    "aria-label",
    segs.map((x) => `${x.category} ${formatBytes(x.bytes)}`).join(", "),
  );
  const table = document.createElement("table");
  table.className = "mw-dtable mw-cattable";
  for (const x of segs) {
    const seg = document.createElement("div");
    seg.className = `mw-catseg ${x.cls}`;
    seg.dataset.category = x.category;
    seg.style.width = `${(x.fraction * 100).toFixed(2)}%`;
    seg.title = `${x.category}: ${formatBytes(x.bytes)} (${(x.fraction * 100).toFixed(1)}%)`;
    if (x.bytes > 0) bar.append(seg);
    const tr = document.createElement("tr");
    const name = document.createElement("td");
    const sw = document.createElement("span");
    sw.className = `mw-swatch ${x.cls}`;
    name.append(sw, document.createTextNode(x.category));
    const val = document.createElement("td");
    val.className = "mw-num";
    val.textContent = formatBytes(x.bytes);
    const pct = document.createElement("td");
    pct.className = "mw-num";
    pct.textContent = `${(x.fraction * 100).toFixed(1)}%`;
    tr.append(name, val, pct);
    table.append(tr);
  }
  parent.append(head, bar, table);
}

/** Index of the first maximum of the timeline, or -1 when it is empty. */
export function timelinePeak(bytes: readonly number[]): number {
  let best = -1;
  let bestV = -Infinity;
  for (let i = 0; i < bytes.length; i++) {
    const v = bytes[i] as number;
    if (v > bestV) {
      bestV = v;
      best = i;
    }
  }
  return best;
}

// ---------------------------------------------------------------------------------------------
// Views
// ---------------------------------------------------------------------------------------------

export function cssVar(el: Element, name: string, fallback: string): string {
  const v = getComputedStyle(el).getPropertyValue(name).trim();
  return v || fallback;
}

export interface Palette {
  fg: string;
  fg2: string;
  grid: string;
  params: string;
  acts: string;
  select: string;
  line: string;
  peak: string;
  font: string;
}

export function palette(el: Element): Palette {
  const font = cssVar(el, "--mw-font", "sans-serif");
  return {
    fg: cssVar(el, "--mw-fg", "#1f2328"),
    fg2: cssVar(el, "--mw-fg2", "#57606a"),
    grid: cssVar(el, "--mw-grid", "rgba(127,127,127,0.2)"),
    params: cssVar(el, "--mw-params", "#1f77b4"),
    acts: cssVar(el, "--mw-acts", "#f08c00"),
    select: cssVar(el, "--mw-fg", "#1f2328"),
    line: cssVar(el, "--mw-brand", "#1976d2"),
    peak: cssVar(el, "--mw-error", "#d32f2f"),
    font: `11px ${font}`,
  };
}


/** Translucent phase bands: readable on light and dark backgrounds alike. */
const PHASE_FILL: Record<string, string> = {
  forward: "rgba(100, 168, 232, 0.10)",
  backward: "rgba(242, 163, 58, 0.13)",
  optimizer: "rgba(116, 196, 122, 0.15)",
};

/** Axis steps for bytes: 1, 2, 4 ... 512 times a power of 1024, so ticks read 256 KiB, 1 MiB. */
export const BYTE_INCRS: number[] = (() => {
  const out: number[] = [];
  for (let k = 0; k < 6; k++) for (let m = 1; m < 1024; m *= 2) out.push(m * 1024 ** k);
  return out;
})();

/** Height of the strip of module bands between the plot and the x axis' numbers (CSS px). */
const MODULE_STRIP = 16;

/** Alternating light bands under the plot, one per module run, named where the name fits. */
function drawModuleStrip(u: uPlot, runs: readonly ModuleRun[], p: Palette, font: string, xOf: (i: number) => number): void {
  const ctx = u.ctx;
  const dpr = uPlot.pxRatio;
  const top = u.bbox.top + u.bbox.height + 2 * dpr;
  const h = (MODULE_STRIP - 4) * dpr;
  ctx.save();
  ctx.font = `${10 * dpr}px ${font}`;
  ctx.textBaseline = "middle";
  ctx.textAlign = "left";
  runs.forEach((r, k) => {
    const left = Math.max(u.bbox.left, u.valToPos(xOf(r.start) - 0.5, "x", true));
    const right = Math.min(u.bbox.left + u.bbox.width, u.valToPos(xOf(r.end) - 0.5, "x", true));
    if (right <= left || !r.name) return;
    ctx.fillStyle = p.grid;
    ctx.globalAlpha = k % 2 ? 0.5 : 1;
    ctx.fillRect(left, top, right - left, h);
    ctx.globalAlpha = 1;
    const w = ctx.measureText(r.name).width;
    if (w + 4 * dpr < right - left) {
      ctx.fillStyle = p.fg2;
      ctx.fillText(r.name, left + 2 * dpr, top + h / 2);
    }
  });
  ctx.restore();
}

/** The memory timeline with the peak marked. */
export class TimelineChart {
  readonly el: HTMLElement;
  private plot: uPlot | null = null;
  private host: HTMLElement;
  private tip: HTMLElement;
  private legend: HTMLElement;

  constructor(parent: HTMLElement) {
    this.el = document.createElement("div");
    this.el.className = "mw-chart mw-chart-timeline";
    this.host = document.createElement("div");
    this.host.className = "mw-chart-host";
    this.tip = document.createElement("div");
    this.tip.className = "mw-chart-tip";
    this.legend = document.createElement("div");
    this.legend.className = "mw-legend mw-timeline-legend";
    this.el.append(this.legend, this.host, this.tip);
    parent.append(this.el);
  }

  /** The bands' names with their colors, top band first (as they stack). */
  private renderLegend(bands: readonly StackBand[]): void {
    this.legend.textContent = "";
    for (const b of [...bands].reverse()) {
      const item = document.createElement("span");
      const sw = document.createElement("span");
      sw.className = `mw-swatch mw-cat-${b.color}`;
      item.append(sw, document.createTextNode(b.name));
      this.legend.append(item);
    }
  }

  /**
   * Draw `a`'s timeline. `base`: the constant bytes under it (parameters, buffers, inputs), drawn
   * as a band with its size; `base.leftOut`: the timeline was given without them (the y axis
   * then counts the bytes above them, so a 70B model's activations are not a flat line).
   * `bands`: the same bytes stacked by category (stack.ts), bottom first; their top is `bytes`.
   */
  setData(
    a: Analysis,
    width: number,
    base?: { bytes: number; leftOut: boolean },
    bands: readonly StackBand[] = [],
    budget: Budget | null = null,
  ): void {
    this.plot?.destroy();
    this.plot = null;
    this.host.textContent = "";
    this.renderLegend(bands);
    const bytes = a.timeline.bytes;
    if (bytes.length === 0) {
      const empty = document.createElement("div");
      empty.className = "mw-empty";
      empty.textContent =
        a.status === "structural"
          ? "No forward pass was recorded (structural analysis): give inputs to see the timeline."
          : "No allocations recorded.";
      this.host.append(empty);
      return;
    }
    const p = palette(this.el);
    const peakI = timelinePeak(bytes);
    // with the constant band left out, the axis counts bytes above it: "live" is still all of it
    const under = base?.leftOut ? base.bytes : 0;
    // the budget on this axis: above the constant band when the timeline leaves it out
    const line = budget && { ...budget, bytes: budget.bytes - (base?.leftOut ? base.bytes : 0) };
    if (line) this.legend.append(budgetItem(budgetLegend(bytes[peakI] ?? 0, line)));
    if (base?.leftOut && base.bytes > 0) {
      const item = document.createElement("span");
      item.className = "mw-left-out-item";
      item.textContent = `left out: parameters, buffers, inputs ${formatBytes(base.bytes)} (under the whole chart)`;
      this.legend.append(item);
    }
    const spans = phaseSpans(a);
    const labels: LabelBox[] = [];
    const phaseAt = (i: number): string => spans.find((s) => i >= s.start && i < s.end)?.phase ?? "";
    const peakPhase = a.memory.peakPhase || phaseAt(peakI);
    const moduleOfEvent = (i: number): string => {
      const c = a.calls[a.timeline.call[i] ?? -1];
      const m = c ? a.modules[c.module] : undefined;
      return m ? m.path || a.title : "(outside any module)";
    };
    const peakLabel =
      a.peak && a.peak.module !== undefined
        ? `peak ${formatBytes(a.peak.bytes || (bytes[peakI] ?? 0))} · ${peakOwner(a)}`
        : `peak ${formatBytes(bytes[peakI] ?? 0)} · ${moduleOfEvent(peakI)}`;
    // "· backward" only where the owner ("the backward of x", "the optimizer step") does not say it
    const peakFull = peakPhase && !peakLabel.includes(peakPhase) ? `${peakLabel} · ${peakPhase}` : peakLabel;
    // on an axis above the left-out band, the peak says what of it the axis shows
    const peakText = under ? `${peakFull} (${formatBytes(bytes[peakI] ?? 0)} above the band)` : peakFull;
    // x: event numbers (the points are a thinned subset of the allocations and frees)
    const ev = a.timeline.event?.length === bytes.length ? a.timeline.event : bytes.map((_, i) => i);
    const xOf = (i: number): number => (i < bytes.length ? (ev[i] ?? i) : (ev[bytes.length - 1] ?? 0) + 1);
    const xs = ev.slice();
    const nEvents = xOf(bytes.length);
    const xLabel = `allocation and free events (${nEvents.toLocaleString("en-US")}${spans.length > 1 ? ", in order" : ", forward pass"})`;
    const yLabel = base?.leftOut ? `live bytes above the left-out ${formatBytes(base.bytes)}` : "live bytes";
    // the axes' words, drawn on the canvas, for screen readers (and tests) too
    this.el.setAttribute("aria-label", `Memory timeline. x: ${xLabel}; y: ${yLabel}`);

    const runs = moduleRuns(a);
    const self = this;
    const opts: uPlot.Options = {
      width: Math.max(320, width),
      height: 260,
      legend: { show: false },
      cursor: { drag: { x: true, y: false }, points: { size: 6 } },
      scales: {
        x: { time: false },
        y: { range: (_u, _min, max) => [0, axisTop(max, line, 1.15)] },
      },
      axes: [
        {
          stroke: p.fg2,
          grid: { stroke: p.grid, width: 1 },
          ticks: { stroke: p.grid },
          font: p.font,
          label: xLabel,
          // room for the module bands between the plot and the numbers
          gap: runs.length ? 5 + MODULE_STRIP : 5,
          size: runs.length ? 50 + MODULE_STRIP : 50,
          labelFont: p.font,
          labelSize: 18,
        },
        {
          stroke: p.fg2,
          grid: { stroke: p.grid, width: 1 },
          ticks: { stroke: p.grid },
          font: p.font,
          size: 70,
          space: 40,
          incrs: BYTE_INCRS,
          values: (_u, splits) => splits.map((v) => formatBytes(v)),
          label: yLabel,
          labelFont: p.font,
          labelSize: 18,
        },
      ],
      series: [
        {},
        {
          label: "live bytes",
          stroke: p.line,
          width: 1.5,
          fill: bands.length === 0 && /^#[0-9a-f]{6}$/i.test(p.line) ? `${p.line}22` : undefined,
          paths: uPlot.paths.stepped!({ align: 1 }),
          points: { show: false },
        },
      ],
      hooks: {
        // after the grid, before the line: the stacked categories, then the constant band's name
        drawAxes: [
          (u) => {
            const ctx = u.ctx;
            const dpr = uPlot.pxRatio;
            drawBands(u, bands, (k) => cssVar(self.el, `--mw-cat-${k}`, p.acts), xOf);
            const dprA = uPlot.pxRatio;
            if (base && !base.leftOut && base.bytes > 0) {
              // the constant part as a band of its own, named with its size
              const y = u.valToPos(base.bytes, "y", true);
              const bottom = u.bbox.top + u.bbox.height;
              ctx.save();
              ctx.fillStyle = `${p.params}33`;
              if (bands[0]?.name !== STATIC_BAND) ctx.fillRect(u.bbox.left, y, u.bbox.width, bottom - y);
              ctx.fillStyle = p.fg2;
              ctx.font = `${11 * dpr}px ${cssVar(self.el, "--mw-font", "sans-serif")}`;
              ctx.textBaseline = "top";
              ctx.textAlign = "left"; // the y axis leaves it "right"
              // inside the plot, above the phases' names where the band is thin (never over them)
              const text = `parameters, buffers, inputs: ${formatBytes(base.bytes)}`;
              const tw = ctx.measureText(text).width;
              let ty = Math.min(y + 3 * dprA, bottom - 15 * dpr);
              const box = (t: number): LabelBox => ({ name: "band", x: u.bbox.left + 6 * dpr, y: t, w: tw, h: 12 * dpr });
              for (const other of labels) if (overlaps(box(ty), other)) ty = Math.min(ty, other.y - 13 * dpr);
              ctx.fillText(text, u.bbox.left + 6 * dpr, ty);
              labels.push(box(ty));
              ctx.restore();
            }
          },
        ],
        drawClear: [
          (u) => {
            const ctx = u.ctx;
            const dpr = uPlot.pxRatio;
            labels.length = 0; // every label drawn this frame, so that none is drawn over another
            // phases as alternating bands with their names, behind the line
            if (spans.length < 2) return;
            ctx.save();
            ctx.font = `${11 * dpr}px ${cssVar(self.el, "--mw-font", "sans-serif")}`;
            // names at the bottom of each band: the peak label sits near the top
            ctx.textBaseline = "bottom";
            ctx.textAlign = "left";
            spans.forEach((s, k) => {
              const x0 = u.valToPos(xOf(s.start) - 0.5, "x", true);
              const x1 = u.valToPos(xOf(s.end) - 0.5, "x", true);
              const left = Math.max(u.bbox.left, x0);
              const right = Math.min(u.bbox.left + u.bbox.width, x1);
              if (right <= left) return;
              ctx.fillStyle = PHASE_FILL[s.phase] ?? (k % 2 ? p.grid : "transparent");
              ctx.fillRect(left, u.bbox.top, right - left, u.bbox.height);
              ctx.strokeStyle = p.fg2;
              ctx.lineWidth = dpr;
              ctx.setLineDash([3 * dpr, 3 * dpr]);
              ctx.beginPath();
              ctx.moveTo(Math.round(left) + 0.5, u.bbox.top);
              ctx.lineTo(Math.round(left) + 0.5, u.bbox.top + u.bbox.height);
              ctx.stroke();
              ctx.fillStyle = p.fg2;
              const w = ctx.measureText(s.phase).width;
              if (w + 8 * dpr < right - left) {
                const by = u.bbox.top + u.bbox.height - 3 * dpr;
                ctx.fillText(s.phase, left + 4 * dpr, by);
                labels.push({ name: `phase ${s.phase}`, x: left + 4 * dpr, y: by - 12 * dpr, w, h: 12 * dpr });
              }
            });
            ctx.restore();
          },
        ],
        draw: [
          (u) => {
            drawModuleStrip(u, runs, p, cssVar(self.el, "--mw-font", "sans-serif"), xOf);
            if (budgetInView(bytes[peakI] ?? 0, line)) drawBudgetLine(u, "y", line.bytes, line.label, p.peak, cssVar(self.el, "--mw-font", "sans-serif"));
            if (peakI < 0) return;
            const ctx = u.ctx;
            const dpr = uPlot.pxRatio;
            const x = u.valToPos(xOf(peakI), "x", true);
            const y = u.valToPos(bytes[peakI] ?? 0, "y", true);
            ctx.save();
            ctx.fillStyle = p.peak;
            ctx.beginPath();
            ctx.arc(x, y, 4 * dpr, 0, 2 * Math.PI);
            ctx.fill();
            ctx.font = `${11 * dpr}px ${cssVar(self.el, "--mw-font", "sans-serif")}`;
            const right = u.bbox.left + u.bbox.width;
            // never cut: the wider side of the dot, shortened in the middle where even that is narrow
            const room = Math.max(x - u.bbox.left, right - x) - 10 * dpr;
            const text = fitText(ctx, peakText, room);
            const tw = ctx.measureText(text).width;
            let tx = x + 8 * dpr;
            if (tx + tw > right) tx = Math.max(u.bbox.left + 2 * dpr, x - 8 * dpr - tw);
            ctx.textBaseline = "bottom";
            // from its left end, whatever the axes left set: a label aligned "right" ran from
            // tx leftwards, under the y axis' title
            ctx.textAlign = "left";
            // above the dot, inside the plot (the y axis' title is outside it), clear of the
            // band's and the phases' names: below the dot where above is taken
            let ty = Math.max(u.bbox.top + 14 * dpr, y - 6 * dpr);
            const box = (t: number): LabelBox => ({ name: "peak", x: tx, y: t - 12 * dpr, w: tw, h: 12 * dpr });
            for (const other of labels) {
              if (overlaps(box(ty), other)) ty = Math.max(u.bbox.top + 14 * dpr, other.y - 1 * dpr);
            }
            if (labels.some((o) => overlaps(box(ty), o))) ty = Math.max(...labels.map((o) => o.y + o.h)) + 13 * dpr;
            ctx.fillText(text, tx, ty);
            labels.push(box(ty));
            ctx.restore();
            // for the browser tests (and anyone checking): each label's box, CSS pixels in the canvas
            self.el.dataset.labels = JSON.stringify(labels.map((l) => ({ name: l.name, x: l.x / dpr, y: l.y / dpr, w: l.w / dpr, h: l.h / dpr })));
            self.el.dataset.plot = JSON.stringify({ x: u.bbox.left / dpr, y: u.bbox.top / dpr, w: u.bbox.width / dpr, h: u.bbox.height / dpr });
          },
        ],
        setCursor: [
          (u) => {
            const i = u.cursor.idx;
            if (i === null || i === undefined || u.cursor.left === undefined || u.cursor.left < 0) {
              self.tip.textContent = "";
              return;
            }
            const phase = phaseAt(i);
            const split = [...bands]
              .reverse()
              .filter((b) => (b.values[i] ?? 0) !== 0)
              .map((b) => `${b.name} ${formatBytes(b.values[i] ?? 0)}`)
              .join(", ");
            const live = (bytes[i] ?? 0) + under;
            const left = under ? `; ${formatBytes(under)} of parameters, buffers, inputs left out of the chart` : "";
            self.tip.textContent = `event ${xOf(i).toLocaleString("en-US")} of ${nEvents.toLocaleString("en-US")}${phase ? ` (${phase})` : ""} · ${formatBytes(live)} live${split ? ` (${split}${left})` : left ? ` (${left.slice(2)})` : ""} · ${a.timeline.op[i] ?? ""} in ${moduleOfEvent(i)}`;
          },
        ],
      },
    };
    this.plot = new uPlot(opts, [xs, bytes.slice()], this.host);
  }

  resize(width: number): void {
    if (this.plot) this.plot.setSize({ width: Math.max(320, width), height: this.plot.height });
  }

  destroy(): void {
    this.plot?.destroy();
    this.plot = null;
    this.el.remove();
  }
}

