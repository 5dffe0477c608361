/**
 * The whole view, shared by the anywidget entry (`widget.ts`) and the standalone page
 * (`standalone.ts`): header with totals, error banner, progress line, toolbar (search, depth,
 * dtype), the virtualized tree table, and a tab area (details, memory chart, timeline).
 *
 * It holds the view state (expanded rows, filter, sort, selection, dtype) and re-renders at
 * most once per animation frame, so a stream of `calls` messages stays cheap.
 */
import { MemoryChart } from "./barchart";
import { foldBars, largestBars, memoryBars } from "./bars";
import {
  DTYPE_CHOICES,
  TimelineChart,
  paramBytesAt,
  renderCategoryBar,
  recordedFloatBytes,
  type DtypeChoice,
} from "./charts";
import { renderComms } from "./comms";
import { copyText, errorBlock, h, renderDetails } from "./details";
import { formatBytes, formatCount, formatExact, formatFlops, formatShapes } from "./format";
import { Header, renderProgress } from "./header";
import { PRECISION_HINT, precisionOf, scaledTimeline, type Precision } from "./precision";
import { peakOwner, type Analysis, type CallInfo, type Message, type ModuleInfo, type RerunMessage } from "./protocol";
import { RERUN_WAIT_MS, initialSession, reduce, type Session, type SessionEvent } from "./session";
import { stackTimeline } from "./stack";
import { Switches } from "./switches";
import { watchTheme } from "./theme";
import {
  aggregate,
  buildTree,
  expandToDepth,
  foldedPath,
  groupLabels,
  flatten,
  frontier,
  moduleKey,
  nodeName,
  nodeType,
  nodeValues,
  revealKeys,
  type Aggregate,
  type Row,
  type SortColumn,
  type Tree,
  type TreeNode,
} from "./tree";
import { TreeView, type Cell, type RowCells } from "./treeview";

export interface AppOptions {
  /** The user selected a module row (a folded group selects its first member). */
  onSelect?: (module: number) => void;
  /** Ask the kernel to analyze again; absent when there is no kernel (the standalone page). */
  onRerun?: (msg: RerunMessage) => void;
  standalone?: boolean;
}

/**
 * Parameter paths with a checkpoint problem, by module path: a parameter `a.b.weight` belongs to
 * module `a.b` (`name.rpartition(".")[0]`). Values say what is wrong, for the row's tooltip.
 */
export function checkpointProblems(a: Analysis): Map<string, string[]> {
  const out = new Map<string, string[]>();
  const c = a.checkpoint;
  if (!c) return out;
  const add = (name: string, what: string): void => {
    const k = name.lastIndexOf(".");
    const module = k < 0 ? "" : name.slice(0, k);
    const list = out.get(module) ?? [];
    list.push(`${name}: ${what}`);
    out.set(module, list);
  };
  for (const n of c.missing) add(n, "missing from the checkpoint");
  for (const m of c.shapeMismatches)
    add(m.name, `shape [${m.model.join(", ")}] in the model, [${m.checkpoint.join(", ")}] in the checkpoint`);
  return out;
}

type Tab = "details" | "memory" | "timeline";

interface Scales {
  params: number;
  paramBytes: number;
  acts: number;
  flops: number;
}

/** The most bars drawn (the largest): the chart grows with them and has no scrollbar of its own. */
const MAX_BARS = 40;
const DEFAULT_DEPTH = 2;

export class App {
  readonly root: HTMLDivElement;
  /** What the kernel's messages and the user's re-runs made of the analysis (`session.ts`). */
  private session: Session = initialSession;
  private tree: Tree | null = null;
  private aggs: Aggregate[] = [];
  /** Module row i or something below it was called. */
  private reached: boolean[] = [];
  private rows: Row[] = [];
  private rowOfKey = new Map<string, number>();
  private expanded = new Set<string>();
  private depth = DEFAULT_DEPTH;
  /** Depth asked for (the `depth` trait); clamped to the model's depth on each new model. */
  private preferredDepth = DEFAULT_DEPTH;
  private filter = "";
  private sort: { column: SortColumn; descending: boolean } = { column: "order", descending: true };
  private selectedKey: string | null = null;
  private dtype: DtypeChoice = "recorded";
  private recordedBpe = 4;
  private scaleCache: Scales | null = null;
  private tab: Tab = "details";
  private timer: ReturnType<typeof setInterval> | null = null;
  /** Redraws the progress line when a re-run has gone unanswered for `RERUN_WAIT_MS`. */
  private rerunTimer: ReturnType<typeof setTimeout> | null = null;
  private frame = 0;
  private chartsDirty = true;
  private resizeObs: ResizeObserver | null = null;
  private lastWidth = 0;
  private unwatchTheme: () => void = () => {};

  // DOM
  private header = new Header();
  private switches: Switches;
  private banner = h("div", "mw-banner");
  private progressEl = h("div", "mw-progress");
  private search = h("input", "mw-search");
  private depthSel = h("select", "mw-select");
  private dtypeBox = h("div", "mw-seg");
  private tableWrap = h("div", "mw-table-wrap");
  private emptyEl = h("div", "mw-table-empty");
  private view: TreeView;
  private tabsEl = h("div", "mw-tabs");
  private panel = h("div", "mw-panel");
  private detailsEl = h("div", "mw-details");
  private memoryEl = h("div", "mw-memory");
  private timelineEl = h("div", "mw-timeline");
  private memoryNote = h("div", "mw-muted mw-chart-note");
  private timelineNote = h("div", "mw-muted mw-chart-note");
  /** "Leave out parameters": the timeline without its constant part (null: not chosen yet). */
  private leaveOut: boolean | null = null;
  private leaveOutBox = h("input", "mw-leave-out");
  private commsEl = h("div", "mw-comms");
  private toast = h("div", "mw-toast");
  private checkpointEl = h("div", "mw-checkpoint");
  private categoryEl = h("div", "mw-categories");
  /** Module path -> checkpoint problems of its own parameters. */
  private ckpt = new Map<string, string[]>();
  private memoryChart: MemoryChart | null = null;
  private timelineChart: TimelineChart | null = null;
  private tabButtons = new Map<Tab, HTMLButtonElement>();

  constructor(
    private host: HTMLElement,
    private opts: AppOptions = {},
  ) {
    this.root = h("div", `mw-root${opts.standalone ? " mw-standalone" : ""}`);
    const onRerun = opts.onRerun;
    this.switches = new Switches(
      onRerun &&
        ((msg: RerunMessage) => {
          this.dispatch(msg);
          onRerun(msg);
        }),
    );

    const toolbar = h("div", "mw-toolbar");
    this.search.type = "search";
    this.search.placeholder = "Filter: name, type, path or glob (layers.*.mlp)";
    this.search.setAttribute("aria-label", "Filter modules by name, type, dotted path or glob");
    this.search.title =
      "A name or class substring (attn, Linear), or a dotted path from any depth (mlp.c_fc) where * stands for one segment (layers.*.mlp). Matches inside folded layers stay folded: the first one is shown.";
    this.search.addEventListener("input", this.onSearch);
    const depthLabel = h("label", "mw-label", "Depth ");
    depthLabel.append(this.depthSel);
    depthLabel.title = "Expand the tree to this depth (the memory chart shows modules at it)";
    this.depthSel.addEventListener("change", this.onDepth);
    const dtypeLabel = h("span", "mw-label", "Precision ");
    dtypeLabel.title = PRECISION_HINT;
    for (const d of DTYPE_CHOICES) {
      const b = h("button", "mw-seg-btn", d === "recorded" ? "recorded" : d);
      b.type = "button";
      b.dataset.dtype = d;
      b.addEventListener("click", () => this.setDtype(d));
      this.dtypeBox.append(b);
    }
    dtypeLabel.append(this.dtypeBox);
    const collapse = h("button", "mw-btn", "Collapse all");
    collapse.type = "button";
    collapse.addEventListener("click", () => {
      this.expanded = new Set(this.tree?.root ? [this.tree.root.key] : []);
      this.schedule();
    });
    // after the depth menu: tests and the benchmark find the depth menu as the first .mw-select
    toolbar.append(this.search, depthLabel, dtypeLabel, collapse, this.switches.el);

    this.view = new TreeView(this.tableWrap, {
      describe: (row) => this.describe(row),
      onSelect: (i) => this.selectRow(i, true),
      onToggle: (i, open, deep) => (deep ? this.openAllBelow(i) : this.toggleRow(i, open)),
      onSort: (c) => this.cycleSort(c),
    });
    this.tableWrap.append(this.emptyEl);

    for (const [tab, label] of [
      ["details", "Details"],
      ["memory", "Memory by module"],
      ["timeline", "Memory timeline"],
    ] as [Tab, string][]) {
      const b = h("button", "mw-tab", label);
      b.type = "button";
      b.setAttribute("role", "tab");
      b.dataset.tab = tab;
      b.addEventListener("click", () => this.setTab(tab));
      this.tabButtons.set(tab, b);
      this.tabsEl.append(b);
    }
    this.tabsEl.setAttribute("role", "tablist");
    this.memoryEl.append(this.categoryEl, this.memoryNote);
    this.leaveOutBox.type = "checkbox";
    this.leaveOutBox.addEventListener("change", () => {
      this.leaveOut = this.leaveOutBox.checked;
      this.chartsDirty = true;
      this.schedule();
    });
    const leaveOut = h("label", "mw-label mw-leave-out-label");
    leaveOut.append(this.leaveOutBox, document.createTextNode(" Leave out parameters, buffers and inputs"));
    leaveOut.title =
      "They are live from start to end: without them the y axis shows what the pass itself allocates (activations, temporaries, gradients, optimizer state)";
    this.timelineEl.append(leaveOut, this.timelineNote, this.commsEl);
    this.panel.append(this.detailsEl, this.memoryEl, this.timelineEl);

    this.root.append(
      this.header.el,
      this.banner,
      this.checkpointEl,
      this.header.notesEl,
      this.progressEl,
      toolbar,
      this.tableWrap,
      this.tabsEl,
      this.panel,
      this.toast,
    );
    host.append(this.root);
    if (typeof ResizeObserver !== "undefined") {
      this.resizeObs = new ResizeObserver(() => {
        const w = this.panel.clientWidth;
        if (w && Math.abs(w - this.lastWidth) > 4) {
          this.lastWidth = w;
          this.memoryChart?.resize(this.chartWidth());
          this.timelineChart?.resize(this.chartWidth());
        }
      });
      this.resizeObs.observe(this.root);
    }
    // canvas charts take their colors when drawn: draw again when the host's theme changes
    this.unwatchTheme = watchTheme(this.root, () => {
      this.chartsDirty = true;
      this.schedule();
    });
    this.setTab("details");
    this.render();
  }

  // -------------------------------------------------------------------------------------------
  // Inputs
  // -------------------------------------------------------------------------------------------

  private get analysis(): Analysis | null {
    return this.session.analysis;
  }

  /** Show a decoded payload (null: nothing yet). Keeps view state when the model is the same. */
  setAnalysis(a: Analysis | null): void {
    this.dispatch({ type: "payload", analysis: a });
  }

  handleMessage(msg: Message): void {
    this.dispatch(msg);
  }

  /** Move the session on by one event, then do what the view must: timers, a new tree, a redraw. */
  private dispatch(event: SessionEvent): void {
    const prev = this.session;
    const next = reduce(prev, event, performance.now());
    this.session = next;
    const a = next.analysis;
    if (a !== prev.analysis) this.showAnalysis(prev.analysis, a);
    else if (event.type === "payload" && a) this.showAnalysis(a, a);
    if (event.type === "start") this.startTimer();
    if (event.type === "rerun") this.watchRerun();
    if (a?.status !== "running") this.stopTimer();
    if (event.type !== "phase" && event.type !== "rerun") this.chartsDirty = true;
    this.schedule(event.type === "payload" || event.type === "start");
  }

  /** A new analysis object: rebuild the tree, and reset depth and selection for a new model. */
  private showAnalysis(prev: Analysis | null, a: Analysis | null): void {
    const same =
      prev !== null &&
      a !== null &&
      prev.modules.length === a.modules.length &&
      prev.title === a.title &&
      prev.modules.every((m, i) => m.type === a.modules[i]?.type);
    this.tree = a ? buildTree(a) : null;
    this.recordedBpe = a ? recordedFloatBytes(a) : 4;
    this.scaleCache = null;
    this.ckpt = a ? checkpointProblems(a) : new Map();
    if (a && !this.session.rerunning && (a.mode === "inference" || a.mode === "training")) {
      this.switches.showAnalyzed(a); // the switches show what was analyzed
    }
    if (!same) {
      const maxDepth = a ? Math.max(0, ...a.modules.map((m) => m.depth)) : 0;
      this.depth = Math.max(1, Math.min(this.preferredDepth, maxDepth));
      // a new model opens to its depth with repeated layers folded ("all" in the menu opens them)
      this.expanded = this.tree ? expandToDepth(this.tree, this.depth) : new Set();
      // the root is selected (not sent to the kernel) so that the details panel shows totals
      this.selectedKey = this.tree?.root ? this.tree.root.key : null;
      this.fillDepthOptions(maxDepth);
    }
  }

  destroy(): void {
    this.switches.destroy();
    this.stopTimer();
    if (this.rerunTimer !== null) clearTimeout(this.rerunTimer);
    cancelAnimationFrame(this.frame);
    this.resizeObs?.disconnect();
    this.unwatchTheme();
    this.search.removeEventListener("input", this.onSearch);
    this.depthSel.removeEventListener("change", this.onDepth);
    this.view.destroy();
    this.memoryChart?.destroy();
    this.timelineChart?.destroy();
    this.root.remove();
  }

  /** Expand the tree to `depth` (root = 0); the memory chart shows modules at that depth. */
  setDepth(depth: number): void {
    if (!Number.isFinite(depth) || depth < 1) return;
    this.preferredDepth = Math.floor(depth);
    const maxDepth = this.analysis ? Math.max(0, ...this.analysis.modules.map((m) => m.depth)) : 0;
    this.depth = Math.max(1, Math.min(this.preferredDepth, Math.max(1, maxDepth)));
    this.depthSel.value = String(this.depth);
    if (this.tree) this.expanded = expandToDepth(this.tree, this.depth);
    this.chartsDirty = true;
    this.schedule(true);
  }

  /** The keys open at the depth picked in the menu: "all" opens folded groups too. */
  private expandTo(depth: number): Set<string> {
    return this.tree ? expandToDepth(this.tree, depth, depth >= this.maxDepth()) : new Set();
  }

  private maxDepth(): number {
    return this.analysis ? Math.max(0, ...this.analysis.modules.map((m) => m.depth)) : 0;
  }

  /** Bars' screen positions, for browser tests that click a real bar. */
  barCenters(): { module: number; x: number; y: number }[] {
    return this.memoryChart?.barCenters() ?? [];
  }

  // -------------------------------------------------------------------------------------------
  // State changes
  // -------------------------------------------------------------------------------------------

  private onSearch = (): void => {
    this.filter = this.search.value;
    this.schedule();
  };

  private onDepth = (): void => {
    this.depth = Number(this.depthSel.value);
    if (this.tree) this.expanded = this.expandTo(this.depth);
    this.chartsDirty = true;
    this.schedule();
  };

  private setDtype(d: DtypeChoice): void {
    this.dtype = d;
    this.scaleCache = null;
    this.chartsDirty = true;
    this.schedule();
  }

  private setTab(tab: Tab): void {
    this.tab = tab;
    for (const [t, b] of this.tabButtons) {
      b.classList.toggle("mw-active", t === tab);
      b.setAttribute("aria-selected", String(t === tab));
    }
    this.detailsEl.style.display = tab === "details" ? "" : "none";
    this.memoryEl.style.display = tab === "memory" ? "" : "none";
    this.timelineEl.style.display = tab === "timeline" ? "" : "none";
    this.chartsDirty = true;
    this.schedule();
  }

  private cycleSort(c: SortColumn): void {
    const s = this.sort;
    const numeric = c !== "name";
    if (s.column !== c) this.sort = { column: c, descending: numeric };
    else if (s.descending === numeric) this.sort = { column: c, descending: !numeric };
    else this.sort = { column: "order", descending: true };
    this.schedule();
  }

  private toggleRow(i: number, open?: boolean): void {
    const row = this.rows[i];
    if (!row || !row.hasChildren) return;
    const isOpen = row.expanded;
    const want = open ?? !isOpen;
    if (want === isOpen) return;
    if (this.filter.trim()) {
      // rows under a filter are open because of their matches; clear the filter to browse
      return;
    }
    if (want) this.expanded.add(row.node.key);
    else this.expanded.delete(row.node.key);
    this.schedule(true);
  }

  /** Alt+click on a caret: open the row and everything below it, every folded member too. */
  private openAllBelow(i: number): void {
    const row = this.rows[i];
    if (!row || !this.tree || this.filter.trim()) return;
    const visit = (node: TreeNode): void => {
      if (node.children.length === 0) return;
      this.expanded.add(node.key);
      for (const c of node.children) visit(c);
    };
    visit(row.node);
    this.schedule(true);
  }

  private selectRow(i: number, notify: boolean): void {
    const row = this.rows[i];
    if (!row) return;
    this.selectedKey = row.node.key;
    this.view.setSelected(i);
    this.afterSelect(row.node, notify);
  }

  /** Select a module by row index (from the chart): opens what hides it. */
  selectModule(module: number, notify = true): void {
    if (!this.tree) return;
    for (const k of revealKeys(this.tree, module)) this.expanded.add(k);
    this.selectedKey = moduleKey(module);
    if (this.filter) {
      this.filter = "";
      this.search.value = "";
    }
    this.computeRows();
    const i = this.rowOfKey.get(this.selectedKey) ?? -1;
    this.view.setRows(this.rows, i);
    this.view.scrollTo(i);
    const node = this.rows[i]?.node;
    if (node) this.afterSelect(node, notify);
  }

  private afterSelect(node: TreeNode, notify: boolean): void {
    const module = node.kind === "module" ? node.module : (node.members[0] as number);
    this.memoryChart?.select(module);
    this.renderDetails();
    if (notify) this.opts.onSelect?.(module);
  }

  // -------------------------------------------------------------------------------------------
  // Rendering
  // -------------------------------------------------------------------------------------------

  private schedule(immediateRows = false): void {
    if (immediateRows) this.computeRows();
    if (this.frame) return;
    const raf =
      typeof requestAnimationFrame === "function"
        ? requestAnimationFrame
        : (cb: FrameRequestCallback) => setTimeout(() => cb(0), 16) as unknown as number;
    this.frame = raf(() => {
      this.frame = 0;
      this.render();
    });
  }

  /** Render now (tests call this instead of waiting for a frame). */
  render(): void {
    this.aggs = this.analysis ? aggregate(this.analysis) : [];
    this.scaleCache = null;
    this.reached = this.aggs.map((g) => g.calls > 0);
    const mods = this.analysis?.modules ?? [];
    for (let i = mods.length - 1; i > 0; i--) {
      const p = (mods[i] as ModuleInfo).parent;
      if (this.reached[i] && p >= 0) this.reached[p] = true;
    }
    this.computeRows();
    const sel = this.selectedKey ? (this.rowOfKey.get(this.selectedKey) ?? -1) : -1;
    this.view.setSort(this.sort.column, this.sort.descending);
    this.view.setTraining(this.aggs.some((g) => g.backwardFlops > 0));
    this.view.setRows(this.rows, sel);
    this.renderHeader();
    this.switches.render(this.session);
    this.renderBanner();
    this.renderCheckpoint();
    this.renderProgress();
    this.renderEmpty();
    this.renderDetails();
    for (const b of this.dtypeBox.querySelectorAll<HTMLButtonElement>("button")) {
      b.classList.toggle("mw-active", b.dataset.dtype === this.dtype);
      b.setAttribute("aria-pressed", String(b.dataset.dtype === this.dtype));
    }
    if (this.chartsDirty && this.tab !== "details") this.renderCharts();
  }

  private paramBytes = (m: ModuleInfo): number => paramBytesAt(m, this.dtype, this.recordedBpe);

  /** The precision the switch shows (null: as recorded): the kernel's what-if numbers. */
  private precision(): Precision | null {
    return precisionOf(this.analysis, this.dtype);
  }

  /** Output mem at the switch's precision (activations follow bf16/fp16, not int8/int4). */
  private outputBytes(bytes: number): number {
    return Math.round(bytes * (this.precision()?.actScale ?? 1));
  }

  private computeRows(): void {
    if (!this.tree) {
      this.rows = [];
      this.rowOfKey.clear();
      return;
    }
    const a = this.tree.analysis;
    if (this.aggs.length !== a.modules.length) {
      this.aggs = aggregate(a);
      this.scaleCache = null;
    }
    const aggs = this.aggs;
    const streaming = a.status === "running";
    this.rows = flatten(this.tree, {
      expanded: this.expanded,
      filter: this.filter,
      // while streaming, rows appear as their module's calls arrive
      keep: streaming ? (m) => (aggs[m.index]?.calls ?? 0) > 0 : undefined,
      sort: this.sort,
      aggs,
      paramBytes: this.paramBytes,
    });
    this.rowOfKey.clear();
    this.rows.forEach((r, i) => this.rowOfKey.set(r.node.key, i));
  }

  /** Largest values, for the inline bars: cached per aggregate/dtype change (not per row). */
  private scales(): Scales {
    this.scaleCache ??= this.computeScales();
    return this.scaleCache;
  }

  private computeScales(): Scales {
    const a = this.analysis;
    const root = a?.modules[0];
    if (!a || !root) return { params: 1, paramBytes: 1, acts: 1, flops: 1 };
    let acts = 0;
    let flops = 0;
    for (const g of this.aggs) {
      if (g.activationBytes > acts) acts = g.activationBytes;
      if (g.flops > flops) flops = g.flops;
    }
    return {
      params: root.params || 1,
      paramBytes: this.paramBytes(root) || 1,
      acts: acts || 1,
      flops: flops || 1,
    };
  }

  private shapesCell(calls: CallInfo[], which: "inputs" | "outputs"): Cell {
    const first = calls[0];
    if (!first) return { text: "" };
    const text = formatShapes(first[which].map((t) => t.shape));
    const all = calls.map((c) => formatShapes(c[which].map((t) => t.shape)));
    const differ = all.some((s) => s !== text);
    const title =
      calls.length > 1
        ? all
            .slice(0, 12)
            .map((s, k) => `call ${k + 1}: ${s}`)
            .join("\n") + (calls.length > 12 ? `\n… ${calls.length - 12} more` : "")
        : text;
    return { text: differ ? `${text} …` : text, title };
  }

  private describe(row: Row): RowCells {
    const tree = this.tree as Tree;
    const a = tree.analysis;
    const node = row.node;
    const v = nodeValues(tree, node, this.aggs, this.paramBytes);
    const s = this.scales();
    const mi = node.kind === "module" ? node.module : (node.members[0] as number);
    const m = a.modules[mi] as ModuleInfo;
    const calls = m.calls.map((j) => a.calls[j]).filter((c): c is CallInfo => c !== undefined);
    const traced = a.status !== "structural";
    // a container that is never called itself (ModuleList): its numbers are in its children
    const container = traced && v.calls === 0 && this.reached[mi] === true;
    const name = nodeName(tree, node);
    const type = nodeType(tree, node);
    const shown = traced && !container;
    return {
      name,
      type: m.parent < 0 && node.kind === "module" && type === name ? "" : type,
      calls: node.kind === "module" ? v.calls : Math.round(v.calls / node.members.length),
      error: v.error,
      assumed: v.assumed,
      dim: traced && v.calls === 0 && !container,
      checkpoint: this.checkpointMarker(node, row.hasChildren && !row.expanded),
      group: node.kind === "group",
      inputs: this.shapesCell(calls, "inputs"),
      outputs: this.shapesCell(calls, "outputs"),
      params: {
        text: formatCount(v.params),
        title: `${formatExact(v.params)} parameters`,
        fraction: v.params / s.params,
      },
      paramBytes: {
        text: formatBytes(v.paramBytes),
        title: `${formatExact(v.paramBytes)} bytes`,
        fraction: v.paramBytes / s.paramBytes,
      },
      activationBytes: {
        text: shown ? formatBytes(this.outputBytes(v.activationBytes)) : "–",
        title: container
          ? "not called itself (a container): see its children"
          : `${formatExact(this.outputBytes(v.activationBytes))} bytes (outputs' new storage, summed over calls${this.dtype === "recorded" ? "" : `, at ${this.dtype}`})`,
        fraction: v.activationBytes / s.acts,
      },
      flops: {
        text: shown ? formatFlops(v.flops) : "–",
        title: container
          ? "not called itself (a container): see its children"
          : v.backwardFlops
            ? `${formatExact(v.flops)} FLOPs: forward ${formatExact(v.flops - v.backwardFlops)} + backward ${formatExact(v.backwardFlops)}`
            : `${formatExact(v.flops)} FLOPs`,
        fraction: v.flops / s.flops,
      },
    };
  }

  /**
   * Checkpoint problems of the row's own parameters (a group: of any member); a collapsed row
   * also shows those of the modules it hides, so that a folded problem is not lost.
   */
  private checkpointMarker(node: TreeNode, collapsed: boolean): string {
    if (this.ckpt.size === 0 || !this.analysis) return "";
    const members = node.kind === "module" ? [node.module] : node.members;
    const lines: string[] = [];
    for (const i of members) {
      const path = this.analysis.modules[i]?.path;
      if (path === undefined) continue;
      for (const [k, p] of this.ckpt) {
        if (k === path || (collapsed && (path === "" || k.startsWith(`${path}.`)))) lines.push(...p);
      }
    }
    if (lines.length === 0) return "";
    return lines.slice(0, 8).join("\n") + (lines.length > 8 ? `\n… ${lines.length - 8} more` : "");
  }

  private renderCheckpoint(): void {
    const c = this.analysis?.checkpoint;
    this.checkpointEl.textContent = "";
    this.checkpointEl.style.display = c ? "" : "none";
    if (!c) return;
    this.checkpointEl.classList.toggle("mw-checkpoint-ok", c.ok);
    const head = h(
      "div",
      "mw-checkpoint-head",
      c.ok
        ? `Checkpoint fits the model: ${formatExact(c.matched.length)} keys match.`
        : `Checkpoint does not fit the model: ${formatExact(c.matched.length)} keys match.`,
    );
    this.checkpointEl.append(head);
    const some = (names: string[]): string =>
      names.slice(0, 5).join(", ") + (names.length > 5 ? `, … (${names.length} in all)` : "");
    const lines: [string, number, string][] = [
      ["missing from the checkpoint", c.missing.length, some(c.missing)],
      ["unexpected in the checkpoint", c.unexpected.length, some(c.unexpected)],
      [
        "shape mismatches",
        c.shapeMismatches.length,
        some(c.shapeMismatches.map((m) => `${m.name} (model [${m.model.join(", ")}], checkpoint [${m.checkpoint.join(", ")}])`)),
      ],
      [
        "dtype mismatches",
        c.dtypeMismatches.length,
        some(c.dtypeMismatches.map((m) => `${m.name} (${m.model} vs ${m.checkpoint})`)),
      ],
    ];
    for (const [label, n, names] of lines) {
      if (n === 0) continue;
      const line = h("div", "mw-checkpoint-line");
      line.dataset.kind = label;
      line.append(h("span", "mw-checkpoint-count", `${formatExact(n)} ${label}`), h("span", "mw-checkpoint-names", `: ${names}`));
      this.checkpointEl.append(line);
    }
    for (const hint of c.hints) this.checkpointEl.append(h("div", "mw-checkpoint-hint", hint));
    if (this.ckpt.size) this.checkpointEl.append(h("div", "mw-muted", "Rows marked ✕ hold parameters that are missing or mis-shaped."));
  }

  private renderHeader(): void {
    const root = this.analysis?.modules[0];
    const p = this.precision();
    this.header.render(this.analysis, this.aggs[0], {
      label: this.dtype === "recorded" ? "param memory" : `param memory (${this.dtype})`,
      bytes: root ? this.paramBytes(root) : (this.analysis?.totals.param_bytes ?? 0),
      peak: p
        ? {
            label: `peak (${p.choice}, estimate)`,
            bytes: p.total,
            note: p.note,
            gradients: Math.round((this.analysis?.memory.gradientBytes ?? 0) * p.actScale),
            optimizerState: p.categories["optimizer state"] ?? 0,
          }
        : undefined,
    });
  }

  private renderBanner(): void {
    this.banner.textContent = "";
    const err = this.analysis?.error;
    this.banner.style.display = err ? "" : "none";
    if (!err || !this.analysis) return;
    const box = errorBlock(err);
    const a = this.analysis;
    const call = a.calls[err.call];
    const module = call ? call.module : a.modules.findIndex((m) => m.path === err.module);
    if (module >= 0) {
      const go = h("button", "mw-btn", "Show in tree");
      go.type = "button";
      go.addEventListener("click", () => this.selectModule(module));
      box.append(go);
    }
    this.banner.append(box);
  }

  private renderProgress(): void {
    renderProgress(this.progressEl, this.session, performance.now());
  }

  private renderEmpty(): void {
    const a = this.analysis;
    let text = "";
    if (!a) text = "Nothing analyzed yet.";
    else if (this.rows.length === 0) {
      if (this.filter.trim()) text = `No module name, type or path matches “${this.filter.trim()}”.`;
      else if (a.status === "running") text = "Waiting for the first calls…";
      else text = "This model has no modules.";
    }
    this.emptyEl.textContent = text;
    this.emptyEl.style.display = text ? "" : "none";
  }

  private selectedNode(): TreeNode | null {
    if (!this.selectedKey) return null;
    const i = this.rowOfKey.get(this.selectedKey);
    return i === undefined ? null : (this.rows[i]?.node ?? null);
  }

  private renderDetails(): void {
    if (this.tab !== "details" || !this.tree) {
      if (!this.tree) this.detailsEl.textContent = "";
      return;
    }
    renderDetails(this.detailsEl, this.selectedNode(), {
      analysis: this.tree.analysis,
      tree: this.tree,
      aggs: this.aggs,
      paramBytes: this.paramBytes,
      dtypeLabel: this.dtype === "recorded" ? "as recorded" : this.dtype,
      onCopy: (path) => {
        void copyText(path).then((ok) => this.showToast(ok ? `Copied “${path}”` : "Copy failed"));
      },
    });
  }

  private chartWidth(): number {
    return Math.max(320, (this.panel.clientWidth || 800) - 24);
  }

  private renderCharts(): void {
    const a = this.analysis;
    if (!a) return;
    this.chartsDirty = false;
    if (this.tab === "memory") {
      this.memoryChart ??= new MemoryChart(this.memoryEl, (m) => this.selectModule(m));
      const tree = this.tree;
      const labels = tree ? groupLabels(tree) : new Map<string, string>();
      const p = this.precision();
      // the same module of every folded layer is one bar (layers.0–79.mlp, summed)
      const folded = foldBars(
        memoryBars(a, frontier(a, this.depth), this.aggs, this.paramBytes, p?.actScale ?? 1),
        (m) => (tree ? foldedPath(tree, m, labels) || a.title : String(m)),
      );
      const bars = largestBars(folded, MAX_BARS);
      const training = a.memory.modules.gradientBytes.length > 0;
      let note = `Modules at depth ${this.depth} (and shallower leaves), repeated layers folded into one bar (summed): parameters (${this.dtype === "recorded" ? "as recorded" : this.dtype})${training ? ", their gradients and optimizer state at the end of the step" : ""} and output mem (the new storage their outputs hold), stacked. Each parameter counts at its first owner (tied weights once), so the bars add up to the totals. The peak by category above counts what is live at the peak. Click a bar to select the module.`;
      if (bars !== folded) note += ` Showing the ${MAX_BARS} largest of ${folded.modules.length}; a smaller depth shows all.`;
      this.memoryNote.textContent = note;
      renderCategoryBar(
        this.categoryEl,
        p ? { ...a.memory, categories: p.categories } : a.memory,
        p ? p.total : a.totals.peak_bytes,
      );
      if (p) this.categoryEl.prepend(h("div", "mw-precision-note", p.note));
      bars.activations = bars.activations.map((b) => this.outputBytes(b));
      this.memoryChart.setData(bars, this.chartWidth());
      const sel = this.selectedNode();
      if (sel) this.memoryChart.select(sel.kind === "module" ? sel.module : (sel.members[0] as number));
    } else if (this.tab === "timeline") {
      this.timelineChart ??= new TimelineChart(this.timelineEl);
      const p = a.peak;
      const phase = a.memory.peakPhase;
      this.timelineNote.textContent = p
        ? `Live bytes after each allocation and free${a.mode === "training" ? " (forward, backward, optimizer step)" : ""}. Peak ${formatBytes(p.bytes)} in ${peakOwner(a)}${p.op ? ` (${p.op})` : ""}${phase && !peakOwner(a).includes(phase) ? `, in the ${phase} phase` : ""}.`
        : "Live bytes after each allocation and free over the forward pass.";
      const pr = this.precision();
      const t = a.totals;
      const c = pr?.categories;
      const base = c
        ? (c.parameters ?? 0) + (c.buffers ?? 0) + (c.inputs ?? 0)
        : t.param_bytes + t.buffer_bytes + t.input_bytes;
      const scaled = pr ? scaledTimeline(a, pr) : a.timeline.bytes;
      const top = scaled.length ? Math.max(...scaled) : 0;
      // left out by default where the constant part is most of the peak (big models)
      const leftOut = this.leaveOut ?? (top > 0 && base / top > 0.5);
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
        this.chartWidth(),
        { bytes: base, leftOut },
        bands,
      );
      renderComms(this.commsEl, a.comms ?? [], a.timeline.bytes.length, this.chartWidth(), formatBytes);
    }
  }

  private showToast(text: string): void {
    this.toast.textContent = text;
    this.toast.classList.add("mw-show");
    setTimeout(() => this.toast.classList.remove("mw-show"), 1600);
  }

  private fillDepthOptions(maxDepth: number): void {
    this.depthSel.textContent = "";
    for (let d = 1; d <= Math.max(1, maxDepth); d++) {
      const o = h("option", "", d === maxDepth && d > 1 ? `${d} (all)` : String(d));
      o.value = String(d);
      this.depthSel.append(o);
    }
    this.depthSel.value = String(this.depth);
  }

  private startTimer(): void {
    this.stopTimer();
    this.timer = setInterval(() => this.renderProgress(), 250);
  }

  /** Say so on the progress line if the kernel has not started the re-run in `RERUN_WAIT_MS`. */
  private watchRerun(): void {
    if (this.rerunTimer !== null) clearTimeout(this.rerunTimer);
    this.rerunTimer = setTimeout(() => {
      this.rerunTimer = null;
      this.renderProgress();
    }, RERUN_WAIT_MS);
  }

  private stopTimer(): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }
}
