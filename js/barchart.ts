/**
 * The memory-by-module chart: horizontal bars (module names stay readable), each stacked from
 * its parts (`bars.ts`: parameters, in training gradients and optimizer state, output mem) in
 * their memory categories' colors, with a legend of the parts shown. Each part's bytes are
 * written on it where they fit and each bar's total beside it. Clicking a bar selects that
 * module; the selected module's bar is outlined.
 *
 * Drawn with uPlot. Stacking is done by drawing the cumulative bars from the largest (all
 * parts) to the smallest (parameters), each from zero, the later ones on top.
 */
import uPlot from "uplot";
import { barText, barTotal, shownParts, type MemoryBars } from "./bars";
import { BUDGET_ROOM, axisTop, budgetInView, budgetItem, budgetLegend, drawBudgetLine, type Budget } from "./budget";
import { BYTE_INCRS, cssVar, palette } from "./charts";
import { formatBytes } from "./format";

export const BAR_HEIGHT = 22;

/** A part's bytes are written on it when it is at least this much wider than the text (px). */
const LABEL_PAD = 6;

/**
 * A bar's label in at most `max` characters: its type kept whole (" · 80 × LlamaRMSNorm",
 * " · Linear"), its path shortened in the middle, its last segment kept whole where it fits
 * ("mod…input_layernorm"), so that two bars
 * never read alike and the class is never the part cut.
 */
export function truncateLabel(s: string, max: number): string {
  if (s.length <= max) return s;
  const cut = s.lastIndexOf(" · ");
  const tail = cut > 0 && s.length - cut < max - 4 ? s.slice(cut) : "";
  const path = tail ? s.slice(0, cut) : s;
  const room = Math.max(2, max - tail.length - 1);
  // the last segment whole where it fits (it tells two norms apart), else the middle cut
  const last = path.slice(path.lastIndexOf(".") + 1);
  const head = last.length + 2 <= room ? room - last.length : Math.ceil(room / 2);
  return `${path.slice(0, head)}…${path.slice(path.length - (room - head))}${tail}`;
}

/** A bar's label: its path, and its class where a folded group's label does not say it. */
function barLabel(bars: MemoryBars, i: number): string {
  const label = bars.labels[i] ?? "";
  const type = bars.types[i];
  return (bars.counts[i] ?? 1) > 1 || !type ? label : `${label} · ${type}`;
}

/** The memory bar chart. `onPick(module)` fires when a bar is clicked. */
export class MemoryChart {
  readonly el: HTMLElement;
  private plot: uPlot | null = null;
  private bars: MemoryBars | null = null;
  private selected = -1;
  private tip: HTMLElement;
  private host: HTMLElement;
  private legend: HTMLElement;

  constructor(
    parent: HTMLElement,
    private onPick: (module: number) => void,
  ) {
    this.el = document.createElement("div");
    this.el.className = "mw-chart mw-chart-bars";
    this.legend = document.createElement("div");
    this.legend.className = "mw-legend mw-bar-legend";
    this.host = document.createElement("div");
    this.host.className = "mw-chart-host";
    this.tip = document.createElement("div");
    this.tip.className = "mw-chart-tip";
    this.el.append(this.legend, this.host, this.tip);
    parent.append(this.el);
  }

  /** Screen positions of the bars' centers (used by browser tests to click a real bar). */
  barCenters(): { module: number; x: number; y: number }[] {
    const u = this.plot;
    const b = this.bars;
    if (!u || !b) return [];
    const r = u.over.getBoundingClientRect();
    return b.modules.map((module, i) => {
      const xs = u.valToPos(barTotal(b, i) / 2, "y");
      return { module, x: r.left + Math.max(2, xs), y: r.top + u.valToPos(i, "x") };
    });
  }

  private renderLegend(parts: ReturnType<typeof shownParts>): void {
    this.legend.textContent = "";
    for (const p of parts) {
      const item = document.createElement("span");
      item.dataset.part = p.key;
      const sw = document.createElement("span");
      sw.className = "mw-swatch";
      sw.style.background = `var(${p.color})`;
      item.append(sw, document.createTextNode(p.label));
      this.legend.append(item);
    }
  }

  /** Draw `bars`; `budget`: the GPU's memory as a dashed line (see `budget.ts`), or null. */
  setData(bars: MemoryBars, width: number, budget: Budget | null = null): void {
    this.bars = bars;
    this.plot?.destroy();
    this.plot = null;
    this.host.textContent = "";
    const parts = shownParts(bars);
    this.renderLegend(parts);
    if (bars.modules.length === 0) {
      const empty = document.createElement("div");
      empty.className = "mw-empty";
      empty.textContent = "No modules at this depth.";
      this.host.append(empty);
      return;
    }
    const p = palette(this.el);
    const font = cssVar(this.el, "--mw-font", "sans-serif");
    const colors = parts.map((x) => cssVar(this.el, x.color, p.params));
    const n = bars.modules.length;
    const labels = bars.modules.map((_m, i) => barLabel(bars, i));
    const longest = Math.min(56, Math.max(...labels.map((l) => l.length)));
    const labelWidth = Math.min(Math.max(80, longest * 6.6 + 16), Math.max(120, width * 0.45));
    // cumulative tops, bottom part first: bar k ends where parts 0..k end
    const tops = parts.map((_, k) =>
      bars.modules.map((_m, i) => parts.slice(0, k + 1).reduce((s, x) => s + (bars[x.key][i] ?? 0), 0)),
    );
    const totals = bars.modules.map((_, i) => barTotal(bars, i));
    const largest = Math.max(0, ...totals);
    if (budget) this.legend.append(budgetItem(budgetLegend(largest, budget)));
    const xs = bars.modules.map((_, i) => i);
    const self = this;
    const barSeries = (k: number): uPlot.Series => ({
      label: parts[k]?.label ?? "",
      fill: colors[k],
      stroke: colors[k],
      width: 0,
      paths: uPlot.paths.bars!({ size: [0.7, 18], align: 0 }),
      points: { show: false },
    });
    // drawn last part first (the longest), each later one on top
    const order = parts.map((_, k) => parts.length - 1 - k);
    const opts: uPlot.Options = {
      width: Math.max(320, width),
      height: n * BAR_HEIGHT + 50 + (budgetInView(largest, budget) ? BUDGET_ROOM : 0),
      // room above the bars for the budget line's label
      ...(budgetInView(largest, budget) ? { padding: [BUDGET_ROOM, null, null, null] as uPlot.Padding } : {}),
      legend: { show: false },
      cursor: { x: false, y: false, drag: { x: false, y: false }, points: { show: false } },
      scales: {
        x: { time: false, ori: 1, dir: -1, range: () => [-0.5, n - 0.5] },
        // room on the right for each bar's total
        y: { ori: 0, dir: 1, range: (_u, _min, max) => [0, axisTop(max, budget, 1.22)] },
      },
      axes: [
        {
          side: 3,
          stroke: p.fg,
          grid: { show: false },
          ticks: { show: false },
          font: p.font,
          size: labelWidth,
          gap: 6,
          splits: () => xs,
          values: (_u, splits) =>
            splits.map((v) => truncateLabel(labels[v] ?? "", Math.floor((labelWidth - 16) / 6.6))),
        },
        {
          side: 2,
          stroke: p.fg2,
          grid: { stroke: p.grid, width: 1 },
          ticks: { stroke: p.grid },
          font: p.font,
          size: 36,
          space: 90,
          incrs: BYTE_INCRS,
          values: (_u, splits) => splits.map((v) => formatBytes(v)),
        },
      ],
      series: [{}, ...order.map(barSeries)],
      hooks: {
        draw: [
          (u) => {
            const ctx = u.ctx;
            const dpr = uPlot.pxRatio;
            ctx.save();
            ctx.font = `${10 * dpr}px ${font}`;
            ctx.textBaseline = "middle";
            // each part's bytes on it, where they fit
            ctx.textAlign = "center";
            ctx.fillStyle = "#111";
            parts.forEach((part, k) => {
              bars[part.key].forEach((v, i) => {
                if (v <= 0) return;
                const x0 = u.valToPos(k > 0 ? (tops[k - 1]?.[i] ?? 0) : 0, "y", true);
                const x1 = u.valToPos(tops[k]?.[i] ?? 0, "y", true);
                const text = formatBytes(v);
                if (ctx.measureText(text).width + LABEL_PAD * dpr > x1 - x0) return;
                ctx.fillText(text, (x0 + x1) / 2, u.valToPos(i, "x", true));
              });
            });
            // each bar's total beside it
            ctx.fillStyle = p.fg2;
            ctx.textAlign = "left";
            totals.forEach((t, i) => {
              const tied = bars.tied[i] ?? 0;
              if (t <= 0 && tied <= 0) return;
              // tied parameters are another module's: said beside, not drawn
              const text = formatBytes(t) + (tied > 0 ? ` (+${formatBytes(tied)} tied, counted at first owner)` : "");
              ctx.fillText(text, u.valToPos(t, "y", true) + 4 * dpr, u.valToPos(i, "x", true));
            });
            ctx.restore();
            if (budgetInView(largest, budget)) drawBudgetLine(u, "y", budget.bytes, budget.label, p.peak, font);
          },
          (u) => {
            if (self.selected < 0) return;
            const i = bars.modules.indexOf(self.selected);
            if (i < 0) return;
            const ctx = u.ctx;
            const dpr = uPlot.pxRatio;
            const cy = u.valToPos(i, "x", true);
            const h = BAR_HEIGHT * dpr;
            ctx.save();
            ctx.strokeStyle = p.select;
            ctx.lineWidth = 2 * dpr;
            ctx.setLineDash([4 * dpr, 3 * dpr]);
            ctx.strokeRect(u.bbox.left + dpr, cy - h / 2 + dpr, u.bbox.width - 2 * dpr, h - 2 * dpr);
            ctx.restore();
          },
        ],
        setCursor: [
          (u) => {
            const i = u.cursor.idx;
            if (i === null || i === undefined || u.cursor.left === undefined || u.cursor.left < 0) {
              self.tip.textContent = "";
              return;
            }
            self.tip.textContent = barText(bars, i);
          },
        ],
      },
    };
    this.plot = new uPlot(opts, [xs, ...order.map((k) => tops[k] ?? [])], this.host);
    this.plot.over.addEventListener("click", (e: MouseEvent) => {
      const u = this.plot;
      if (!u) return;
      // the category scale "x" runs vertically (ori 1): map the click's y to the nearest bar
      const rect = u.over.getBoundingClientRect();
      const i = Math.round(u.posToVal(e.clientY - rect.top, "x"));
      const module = bars.modules[i];
      if (module !== undefined) this.onPick(module);
    });
    this.plot.over.style.cursor = "pointer";
  }

  select(module: number): void {
    if (module === this.selected) return;
    this.selected = module;
    this.plot?.redraw(false, false);
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
