/**
 * The whole view, shared by the anywidget entry (`widget.ts`) and the standalone page
 * (`standalone.ts`): header with totals, error banner, checkpoint box, progress line, toolbar,
 * the virtualized tree table, and the tab area (details, memory chart, timeline).
 *
 * Two reducers hold the state: the session (`session.ts`: what the kernel's messages made of the
 * analysis) and the view state (`viewstate.ts`: what the user did to the view). `App` dispatches
 * to them, keeps the DOM and runs the side effects (timers, the kernel's `select`, redraws), and
 * re-renders at most once per animation frame, so a stream of `calls` messages stays cheap.
 */
import { paramBytesAt, recordedFloatBytes } from "./charts";
import { checkpointProblems, renderCheckpoint } from "./checkpoint";
import { h } from "./details";
import { Header, ProgressLine, renderBanner } from "./header";
import { Panels, type PanelContext } from "./panels";
import { precisionOf, type Precision } from "./precision";
import type { Analysis, Message, ModuleInfo, RerunMessage } from "./protocol";
import { computeScales, describeRow, emptyText, layerProgress, reachedModules, type Scales } from "./rows";
import { initialSession, reduce, type Session, type SessionEvent } from "./session";
import { Switches } from "./switches";
import { watchTheme } from "./theme";
import { Toolbar } from "./toolbar";
import { aggregate, buildTree, flatten, moduleMatcher, type Aggregate, type Row, type Tree, type TreeNode } from "./tree";
import { TreeView } from "./treeview";
import { initialViewState, moduleOf, reduceView, sameModel, treeDepth, type ViewAction, type ViewState } from "./viewstate";

export interface AppOptions {
  /** The user selected a module row (a folded group selects its first member). */
  onSelect?: (module: number) => void;
  /** Ask the kernel to analyze again; absent when there is no kernel (the standalone page). */
  onRerun?: (msg: RerunMessage) => void;
  standalone?: boolean;
}

export class App {
  readonly root: HTMLDivElement;
  /** What the kernel's messages and the user's re-runs made of the analysis (`session.ts`). */
  private session: Session = initialSession;
  /** What the user did to the view (`viewstate.ts`). */
  private state: ViewState = initialViewState;
  // derived from the session and the view state; rebuilt as they change
  private tree: Tree | null = null;
  private aggs: Aggregate[] = [];
  private reached: boolean[] = [];
  private rows: Row[] = [];
  private rowOfKey = new Map<string, number>();
  private recordedBpe = 4;
  private scaleCache: Scales | null = null;
  /** Module path -> checkpoint problems of its own parameters. */
  private ckpt = new Map<string, string[]>();
  // side effects
  private frame = 0;
  private chartsDirty = true;
  private resizeObs: ResizeObserver | null = null;
  private lastWidth = 0;
  private unwatchTheme: () => void = () => {};
  // DOM
  private header = new Header();
  private switches: Switches;
  private toolbar: Toolbar;
  private banner = h("div", "mw-banner");
  private checkpointEl = h("div", "mw-checkpoint");
  private progress = new ProgressLine(
    () => this.session,
    () => (this.tree && this.analysis?.status === "running" ? layerProgress(this.tree, this.aggs) : null),
  );
  private tableWrap = h("div", "mw-table-wrap");
  private emptyEl = h("div", "mw-table-empty");
  private view: TreeView;
  private panels: Panels;
  private toast = h("div", "mw-toast");

  constructor(
    host: HTMLElement,
    private opts: AppOptions = {},
  ) {
    this.root = h("div", `mw-root${opts.standalone ? " mw-standalone" : ""}`);
    this.root.addEventListener("keydown", keepKeys);
    const onRerun = opts.onRerun;
    this.switches = new Switches(
      onRerun &&
        ((msg: RerunMessage) => {
          this.dispatch(msg);
          onRerun(msg);
        }),
    );
    this.toolbar = new Toolbar(
      {
        onFilter: (text) => this.update({ type: "filter", text }),
        onDepth: (depth) => this.update({ type: "depth", depth, tree: this.tree }),
        onDtype: (dtype) => this.update({ type: "dtype", dtype }),
        onCollapse: () => this.update({ type: "collapseAll", tree: this.tree }),
      },
      this.switches.el,
    );
    this.view = new TreeView(this.tableWrap, {
      describe: (row) => this.describe(row),
      onSelect: (i) => this.selectRow(i),
      onToggle: (i, open, deep) => this.toggleRow(i, open, deep === true),
      onSort: (column) => this.update({ type: "sort", column }),
    });
    this.tableWrap.append(this.emptyEl);
    this.panels = new Panels({
      onTab: (tab) => this.update({ type: "tab", tab }),
      onLeaveOut: (value) => this.update({ type: "leaveOut", value }),
      onBar: (module) => this.selectModule(module),
      onBarGroup: (module) => this.selectGroupOf(module),
      toast: (text) => this.showToast(text),
    });
    this.root.append(
      this.header.el,
      this.banner,
      this.checkpointEl,
      this.header.notesEl,
      this.progress.el,
      this.toolbar.el,
      this.tableWrap,
      this.panels.tabsEl,
      this.panels.el,
      this.toast,
    );
    host.append(this.root);
    if (typeof ResizeObserver !== "undefined") {
      this.resizeObs = new ResizeObserver(() => {
        const w = this.panels.el.clientWidth;
        if (w && Math.abs(w - this.lastWidth) > 4) {
          this.lastWidth = w;
          this.panels.resize();
        }
      });
      this.resizeObs.observe(this.root);
    }
    // canvas charts take their colors when drawn: draw again when the host's theme changes
    this.unwatchTheme = watchTheme(this.root, () => {
      this.chartsDirty = true;
      this.schedule();
    });
    this.panels.showTab(this.state.tab);
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

  /** A message from the kernel, which arrived at `at` (`performance.now()`; earlier: replayed). */
  handleMessage(msg: Message, at = performance.now()): void {
    this.dispatch(msg, at);
  }

  /** Expand the tree to `depth` (root = 0); the memory chart shows modules at that depth. */
  setDepth(depth: number): void {
    this.update({ type: "preferDepth", depth, tree: this.tree });
  }

  /** Select a module by row index (from the chart, the banner): opens what hides it. */
  selectModule(module: number, notify = true): void {
    if (!this.tree) return;
    this.update({ type: "reveal", module, tree: this.tree });
    const i = this.rowOfKey.get(this.state.selectedKey ?? "") ?? -1;
    this.view.setRows(this.rows, i);
    this.view.scrollTo(i);
    const node = this.rows[i]?.node;
    if (node) this.afterSelect(node, notify);
  }

  /** Select (folded) the group of repeated siblings that holds `module` or an ancestor of it. */
  selectGroupOf(module: number): void {
    const group = this.tree ? groupOf(this.tree, module) : null;
    if (!group) return;
    this.update({ type: "toggle", key: group.key, open: false });
    this.update({ type: "select", key: group.key });
    this.computeRows();
    const i = this.rowOfKey.get(group.key) ?? -1;
    this.view.setRows(this.rows, i);
    this.view.scrollTo(i);
    this.afterSelect(group, true);
  }

  /** Bars' screen positions, for browser tests that click a real bar. */
  barCenters(): { module: number; x: number; y: number }[] {
    return this.panels.barCenters();
  }

  destroy(): void {
    this.switches.destroy();
    this.toolbar.destroy();
    this.progress.destroy();
    cancelAnimationFrame(this.frame);
    this.resizeObs?.disconnect();
    this.unwatchTheme();
    this.view.destroy();
    this.panels.destroy();
    this.root.remove();
  }

  // -------------------------------------------------------------------------------------------
  // State changes
  // -------------------------------------------------------------------------------------------

  /** Move the session on by one event, then do what the view must: timers, a new tree, a redraw. */
  private dispatch(event: SessionEvent, at = performance.now()): void {
    const prev = this.session;
    this.session = reduce(prev, event, at);
    const a = this.session.analysis;
    if (a !== prev.analysis) this.showAnalysis(prev.analysis, a);
    else if (event.type === "payload" && a) this.showAnalysis(a, a);
    // the clock runs from the first state the kernel says it waits in until the analysis ends
    if (event.type === "start" || (event.type === "waiting" && !prev.wait)) this.progress.start();
    if (event.type === "rerun") this.progress.watchRerun();
    if (a?.status !== "running" && !this.session.wait) this.progress.stop();
    if (event.type !== "phase" && event.type !== "rerun") this.chartsDirty = true;
    this.schedule(event.type === "payload" || event.type === "start");
  }

  /** A new analysis object: rebuild the tree; a new model resets depth and selection. */
  private showAnalysis(prev: Analysis | null, a: Analysis | null): void {
    this.tree = a ? buildTree(a) : null;
    this.recordedBpe = a ? recordedFloatBytes(a) : 4;
    this.scaleCache = null;
    this.ckpt = a ? checkpointProblems(a) : new Map();
    if (a && !this.session.rerunning && (a.mode === "inference" || a.mode === "training")) {
      this.switches.showAnalyzed(a); // the switches show what was analyzed
    }
    if (!sameModel(prev, a)) this.update({ type: "model", tree: this.tree });
  }

  /** Move the view state on by one action, then redraw what it changed. */
  private update(action: ViewAction): void {
    const prev = this.state;
    const next = reduceView(prev, action);
    if (next === prev) return;
    this.state = next;
    if (next.dtype !== prev.dtype) this.scaleCache = null;
    if (next.tab !== prev.tab) this.panels.showTab(next.tab);
    if (next.dtype !== prev.dtype || next.tab !== prev.tab || next.depth !== prev.depth || next.leaveOut !== prev.leaveOut) {
      this.chartsDirty = true;
    }
    this.schedule(next.expanded !== prev.expanded || next.filter !== prev.filter);
  }

  private toggleRow(i: number, open: boolean | undefined, deep: boolean): void {
    const row = this.rows[i];
    if (!row || !row.hasChildren) return;
    if (deep) this.update({ type: "openBelow", node: row.node });
    else this.update({ type: "toggle", key: row.node.key, open: open ?? !row.expanded });
  }

  private selectRow(i: number): void {
    const row = this.rows[i];
    if (!row) return;
    this.update({ type: "select", key: row.node.key });
    this.view.setSelected(i);
    this.afterSelect(row.node, true);
  }

  private afterSelect(node: TreeNode, notify: boolean): void {
    const module = moduleOf(node);
    this.panels.selectBar(module);
    this.panels.renderDetails(this.panelContext());
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
    const a = this.analysis;
    this.aggs = a ? aggregate(a) : [];
    this.scaleCache = null;
    this.reached = reachedModules(a, this.aggs);
    this.computeRows();
    const s = this.state;
    const sel = s.selectedKey ? (this.rowOfKey.get(s.selectedKey) ?? -1) : -1;
    this.view.setSort(s.sort.column, s.sort.descending);
    this.view.setTraining(this.aggs.some((g) => g.backwardFlops > 0));
    this.view.setTime(a?.time !== undefined);
    this.view.setRows(this.rows, sel);
    this.toolbar.render(s, treeDepth(this.tree), matchCount(a, s.filter));
    this.renderHeader();
    this.panels.showAvailable(a);
    this.switches.render(this.session);
    renderBanner(this.banner, a, (module) => this.selectModule(module));
    renderCheckpoint(this.checkpointEl, a?.checkpoint ?? null, this.ckpt.size > 0);
    this.progress.render();
    this.emptyEl.textContent = emptyText(a, this.rows.length, s.filter, Boolean(this.session.wait));
    this.emptyEl.style.display = this.emptyEl.textContent ? "" : "none";
    const ctx = this.panelContext();
    this.panels.renderDetails(ctx);
    if (this.chartsDirty && s.tab !== "details" && ctx) {
      this.chartsDirty = false;
      this.panels.renderCharts(ctx);
    }
  }

  private paramBytes = (m: ModuleInfo): number => paramBytesAt(m, this.state.dtype, this.recordedBpe);

  /** The precision the switch shows (null: as recorded): the kernel's what-if numbers. */
  private precision(): Precision | null {
    return precisionOf(this.analysis, this.state.dtype);
  }

  /** Output mem at the switch's precision (activations follow bf16/fp16, not int8/int4). */
  private outputBytes = (bytes: number): number => Math.round(bytes * (this.precision()?.actScale ?? 1));

  private computeRows(): void {
    this.rowOfKey.clear();
    if (!this.tree) {
      this.rows = [];
      return;
    }
    const a = this.tree.analysis;
    if (this.aggs.length !== a.modules.length) {
      this.aggs = aggregate(a);
      this.scaleCache = null;
    }
    const aggs = this.aggs;
    // while streaming, every module is a row from the start (the module table came with
    // `start`): its name, type and parameters shown, its other cells pending until its calls come
    this.rows = flatten(this.tree, {
      expanded: this.state.expanded,
      filter: this.state.filter,
      sort: this.state.sort,
      aggs,
      paramBytes: this.paramBytes,
    });
    this.rows.forEach((r, i) => this.rowOfKey.set(r.node.key, i));
  }

  private describe(row: Row) {
    this.scaleCache ??= computeScales(this.analysis, this.aggs, this.paramBytes);
    return describeRow(
      {
        tree: this.tree as Tree,
        aggs: this.aggs,
        reached: this.reached,
        scales: this.scaleCache,
        dtype: this.state.dtype,
        paramBytes: this.paramBytes,
        outputBytes: this.outputBytes,
        checkpoint: this.ckpt,
      },
      row,
    );
  }

  private selectedNode(): TreeNode | null {
    const i = this.state.selectedKey === null ? undefined : this.rowOfKey.get(this.state.selectedKey);
    return i === undefined ? null : (this.rows[i]?.node ?? null);
  }

  private panelContext(): PanelContext | null {
    if (!this.tree) return null;
    return {
      state: this.state,
      tree: this.tree,
      aggs: this.aggs,
      selected: this.selectedNode(),
      precision: this.precision(),
      paramBytes: this.paramBytes,
      outputBytes: this.outputBytes,
    };
  }

  private renderHeader(): void {
    const a = this.analysis;
    const root = a?.modules[0];
    const p = this.precision();
    const dtype = this.state.dtype;
    // a parallel trace's rank holds its shard: the header says that rank's bytes, as summary()
    const own = a?.totals.param_bytes ?? 0;
    const sharded = dtype === "recorded" && root !== undefined && own > 0 && own < root.paramBytes;
    this.header.render(a, this.aggs[0], {
      label: dtype === "recorded" ? (sharded ? "param memory (this GPU)" : "param memory") : `param memory (${dtype})`,
      bytes: sharded ? own : root ? this.paramBytes(root) : own,
      peak: p
        ? {
            label: `peak (${p.choice}, estimate)`,
            bytes: p.total,
            note: p.note,
            gradients: Math.round((a?.memory.gradientBytes ?? 0) * p.actScale),
            optimizerState: p.categories["optimizer state"] ?? 0,
          }
        : undefined,
    });
  }

  private showToast(text: string): void {
    this.toast.textContent = text;
    this.toast.classList.add("mw-show");
    setTimeout(() => this.toast.classList.remove("mw-show"), 1600);
  }
}

/**
 * Keys pressed inside the widget stay inside it: JupyterLab and Notebook 7 listen for keydown
 * on the document as it bubbles, so `a`, `b`, `m`, `dd`… with focus in the tree would insert,
 * change or delete cells. Combinations with Ctrl/Meta/Alt (save, undo) and Shift+Enter (run the
 * cell) still reach the host.
 */
export function keepKeys(e: KeyboardEvent): void {
  if (e.ctrlKey || e.metaKey || e.altKey || (e.shiftKey && e.key === "Enter")) return;
  e.stopPropagation();
}

/** How many modules `filter` matches (each member of a folded group counts); null: no filter. */
export function matchCount(a: Analysis | null, filter: string): number | null {
  const match = a && filter.trim() ? moduleMatcher(filter) : null;
  return match && a ? a.modules.filter(match).length : null;
}

/** The innermost folded group whose members hold `module` (itself or an ancestor), or null. */
export function groupOf(tree: Tree, module: number): TreeNode | null {
  const mods = tree.analysis.modules;
  for (let m = module; m >= 0; m = mods[m]?.parent ?? -1) {
    const parent = mods[m]?.parent ?? -1;
    const siblings = parent >= 0 ? (tree.nodes[parent]?.children ?? []) : [];
    const group = siblings.find((c) => c.kind === "group" && c.members.includes(m));
    if (group) return group;
  }
  return null;
}
