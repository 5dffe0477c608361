/**
 * The Graph tab: the model's data flow laid out in layers (graphlayout.ts), drawn as SVG.
 *
 * What is drawn stays small whatever the model: repeated siblings fold as in the tree, and a
 * module with thousands of children drawn shows its first ones and a "… N more" node
 * (graphcap.ts). The layout runs in a task of its own after the tab shows.
 *
 * Nodes are shaded by FLOPs or memory (a switch), the peak's module is marked, a folded group
 * opens and closes in place (its "+" / "−"), edges show their tensor on hover (and, in a
 * training step, the gradient the backward pass hands back, a toggle). Depth up and down, zoom
 * (wheel) and pan (drag), fit, SVG and PNG export. Colours come from the widget's theme
 * variables, so the host's theme (light, dark) is the graph's. Clicking a node selects its
 * module (`onSelect`); `select(row)` marks the node showing a module selected elsewhere.
 */
import { h } from "./details";
import { formatBytes, formatCount, formatFlops, formatShape } from "./format";
import { foldGraph, graphDepths, levelFor, nodeOfRow, shade, type GEdge, type GNode, type GraphModel, type Metric } from "./graph";
import { capSiblings, showMore } from "./graphcap";
import { clip, moreLine, nodeWidth, shortLabels, typeLine } from "./graphlabels";
import { layoutGraph, type Box } from "./graphlayout";
import type { Aggregate, Tree } from "./tree";

const SVG = "http://www.w3.org/2000/svg";
const NODE_H = 40;
/** The smallest scale Fit shrinks a tall graph to (its labels still read). */
const MIN_FIT = 0.75;
/** Each view's own marker ids: `url(#id)` finds the document's first, maybe in a hidden view. */
let views = 0;

export interface GraphHandlers {
  /** A node was clicked: select module row `row` (its first member's). */
  onSelect(row: number): void;
}

function svg<K extends keyof SVGElementTagNameMap>(tag: K, attrs: Record<string, string | number> = {}): SVGElementTagNameMap[K] {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

/** What one layout took, for the benchmark (`window.__mwGraphTimes` when defined). */
export interface GraphTiming {
  nodes: number;
  edges: number;
  layoutMs: number;
  drawMs: number;
}

export class GraphView {
  readonly el = h("div", "mw-graph");
  private bar = h("div", "mw-graph-bar");
  private depthLabel = h("span", "mw-graph-depth");
  private metricSel = h("select", "mw-graph-metric");
  private backBox = h("input", "mw-graph-backward");
  private backLabel = h("label", "mw-label mw-graph-backward-label");
  private note = h("div", "mw-muted mw-chart-note");
  private svgEl = svg("svg", { class: "mw-graph-svg", role: "img" });
  private root = svg("g", { class: "mw-graph-root" });
  private tree: Tree | null = null;
  private aggs: readonly Aggregate[] = [];
  private depth = 0;
  private open = new Set<string>();
  /** How many children each module path shows before its "… N more" node (graphcap.ts). */
  private shown = new Map<string, number>();
  /** The name each node shows in its box (`shortLabels`), by node key. */
  private labels = new Map<string, string>();
  private metric: Metric = "flops";
  private backward = false;
  private model: GraphModel | null = null;
  private selectedRow = -1;
  private nodeEls = new Map<string, SVGGElement>();
  private view = { x: 0, y: 0, k: 1 };
  /** The user zoomed or dragged since the last fit: a resize keeps their view. */
  private moved = false;
  private size = { w: 1, h: 1 };
  private uid = `mw-g${++views}`;
  private timer: ReturnType<typeof setTimeout> | null = null;
  timing: GraphTiming | null = null;
  /** Resolves when the layout `render` asked for is drawn. */
  ready: Promise<void> = Promise.resolve();

  constructor(private handlers: GraphHandlers) {
    const button = (label: string, title: string, on: () => void): HTMLButtonElement => {
      const b = h("button", "mw-graph-btn", label);
      b.type = "button";
      b.title = title;
      b.addEventListener("click", on);
      return b;
    };
    for (const [v, label] of [["flops", "FLOPs"], ["memory", "Memory"]] as const) {
      const o = h("option", "", label);
      o.value = v;
      this.metricSel.append(o);
    }
    this.metricSel.title = "Shade the nodes by their FLOPs or by their memory (parameters + output mem)";
    this.metricSel.addEventListener("change", () => {
      this.metric = this.metricSel.value as Metric;
      this.draw(false);
    });
    this.backBox.type = "checkbox";
    this.backBox.addEventListener("change", () => {
      this.backward = this.backBox.checked;
      this.draw(false);
    });
    this.backLabel.append(this.backBox, document.createTextNode(" Backward (gradient bytes)"));
    this.bar.append(
      button("−", "Depth up: fewer, larger modules", () => this.step(-1)),
      this.depthLabel,
      button("+", "Depth down: the modules inside", () => this.step(1)),
      this.metricSel,
      this.backLabel,
      button("Fold all", "Close every group opened in place", () => {
        this.open.clear();
        this.shown.clear();
        this.draw(true);
      }),
      button("Fit", "Fit the graph in view", () => this.fit()),
      button("SVG", "Download the graph as SVG", () => this.download("svg")),
      button("PNG", "Download the graph as PNG", () => this.download("png")),
    );
    this.svgEl.append(this.root);
    const hint = h("div", "mw-graph-zoomhint", "Ctrl (⌘) + wheel to zoom, or click the graph first");
    const stage = h("div", "mw-graph-stage");
    stage.append(this.svgEl, hint);
    this.el.append(this.bar, this.note, stage);
    this.enableZoom();
  }

  /** Show `tree`'s graph at `depth` (the tree's depth menu when first shown). */
  render(tree: Tree, aggs: readonly Aggregate[], depth: number, width: number): void {
    const fresh = tree !== this.tree;
    if (fresh && tree.analysis !== this.tree?.analysis) {
      this.open.clear();
      this.shown.clear();
      this.depth = depth;
    }
    this.tree = tree;
    this.aggs = aggs;
    const resized = this.setSize(width);
    if (fresh || !this.model || this.timer !== null) this.drawSoon();
    else {
      this.draw(false);
      if (resized && !this.moved) this.fit();
    }
  }

  /**
   * The tab's box is `width` wide (a narrower page, Lab's file browser opened): the view the
   * user has not moved is fit to it again; one they zoomed or dragged is kept.
   */
  resize(width: number): void {
    if (this.setSize(width) && this.model && !this.moved) this.fit();
  }

  /** The view's size for a tab `width` wide; whether it changed. */
  private setSize(width: number): boolean {
    const size = { w: Math.max(320, width), h: Math.max(360, Math.min(720, Math.round(width * 0.6))) };
    const changed = size.w !== this.size.w || size.h !== this.size.h;
    this.size = size;
    this.svgEl.setAttribute("width", String(size.w));
    this.svgEl.setAttribute("height", String(size.h));
    return changed;
  }

  /**
   * Lay out in a task of its own, after the frame that asked (the widget's whole render, the
   * tab switch) has painted: the two never add up to one long task. One pending layout at a
   * time; it draws the latest state. `ready` resolves once it has.
   */
  private drawSoon(): void {
    if (this.timer !== null) return;
    this.note.textContent = "Laying out the graph…";
    this.ready = new Promise((done) => {
      this.timer = setTimeout(() => {
        this.timer = null;
        try {
          this.draw(true);
        } finally {
          done();
        }
      }, 0);
    });
  }

  /** Mark the node showing module row `row` (selected in the tree or a chart). */
  select(row: number): void {
    this.selectedRow = row;
    this.markSelected();
  }

  /** The drawn nodes' keys and centres in page pixels (tests click them). */
  nodeCenters(): { key: string; rows: number[]; x: number; y: number }[] {
    const out = [];
    for (const n of this.model?.nodes ?? []) {
      const r = this.nodeEls.get(n.key)?.getBoundingClientRect();
      if (r) out.push({ key: n.key, rows: n.rows, x: r.left + r.width / 2, y: r.top + r.height / 2 });
    }
    return out;
  }

  private step(delta: number): void {
    const a = this.tree?.analysis;
    if (!a) return;
    const depths = graphDepths(a);
    const level = levelFor(a, this.depth);
    let i = depths.indexOf(level?.depth ?? 1);
    // skip levels drawing the same nodes (a ModuleList is never called: its depth is its parent's)
    for (i += delta; i >= 0 && i < depths.length; i += delta) {
      const next = levelFor(a, depths[i] as number);
      if (next && next.nodes !== level?.nodes) {
        this.depth = next.depth;
        this.draw(true);
        return;
      }
    }
  }

  private draw(relayout: boolean): void {
    const tree = this.tree;
    if (!tree) return;
    const a = tree.analysis;
    const level = levelFor(a, this.depth);
    const depths = graphDepths(a);
    this.backLabel.style.display = a.mode === "training" ? "" : "none";
    if (!level) {
      this.model = null;
      this.root.replaceChildren();
      this.depthLabel.textContent = "";
      this.note.textContent = a.status === "done" || a.status === "error" ? "No graph: the model was not traced (a structural analysis), or it is an older payload." : "The graph appears when the trace is done.";
      return;
    }
    this.depthLabel.textContent = `depth ${level.depth}`;
    this.depthLabel.title = `Graph depths in this payload: ${depths.join(", ")}`;
    if (relayout || !this.model) {
      const t0 = performance.now();
      this.model = capSiblings(foldGraph(tree, level, this.open, this.aggs), this.shown);
      this.layoutAndDraw(t0);
      this.fit();
    } else {
      this.restyle();
    }
    const folded = this.model.nodes.filter((n) => n.repeats > 1 && n.more === null).length;
    const hidden = this.model.nodes.reduce((s, n) => s + (n.more === null ? 0 : n.rows.length), 0);
    this.note.textContent = `Modules at depth ${level.depth} (and shallower leaves) and the tensors between them: an edge runs from the module call that made a tensor to each one that read it, through the ops listed on it (a cat, a mask). The residual stream is the thick line through the residual adds (“<residual>” nodes: the stream plus a branch's output); each attention is a node (“<attention>”: q, k and v in); the KV cache the model returns is the node “cache”. ${folded ? `${folded} folded node${folded > 1 ? "s stand" : " stands"} for repeated layers (“+” opens one in place). ` : ""}${hidden ? `${formatCount(hidden)} module${hidden > 1 ? "s" : ""} not drawn stand in “… more” nodes (click one to draw more). ` : ""}Shaded by ${this.metric === "flops" ? "FLOPs" : "memory (parameters + output mem)"}; ▲ marks the peak's module. Hover an edge for its tensor; click a node to select it; drag to pan. ${ZOOM_HINT}`;
  }

  private layoutAndDraw(t0: number): void {
    const m = this.model as GraphModel;
    this.labels = shortLabels(m.nodes);
    const lay = layoutGraph(new Map(m.nodes.map((n) => [n.key, nodeWidth(n, this.shownLabel(n))])), m.edges, NODE_H, this.size.w / this.size.h);
    const t1 = performance.now();
    this.root.replaceChildren();
    this.nodeEls.clear();
    const edgeLayer = svg("g", { class: "mw-graph-edges" });
    const nodeLayer = svg("g", { class: "mw-graph-nodes" });
    this.root.append(edgeLayer, nodeLayer);
    const names = new Map(m.nodes.map((n) => [n.key, n.label]));
    m.edges.forEach((e, i) => {
      if (e.src !== e.dst) edgeLayer.append(this.edgeEl(e, lay.points[i] ?? [], names));
    });
    for (const n of m.nodes) {
      const p = lay.boxes.get(n.key) as Box;
      nodeLayer.append(n.more === null ? this.nodeEl(n, m.edges.filter((e) => e.src === n.key && e.dst === n.key), p) : this.moreEl(n, p));
    }
    this.root.dataset.width = String(lay.width);
    this.root.dataset.height = String(lay.height);
    this.restyle();
    const t2 = performance.now();
    this.timing = { nodes: m.nodes.length, edges: m.edges.length, layoutMs: t1 - t0, drawMs: t2 - t1 };
    this.el.dataset.layoutMs = (t1 - t0).toFixed(1); // read by benchmarks/widget.py
  }

  /** A "… N more" node: clicking it shows twice as many of its module's children. */
  private moreEl(n: GNode, p: Box): SVGGElement {
    const grp = svg("g", { class: `mw-graph-node mw-graph-more${n.peak ? " mw-peak" : ""}`, transform: `translate(${(p.x - p.width / 2).toFixed(1)},${(p.y - p.height / 2).toFixed(1)})` });
    grp.dataset.key = n.key;
    grp.dataset.label = n.label;
    grp.dataset.row = "-1";
    grp.dataset.hidden = String(n.rows.length);
    const title = svg("title");
    title.textContent = `${n.label} (${n.type}): ${formatCount(n.rows.length)} module${n.rows.length === 1 ? "" : "s"} not drawn · ${formatFlops(n.flops)} · ${formatBytes(n.memory)}\nClick to draw more of them`;
    const rect = svg("rect", { width: p.width, height: p.height, rx: 4, class: "mw-graph-box" });
    const name = svg("text", { x: 8, y: 16, class: "mw-graph-name" });
    name.textContent = clip(this.shownLabel(n), p.width);
    const type = svg("text", { x: 8, y: 31, class: "mw-graph-type" });
    type.textContent = clip(moreLine(n), p.width - (n.peak ? 14 : 0));
    grp.append(title, rect, name, type);
    if (n.peak) {
      const mark = svg("text", { x: p.width - 14, y: 31, class: "mw-graph-peak" });
      mark.textContent = "▲";
      grp.append(mark);
    }
    grp.addEventListener("click", () => {
      if (n.more === null) return;
      showMore(this.shown, n.more);
      this.draw(true);
    });
    this.nodeEls.set(n.key, grp);
    return grp;
  }

  private edgeEl(e: GEdge, pts: { x: number; y: number }[], names: ReadonlyMap<string, string>): SVGGElement {
    const grp = svg("g", { class: `mw-graph-edge${e.tied ? " mw-tied" : ""}${EDGE_CLASS[e.kind] ?? ""}` });
    grp.dataset.kind = e.kind;
    const d = pts.map((p, i) => `${i ? "L" : "M"}${p.x.toFixed(1)},${p.y.toFixed(1)}`).join(" ");
    // the tree's names (a folded group's "layers.0–3"), never the fold's internal keys
    const src = names.get(e.src) ?? e.src;
    const dst = names.get(e.dst) ?? e.dst;
    const what = e.kind === "cache" ? "KV cache entries returned by the model: " : e.kind === "residual" ? "the residual stream: " : "";
    const text = e.tied
      ? `${src} → ${dst}: tied weight ${formatShape(e.shape)} ${e.dtype} (${formatBytes(e.bytes)})`
      : `${src} → ${dst}: ${what}${formatShape(e.shape)} ${e.dtype} · ${formatBytes(e.bytes)}${e.count > 1 ? ` · ${e.count} tensors` : ""}${e.ops.length ? ` · via ${e.ops.join(", ")}` : ""}`;
    const title = svg("title");
    title.textContent = text + (e.gradBytes ? `\nbackward: ${formatBytes(e.gradBytes)} of gradient back to ${src}` : "");
    grp.append(title, svg("path", { d, class: "mw-graph-hit" }), svg("path", { d, class: "mw-graph-line", "marker-end": `url(#${this.uid}-${e.kind === "residual" ? "spine" : "arrow"})` }));
    if (e.gradBytes) {
      const back = pts.slice().reverse().map((p, i) => `${i ? "L" : "M"}${(p.x + 4).toFixed(1)},${p.y.toFixed(1)}`).join(" ");
      grp.append(svg("path", { d: back, class: "mw-graph-grad", "marker-end": `url(#${this.uid}-grad)` }));
    }
    const mid = pts[Math.floor(pts.length / 2)];
    if (mid) {
      const label = svg("text", { x: mid.x + 6, y: mid.y, class: "mw-graph-elabel" });
      label.textContent = e.tied ? "tied" : `${e.kind === "cache" ? "KV cache " : ""}${formatShape(e.shape)}${e.ops.length ? ` ${e.ops.slice(0, 2).join(",")}` : ""}`;
      grp.append(label);
      if (e.gradBytes) {
        const gl = svg("text", { x: mid.x + 6, y: mid.y + 12, class: "mw-graph-glabel" });
        gl.textContent = `∇ ${formatBytes(e.gradBytes)}`;
        grp.append(gl);
      }
    }
    return grp;
  }

  private nodeEl(n: GNode, loops: GEdge[], p: Box): SVGGElement {
    const x = p.x - p.width / 2;
    const y = p.y - p.height / 2;
    const io = n.rows[0] !== undefined && n.rows[0] < 0;
    const op = n.kind === "attention" || n.kind === "residual";
    const grp = svg("g", { class: `mw-graph-node${io ? " mw-io" : ""}${op ? ` mw-op mw-${n.kind}` : ""}${n.kind === "cache" ? " mw-cache" : ""}${n.peak ? " mw-peak" : ""}`, transform: `translate(${x.toFixed(1)},${y.toFixed(1)})` });
    grp.dataset.key = n.key;
    grp.dataset.label = n.label;
    grp.dataset.kind = n.kind;
    grp.dataset.row = String(n.rows[0] ?? -1);
    const title = svg("title");
    title.textContent = op
      ? `${n.label} · ${typeLine(n)}\n${OP_TIPS[n.kind] ?? ""}${n.flops ? `\n${formatFlops(n.flops)}` : ""}\nClick to select the module that runs it`
      : n.kind === "cache"
        ? `${n.label}: the KV cache the model returns (each layer's keys and values, kept for the next tokens)`
        : `${n.label} · ${n.type}${n.repeats > 1 ? ` × ${n.repeats}` : ""}\n${formatCount(n.calls)} call${n.calls === 1 ? "" : "s"} · ${formatFlops(n.flops)} · ${formatBytes(n.memory)} (parameters + output mem)${loops.length ? `\nreads its own output (${loops.map((l) => l.ops.join(", ") || "directly").join("; ")})` : ""}`;
    const rect = svg("rect", { width: p.width, height: p.height, rx: io || n.kind === "residual" ? 20 : op ? 10 : 4, class: "mw-graph-box" });
    const name = svg("text", { x: 8, y: 16, class: "mw-graph-name" });
    name.textContent = clip(this.shownLabel(n), p.width);
    const type = svg("text", { x: 8, y: 31, class: "mw-graph-type" });
    type.textContent = clip(typeLine(n), p.width);
    grp.append(title, rect, name, type);
    if (n.peak) {
      const mark = svg("text", { x: p.width - 14, y: 31, class: "mw-graph-peak" });
      mark.textContent = "▲";
      grp.append(mark);
    }
    const toggle = n.group ?? n.openGroup;
    if (toggle) {
      const t = svg("text", { x: p.width - 14, y: 16, class: "mw-graph-toggle" });
      t.textContent = n.group ? "+" : "−";
      const tt = svg("title");
      tt.textContent = n.group ? "Open this group in place (one node per member)" : "Fold this group again";
      t.append(tt);
      t.addEventListener("click", (ev) => {
        ev.stopPropagation();
        if (n.group) this.open.add(n.group);
        else if (n.openGroup) this.open.delete(n.openGroup);
        this.draw(true);
      });
      grp.append(t);
    }
    grp.addEventListener("click", () => {
      const row = n.rows[0];
      if (row !== undefined && row >= 0) {
        this.selectedRow = row;
        this.markSelected();
        this.handlers.onSelect(row);
      }
    });
    this.nodeEls.set(n.key, grp);
    return grp;
  }

  /** Shade the nodes by the metric, show or hide gradients, mark the selection. */
  private restyle(): void {
    const m = this.model;
    if (!m) return;
    const values = m.nodes.map((n) => (this.metric === "flops" ? n.flops : n.memory));
    m.nodes.forEach((n, i) => {
      const box = this.nodeEls.get(n.key)?.querySelector("rect");
      const s = shade(values[i] ?? 0, values);
      box?.style.setProperty("fill-opacity", (0.08 + 0.72 * s).toFixed(2));
      box?.classList.toggle("mw-flops", this.metric === "flops");
    });
    this.svgEl.classList.toggle("mw-show-grad", this.backward);
    this.markSelected();
  }

  private markSelected(): void {
    const m = this.model;
    const a = this.tree?.analysis;
    const node = m && a && this.selectedRow >= 0 ? nodeOfRow(m, a, this.selectedRow) : null;
    for (const [key, el] of this.nodeEls) el.classList.toggle("mw-selected", node !== null && key === node.key);
  }

  private shownLabel(n: GNode): string {
    return this.labels.get(n.key) ?? n.label;
  }

  private fit(): void {
    const w = Number(this.root.dataset.width ?? 0) || 1;
    const hh = Number(this.root.dataset.height ?? 0) || 1;
    // a long graph starts readable at its top (drag or wheel for the rest), not shrunk to dust
    const k = Math.max(Math.min(MIN_FIT, this.size.w / w), Math.min(1.5, this.size.w / w, this.size.h / hh));
    this.view = { k, x: (this.size.w - w * k) / 2, y: Math.max(0, (this.size.h - hh * k) / 2) };
    this.moved = false;
    this.applyView();
  }

  private applyView(): void {
    const { x, y, k } = this.view;
    this.root.setAttribute("transform", `translate(${x.toFixed(1)},${y.toFixed(1)}) scale(${k.toFixed(4)})`);
  }

  /** Whether a click has engaged the graph: the wheel zooms it without a modifier key. */
  private engaged = false;
  private hintTimer: ReturnType<typeof setTimeout> | null = null;

  private engage(on: boolean): void {
    this.engaged = on;
    this.el.classList.toggle("mw-graph-engaged", on);
    if (on) this.el.classList.remove("mw-graph-hinting");
  }

  private enableZoom(): void {
    const defs = svg("defs");
    // (a marker scales with its line's width: the spine's, 3.5 px wide, is drawn smaller)
    for (const [id, cls, size] of [["arrow", "mw-graph-arrow", 7], ["grad", "mw-graph-arrow-grad", 7], ["spine", "mw-graph-arrow-spine", 3]] as const) {
      const marker = svg("marker", { id: `${this.uid}-${id}`, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: size, markerHeight: size, orient: "auto-start-reverse" });
      marker.append(svg("path", { d: "M0,0 L10,5 L0,10 z", class: cls }));
      defs.append(marker);
    }
    this.svgEl.append(defs);
    // the wheel scrolls the page unless the user zooms on purpose, as map widgets do: with
    // Ctrl or ⌘ held, or once a click has engaged the graph (until the pointer leaves it)
    this.svgEl.addEventListener("pointerdown", () => this.engage(true));
    this.svgEl.addEventListener("pointerleave", () => this.engage(false));
    this.svgEl.addEventListener("wheel", (ev) => {
      if (!this.engaged && !ev.ctrlKey && !ev.metaKey) {
        this.el.classList.add("mw-graph-hinting");
        if (this.hintTimer !== null) clearTimeout(this.hintTimer);
        this.hintTimer = setTimeout(() => this.el.classList.remove("mw-graph-hinting"), 1500);
        return; // the page scrolls
      }
      ev.preventDefault();
      const r = this.svgEl.getBoundingClientRect();
      const px = ev.clientX - r.left;
      const py = ev.clientY - r.top;
      const f = Math.exp(-ev.deltaY * 0.0015);
      const k = Math.max(0.05, Math.min(8, this.view.k * f));
      this.view = { k, x: px - ((px - this.view.x) * k) / this.view.k, y: py - ((py - this.view.y) * k) / this.view.k };
      this.moved = true;
      this.applyView();
    }, { passive: false });
    let drag: { x: number; y: number; vx: number; vy: number } | null = null;
    this.svgEl.addEventListener("pointerdown", (ev) => {
      if ((ev.target as Element).closest(".mw-graph-node")) return;
      drag = { x: ev.clientX, y: ev.clientY, vx: this.view.x, vy: this.view.y };
      this.svgEl.setPointerCapture?.(ev.pointerId);
    });
    this.svgEl.addEventListener("pointermove", (ev) => {
      if (!drag) return;
      this.view = { ...this.view, x: drag.vx + ev.clientX - drag.x, y: drag.vy + ev.clientY - drag.y };
      this.moved = true;
      this.applyView();
    });
    const end = (): void => {
      drag = null;
    };
    this.svgEl.addEventListener("pointerup", end);
    this.svgEl.addEventListener("pointercancel", end);
  }

  /** The graph as a standalone SVG: the theme's colours resolved into it. */
  svgText(): string {
    const clone = this.svgEl.cloneNode(true) as SVGSVGElement;
    clone.setAttribute("xmlns", SVG);
    const live = this.svgEl.querySelectorAll("*");
    clone.querySelectorAll("*").forEach((el, i) => {
      const src = live[i];
      if (!src || !(el instanceof SVGElement)) return;
      const cs = getComputedStyle(src);
      for (const prop of ["fill", "fill-opacity", "stroke", "stroke-width", "stroke-dasharray", "font-size", "font-family", "font-weight", "display", "opacity"]) {
        el.style.setProperty(prop, cs.getPropertyValue(prop));
      }
    });
    const bg = getComputedStyle(this.el).getPropertyValue("--mw-bg") || "#fff";
    clone.style.background = bg;
    return new XMLSerializer().serializeToString(clone);
  }

  private download(kind: "svg" | "png"): void {
    const name = `${this.tree?.analysis.title ?? "model"}-graph`;
    const blob = new Blob([this.svgText()], { type: "image/svg+xml" });
    const url = URL.createObjectURL(blob);
    const save = (href: string, file: string): void => {
      const link = document.createElement("a");
      link.href = href;
      link.download = file;
      link.click();
    };
    if (kind === "svg") {
      save(url, `${name}.svg`);
      setTimeout(() => URL.revokeObjectURL(url), 1000);
      return;
    }
    const img = new Image();
    img.onload = () => {
      const c = document.createElement("canvas");
      c.width = this.size.w * 2;
      c.height = this.size.h * 2;
      const ctx = c.getContext("2d");
      if (!ctx) return;
      ctx.scale(2, 2);
      ctx.drawImage(img, 0, 0);
      URL.revokeObjectURL(url);
      save(c.toDataURL("image/png"), `${name}.png`);
    };
    img.src = url;
  }
}

/** How to zoom: the wheel scrolls the page until the graph is clicked (or with Ctrl / ⌘). */
export const ZOOM_HINT = "To zoom: Ctrl (⌘) + wheel, or click the graph first, then wheel; the wheel scrolls the page otherwise.";

/** The classes of the edges that are no plain tensor. */
const EDGE_CLASS: Record<string, string> = { residual: " mw-residual", cache: " mw-cache" };

/** What an op node is, in its tooltip. */
const OP_TIPS: Record<string, string> = {
  attention: "Attention: q·kᵀ, softmax, times v (the products and softmax the module's body runs); q, k and v come in, its output goes on.",
  residual: "Residual add: the residual stream (the thick line) plus the output of the branch it feeds; the stream runs on from here.",
};
