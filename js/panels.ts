/**
 * The tab area under the table: details of the selected row, memory by module (bars), and the
 * memory timeline with its collectives. It owns the tabs' DOM and the two canvas charts; what
 * it shows comes in with each `render` (the view state and the analysis), and what the user
 * does goes out through its handlers.
 */
import { MemoryChart } from "./barchart";
import { foldBars, largestBars, memoryBars, type MemoryBars } from "./bars";
import { TimelineChart, renderCategoryBar } from "./charts";
import { gpuBudget } from "./budget";
import { renderComms } from "./comms";
import { peakOwner } from "./decode";
import { copyText, h, renderDetails } from "./details";
import { formatBytes } from "./format";
import { GraphView } from "./graphview";
import { scaledTimeline, type Precision } from "./precision";
import type { Analysis, ModuleInfo } from "./protocol";
import { stackTimeline } from "./stack";
import { StagesView } from "./stages";
import { foldedPath, frontier, groupLabels, type Aggregate, type Tree, type TreeNode } from "./tree";
import { TABS, tabAvailable, type Tab, type ViewState } from "./viewstate";

/** The most bars drawn (the largest): the chart grows with them and has no scrollbar of its own. */
const MAX_BARS = 40;

export interface PanelHandlers {
  onTab(tab: Tab): void;
  onLeaveOut(value: boolean): void;
  /** A bar was clicked: select its module. */
  onBar(module: number): void;
  /** Select the folded group whose members' module a folded bar sums (its first member). */
  onBarGroup?(module: number): void;
  /** Say something briefly (the copy button's result). */
  toast(text: string): void;
}

/** What the panels draw from. */
export interface PanelContext {
  state: ViewState;
  tree: Tree;
  aggs: readonly Aggregate[];
  selected: TreeNode | null;
  precision: Precision | null;
  paramBytes: (m: ModuleInfo) => number;
  outputBytes: (bytes: number) => number;
}

export class Panels {
  readonly tabsEl = h("div", "mw-tabs");
  readonly el = h("div", "mw-panel");
  private detailsEl = h("div", "mw-details");
  private memoryEl = h("div", "mw-memory");
  private timelineEl = h("div", "mw-timeline");
  private memoryNote = h("div", "mw-muted mw-chart-note");
  private timelineNote = h("div", "mw-muted mw-chart-note");
  private leaveOutBox = h("input", "mw-leave-out");
  private commsEl = h("div", "mw-comms");
  private categoryEl = h("div", "mw-categories");
  private tabButtons = new Map<Tab, HTMLButtonElement>();
  private memoryChart: MemoryChart | null = null;
  /** What a click on a folded bar opened, with the offer of its group (`pickBar`). */
  private pickEl = h("div", "mw-bar-pick");
  private shownBars: MemoryBars | null = null;
  private timelineChart: TimelineChart | null = null;
  /** The Graph tab (graphview.ts): made when first shown. */
  graph: GraphView | null = null;
  private graphEl = h("div", "mw-graph-tab");
  /** The panel's width when last laid out (``width()``). */
  private knownWidth = 0;
  /** The Stages tab (stages.ts): a pipeline's ranks; its button shows only for one. */
  private stages = new StagesView();

  constructor(private handlers: PanelHandlers) {
    for (const [tab, label] of TABS) {
      const b = h("button", "mw-tab", label);
      b.type = "button";
      b.setAttribute("role", "tab");
      b.dataset.tab = tab;
      b.addEventListener("click", () => handlers.onTab(tab));
      this.tabButtons.set(tab, b);
      this.tabsEl.append(b);
    }
    this.tabsEl.setAttribute("role", "tablist");
    this.memoryEl.append(this.categoryEl, this.memoryNote, this.pickEl);
    this.leaveOutBox.type = "checkbox";
    this.leaveOutBox.addEventListener("change", () => handlers.onLeaveOut(this.leaveOutBox.checked));
    const leaveOut = h("label", "mw-label mw-leave-out-label");
    leaveOut.append(this.leaveOutBox, document.createTextNode(" Leave out parameters, buffers and inputs"));
    leaveOut.title =
      "They are live from start to end: without them the y axis shows what the pass itself allocates (activations, temporaries, gradients, optimizer state)";
    this.timelineEl.append(leaveOut, this.timelineNote, this.commsEl);
    this.el.append(this.detailsEl, this.memoryEl, this.timelineEl, this.graphEl, this.stages.el);
  }

  /** Show the buttons of the tabs `a` has something for (Stages: a pipeline's). */
  showAvailable(a: Analysis | null): void {
    for (const [t, b] of this.tabButtons) b.style.display = tabAvailable(t, a) ? "" : "none";
  }

  /** Show `tab`'s panel and mark its button. */
  showTab(tab: Tab): void {
    for (const [t, b] of this.tabButtons) {
      b.classList.toggle("mw-active", t === tab);
      b.setAttribute("aria-selected", String(t === tab));
    }
    this.detailsEl.style.display = tab === "details" ? "" : "none";
    this.memoryEl.style.display = tab === "memory" ? "" : "none";
    this.timelineEl.style.display = tab === "timeline" ? "" : "none";
    this.graphEl.style.display = tab === "graph" ? "" : "none";
    this.stages.el.style.display = tab === "stages" ? "" : "none";
  }

  /** The details of the selected row (only while its tab shows; `null`: nothing to show). */
  renderDetails(ctx: PanelContext | null): void {
    if (!ctx) this.detailsEl.textContent = "";
    if (!ctx || ctx.state.tab !== "details") return;
    const dtype = ctx.state.dtype;
    renderDetails(this.detailsEl, ctx.selected, {
      analysis: ctx.tree.analysis,
      tree: ctx.tree,
      aggs: ctx.aggs,
      paramBytes: ctx.paramBytes,
      dtypeLabel: dtype === "recorded" ? "as recorded" : dtype,
      onCopy: (path) => {
        void copyText(path).then((ok) => this.handlers.toast(ok ? `Copied “${path}”` : "Copy failed"));
      },
    });
  }

  /** Draw the chart of the tab shown (none for details). */
  renderCharts(ctx: PanelContext): void {
    if (ctx.state.tab === "memory") this.renderMemory(ctx);
    else if (ctx.state.tab === "timeline") this.renderTimeline(ctx);
    else if (ctx.state.tab === "stages") this.stages.render(ctx.tree.analysis, this.width());
    else if (ctx.state.tab === "graph") {
      this.graph ??= new GraphView({ onSelect: (m) => this.handlers.onBar(m) });
      if (!this.graph.el.isConnected) this.graphEl.append(this.graph.el);
      this.graph.render(ctx.tree, ctx.aggs, ctx.state.depth, this.width());
      const sel = ctx.selected;
      if (sel) this.graph.select(sel.kind === "module" ? sel.module : (sel.members[0] as number));
    }
  }

  /**
   * A bar was clicked: select its module and, for a folded bar (the same module of 80 layers
   * summed), say which member that is and offer the group instead.
   */
  private pickBar(module: number): void {
    this.handlers.onBar(module);
    const bars = this.shownBars;
    const i = bars ? bars.modules.indexOf(module) : -1;
    const count = bars && i >= 0 ? (bars.counts[i] ?? 1) : 1;
    this.pickEl.textContent = "";
    if (!bars || count < 2) return;
    const label = bars.labels[i] ?? "";
    this.pickEl.append(
      document.createTextNode(`Selected the first of the ${count} modules this bar sums (${label}); its numbers are that one's. `),
    );
    if (this.handlers.onBarGroup) {
      const group = h("button", "mw-btn mw-bar-group", "Select the folded layers instead");
      group.type = "button";
      group.addEventListener("click", () => this.handlers.onBarGroup?.(module));
      this.pickEl.append(group);
    }
  }

  /** Mark module `module`'s bar as selected. */
  selectBar(module: number): void {
    this.memoryChart?.select(module);
    this.graph?.select(module);
  }

  barCenters(): { module: number; x: number; y: number }[] {
    return this.memoryChart?.barCenters() ?? [];
  }

  /**
   * The charts' and the graph's width: the panel's, or the last one seen while it is not laid
   * out (hidden, detached for a moment by the host: 0 wide), never a guess over a known width.
   */
  width(): number {
    const now = this.el.clientWidth;
    if (now) this.knownWidth = now;
    return Math.max(320, (this.knownWidth || 800) - 24);
  }

  resize(): void {
    this.memoryChart?.resize(this.width());
    this.timelineChart?.resize(this.width());
    this.stages.resize(this.width());
    this.graph?.resize(this.width());
  }

  destroy(): void {
    this.memoryChart?.destroy();
    this.timelineChart?.destroy();
  }

  private renderMemory(ctx: PanelContext): void {
    const { tree, state, precision: p } = ctx;
    const a = tree.analysis;
    this.memoryChart ??= new MemoryChart(this.memoryEl, (m) => this.pickBar(m));
    const labels = groupLabels(tree);
    // the same module of every folded layer is one bar (layers.0–79.mlp, summed)
    const folded = foldBars(
      memoryBars(a, frontier(a, state.depth), ctx.aggs, ctx.paramBytes, p?.actScale ?? 1),
      (m) => foldedPath(tree, m, labels) || a.title,
    );
    const bars = largestBars(folded, MAX_BARS);
    this.shownBars = bars;
    const training = a.memory.modules.gradientBytes.length > 0;
    let note = `Modules at depth ${state.depth} (and shallower leaves), repeated layers folded into one bar (summed): parameters (${state.dtype === "recorded" ? "as recorded" : state.dtype})${training ? ", their gradients and optimizer state at the end of the step" : ""} and output mem (the new storage their outputs hold), stacked. Each parameter counts at its first owner (tied weights once), so the bars add up to the totals.${a.memory.modules.paramBytes.length ? " Each bar is one rank's: its parameters' shards, as the totals count them (the table counts the whole model)." : ""} The peak by category above counts what is live at the peak. Click a bar to select the module.`;
    if (bars !== folded) note += ` Showing the ${MAX_BARS} largest of ${folded.modules.length}; a smaller depth shows all.`;
    this.memoryNote.textContent = note;
    renderCategoryBar(
      this.categoryEl,
      p ? { ...a.memory, categories: p.categories } : a.memory,
      p ? p.total : a.totals.peak_bytes,
    );
    if (p) this.categoryEl.prepend(h("div", "mw-precision-note", p.note));
    bars.activations = bars.activations.map((b) => ctx.outputBytes(b));
    this.memoryChart.setData(bars, this.width(), gpuBudget(a));
    const sel = ctx.selected;
    if (sel) this.memoryChart.select(sel.kind === "module" ? sel.module : (sel.members[0] as number));
  }

  private renderTimeline(ctx: PanelContext): void {
    const a = ctx.tree.analysis;
    const pr = ctx.precision;
    this.timelineChart ??= new TimelineChart(this.timelineEl);
    this.timelineNote.textContent = timelineNote(a);
    const t = a.totals;
    const c = pr?.categories;
    const base = c ? (c.parameters ?? 0) + (c.buffers ?? 0) + (c.inputs ?? 0) : t.param_bytes + t.buffer_bytes + t.input_bytes;
    const scaled = pr ? scaledTimeline(a, pr) : a.timeline.bytes;
    const top = scaled.length ? Math.max(...scaled) : 0;
    // left out by default where the constant part is most of the peak (big models)
    const leftOut = ctx.state.leaveOut ?? (top > 0 && base / top > 0.5);
    this.leaveOutBox.checked = leftOut;
    const bytes = leftOut ? scaled.map((b) => b - base) : scaled;
    if (pr) {
      // the same trace at another precision: the timeline re-scaled (see precision.ts)
      this.timelineNote.textContent = `${pr.note} Timeline re-scaled from the recorded trace; peak ${formatBytes(top)}.`;
    }
    const bands = stackTimeline(
      a.timeline.categories,
      bytes.length,
      leftOut,
      pr ? { staticBytes: pr.categories, actScale: pr.actScale } : undefined,
    );
    this.timelineChart.setData(
      { ...a, timeline: { ...a.timeline, bytes }, peak: a.peak && { ...a.peak, bytes: top } },
      this.width(),
      { bytes: base, leftOut },
      bands,
      gpuBudget(a),
    );
    renderComms(this.commsEl, a.comms ?? [], a.timeline.bytes.length, this.width(), formatBytes);
  }
}

/** The timeline's caption: what it shows, and where the peak is. */
function timelineNote(a: Analysis): string {
  const p = a.peak;
  const phase = a.memory.peakPhase;
  if (!p) return "Live bytes after each allocation and free over the forward pass.";
  const owner = peakOwner(a);
  return `Live bytes after each allocation and free${a.mode === "training" ? " (forward, backward, optimizer step)" : ""}. Peak ${formatBytes(p.bytes)} in ${owner}${p.op ? ` (${p.op})` : ""}${phase && !owner.includes(phase) ? `, in the ${phase} phase` : ""}.`;
}
