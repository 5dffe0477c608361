/**
 * The tree *view*: a virtualized table. Only the rows in the viewport (plus a few) are in the
 * DOM; row elements are pooled and refilled on scroll, so 25,000+ modules scroll smoothly.
 *
 * The view knows nothing about payloads: the app hands it the flattened rows and a `describe`
 * function that returns the text of a row's cells. Every string goes through `textContent`.
 */
import { visibleWindow, type Row, type SortColumn } from "./tree";

export const ROW_HEIGHT = 26;
/** Rows rendered beyond each edge of the viewport. */
const OVERSCAN = 4;

export interface Cell {
  text: string;
  /** Full value for the tooltip. */
  title?: string;
  /** 0..1: width of the inline proportional bar. */
  fraction?: number;
}

export interface RowCells {
  name: string;
  type: string;
  /** Shown as "×3" when a module ran more than once. */
  calls: number;
  error: boolean;
  /** Its numbers rest on an assumption the trace made. */
  assumed: boolean;
  /** Not called yet (while streaming) or never called. */
  dim: boolean;
  /** Checkpoint problems of its parameters (missing, mis-shaped): the marker's tooltip; "" none. */
  checkpoint?: string;
  group: boolean;
  inputs: Cell;
  outputs: Cell;
  params: Cell;
  paramBytes: Cell;
  activationBytes: Cell;
  flops: Cell;
}

export interface TreeViewHandlers {
  describe(row: Row, index: number): RowCells;
  onSelect(index: number): void;
  /** `open`: undefined toggles. */
  onToggle(index: number, open?: boolean): void;
  onSort(column: SortColumn): void;
}

interface Column {
  key: keyof RowCells | "name";
  label: string;
  sort?: SortColumn;
  numeric?: boolean;
  bar?: string;
}

const COLUMNS: Column[] = [
  { key: "name", label: "Module", sort: "name" },
  { key: "inputs", label: "Input shapes" },
  { key: "outputs", label: "Output shapes" },
  { key: "params", label: "Params", sort: "params", numeric: true, bar: "params" },
  { key: "paramBytes", label: "Param mem", sort: "paramBytes", numeric: true, bar: "params" },
  {
    key: "activationBytes",
    label: "Activations",
    sort: "activationBytes",
    numeric: true,
    bar: "acts",
  },
  { key: "flops", label: "FLOPs", sort: "flops", numeric: true, bar: "flops" },
];

/** Widths of the numeric columns (params, param mem, activations, FLOPs), pixels. */
const FIXED_COLUMNS = [80, 104, 100, 108];
/** Minimum widths of the module, input-shape and output-shape columns, and their shares. */
const FLEX_MIN = [260, 130, 130];
const FLEX_SHARE = [2.4, 1, 1];
export const MIN_TABLE_WIDTH =
  FLEX_MIN.reduce((x, y) => x + y, 0) + FIXED_COLUMNS.reduce((x, y) => x + y, 0);

/**
 * `grid-template-columns` in whole pixels for a table `width` wide: what the fr/minmax template
 * gave, computed once per width instead of by the layout engine for every row.
 */
export function columnTemplate(width: number): string {
  const fixed = FIXED_COLUMNS.reduce((x, y) => x + y, 0);
  const shares = FLEX_SHARE.reduce((x, y) => x + y, 0);
  const free = Math.max(0, width - fixed);
  let flex = FLEX_SHARE.map((s) => Math.floor((free * s) / shares));
  // a column below its minimum takes its minimum; the others share the rest
  if (flex.some((x, i) => x < (FLEX_MIN[i] as number))) {
    const floor = FLEX_MIN.map((m, i) => Math.max(m, flex[i] as number));
    const over = floor.reduce((x, y) => x + y, 0) - free;
    if (over > 0) {
      const room = floor.map((x, i) => x - (FLEX_MIN[i] as number));
      const total = room.reduce((x, y) => x + y, 0);
      flex = floor.map((x, i) => (total > 0 ? x - Math.ceil((over * (room[i] as number)) / total) : x));
      flex = flex.map((x, i) => Math.max(FLEX_MIN[i] as number, x));
    } else flex = floor;
  }
  return [...flex, ...FIXED_COLUMNS].map((x) => `${x}px`).join(" ");
}

function div(cls: string, text?: string): HTMLDivElement {
  const d = document.createElement("div");
  d.className = cls;
  if (text !== undefined) d.textContent = text;
  return d;
}

function span(cls: string, text?: string): HTMLSpanElement {
  const s = document.createElement("span");
  s.className = cls;
  if (text !== undefined) s.textContent = text;
  return s;
}

interface RowEl {
  el: HTMLDivElement;
  caret: HTMLSpanElement;
  name: HTMLSpanElement;
  type: HTMLSpanElement;
  badge: HTMLSpanElement;
  err: HTMLSpanElement;
  assumed: HTMLSpanElement;
  ckpt: HTMLSpanElement;
  nameCell: HTMLDivElement;
  cells: { el: HTMLDivElement; text: HTMLSpanElement; bar: HTMLDivElement | null }[];
  /** Row index it shows (-1: hidden) and the view version it was filled at. */
  shown: number;
  version: number;
}

export class TreeView {
  readonly el: HTMLDivElement;
  private head: HTMLDivElement;
  private body: HTMLDivElement;
  private pool: RowEl[] = [];
  private rows: Row[] = [];
  private selected = -1;
  private highlighted = new Set<number>();
  private frame = 0;
  private sortState: { column: SortColumn; descending: boolean } = {
    column: "order",
    descending: true,
  };
  private headCells = new Map<SortColumn, HTMLDivElement>();
  /** Bumped whenever rows' content may have changed: rows filled at an older one are refilled. */
  private version = 0;
  private resizeObs: ResizeObserver | null = null;
  private colsWidth = -1;

  constructor(
    parent: HTMLElement,
    private h: TreeViewHandlers,
  ) {
    this.el = div("mw-table");
    this.el.tabIndex = 0;
    this.el.setAttribute("role", "treegrid");
    this.el.setAttribute("aria-label", "Module tree");
    this.head = div("mw-thead mw-grid");
    this.head.setAttribute("role", "row");
    for (const c of COLUMNS) {
      const cell = div(`mw-th${c.numeric ? " mw-num" : ""}`, c.label);
      cell.setAttribute("role", "columnheader");
      if (c.sort) {
        const sort = c.sort;
        cell.classList.add("mw-sortable");
        cell.title = "Sort siblings by this column (click again to reverse, a third time to reset)";
        cell.addEventListener("click", () => this.h.onSort(sort));
        this.headCells.set(sort, cell);
      }
      this.head.append(cell);
    }
    this.body = div("mw-tbody");
    this.el.append(this.head, this.body);
    parent.append(this.el);

    this.layoutColumns(parent.clientWidth);
    if (typeof ResizeObserver !== "undefined") {
      this.resizeObs = new ResizeObserver(() => this.layoutColumns(this.el.clientWidth));
      this.resizeObs.observe(this.el);
    }
    this.el.addEventListener("scroll", this.onScroll, { passive: true });
    this.el.addEventListener("keydown", this.onKey);
    this.body.addEventListener("click", this.onClick);
    this.body.addEventListener("dblclick", this.onDblClick);
  }

  setSort(column: SortColumn, descending: boolean): void {
    this.sortState = { column, descending };
    for (const [col, cell] of this.headCells) {
      cell.classList.toggle("mw-sorted", col === column);
      cell.dataset.dir = col === column ? (descending ? "desc" : "asc") : "";
    }
  }

  get sort(): { column: SortColumn; descending: boolean } {
    return this.sortState;
  }

  setRows(rows: Row[], selected: number, highlighted: ReadonlySet<number> = new Set()): void {
    this.rows = rows;
    this.selected = selected;
    this.highlighted = new Set(highlighted);
    this.body.style.height = `${rows.length * ROW_HEIGHT}px`;
    this.version += 1;
    this.render();
  }

  /** Refill the visible rows (numbers changed, e.g. while streaming or a dtype switch). */
  refresh(): void {
    this.version += 1;
    this.render();
  }

  setSelected(index: number, scroll = true): void {
    this.selected = index;
    if (scroll) this.scrollTo(index);
    this.version += 1;
    this.render();
  }

  scrollTo(index: number): void {
    if (index < 0) return;
    const headH = this.head.offsetHeight || ROW_HEIGHT;
    const top = index * ROW_HEIGHT;
    const view = this.el.clientHeight - headH;
    if (top < this.el.scrollTop) this.el.scrollTop = top;
    else if (top + ROW_HEIGHT > this.el.scrollTop + view)
      this.el.scrollTop = top + ROW_HEIGHT - view;
  }

  focus(): void {
    this.el.focus({ preventScroll: true });
  }

  /**
   * Column widths in pixels for a table `width` wide (`--mw-cols` on the table): the fixed
   * columns keep their widths; the module and shape columns share what is left 2.4 : 1 : 1,
   * never below their minimums. Recomputed only when the width changes.
   */
  layoutColumns(width: number): void {
    const w = Math.max(MIN_TABLE_WIDTH, Math.floor(width) - 2);
    if (w === this.colsWidth) return;
    this.colsWidth = w;
    this.el.style.setProperty("--mw-cols", columnTemplate(w));
  }

  destroy(): void {
    this.resizeObs?.disconnect();
    cancelAnimationFrame(this.frame);
    this.el.removeEventListener("scroll", this.onScroll);
    this.el.removeEventListener("keydown", this.onKey);
    this.body.removeEventListener("click", this.onClick);
    this.body.removeEventListener("dblclick", this.onDblClick);
    this.el.remove();
  }

  private onScroll = (): void => {
    cancelAnimationFrame(this.frame);
    this.frame = requestAnimationFrame(() => this.render());
  };

  private rowIndexOf(target: EventTarget | null): number {
    const el = (target as HTMLElement | null)?.closest?.(".mw-row") as HTMLElement | null;
    if (!el || !el.dataset.row) return -1;
    return Number(el.dataset.row);
  }

  private onClick = (e: MouseEvent): void => {
    const i = this.rowIndexOf(e.target);
    if (i < 0) return;
    if ((e.target as HTMLElement).closest(".mw-caret")) {
      this.h.onToggle(i);
    } else {
      this.h.onSelect(i);
    }
    this.focus();
  };

  private onDblClick = (e: MouseEvent): void => {
    const i = this.rowIndexOf(e.target);
    if (i < 0 || (e.target as HTMLElement).closest(".mw-caret")) return;
    this.h.onToggle(i);
  };

  private onKey = (e: KeyboardEvent): void => {
    const n = this.rows.length;
    if (n === 0) return;
    const cur = this.selected;
    const row = this.rows[cur];
    const page = Math.max(1, Math.floor((this.el.clientHeight - ROW_HEIGHT) / ROW_HEIGHT) - 1);
    let next = -2;
    switch (e.key) {
      case "ArrowDown":
        next = cur < 0 ? 0 : Math.min(n - 1, cur + 1);
        break;
      case "ArrowUp":
        next = cur < 0 ? 0 : Math.max(0, cur - 1);
        break;
      case "PageDown":
        next = Math.min(n - 1, Math.max(0, cur) + page);
        break;
      case "PageUp":
        next = Math.max(0, cur - page);
        break;
      case "Home":
        next = 0;
        break;
      case "End":
        next = n - 1;
        break;
      case "ArrowRight":
        if (!row) break;
        if (row.hasChildren && !row.expanded) this.h.onToggle(cur, true);
        else if (row.expanded && cur + 1 < n) next = cur + 1;
        e.preventDefault();
        break;
      case "ArrowLeft":
        if (!row) break;
        if (row.expanded) this.h.onToggle(cur, false);
        else if (row.parentRow >= 0) next = row.parentRow;
        e.preventDefault();
        break;
      case "Enter":
      case " ":
        if (row?.hasChildren) this.h.onToggle(cur);
        e.preventDefault();
        break;
      default:
        return;
    }
    if (next >= 0) {
      e.preventDefault();
      this.h.onSelect(next);
    }
  };

  private makeRow(): RowEl {
    const el = div("mw-row mw-grid");
    el.setAttribute("role", "row");
    const nameCell = div("mw-td mw-name");
    const caret = span("mw-caret");
    const name = span("mw-mname");
    const type = span("mw-mtype");
    const badge = span("mw-badge");
    const err = span("mw-err-icon", "⚠");
    err.title = "This module raised during the trace";
    const assumed = span("mw-assumed-icon", "≈");
    assumed.title = "Rests on an assumption: the trace assumed a value meta tensors do not have (see Details)";
    const ckpt = span("mw-ckpt-icon", "✕");
    nameCell.append(caret, name, type, badge, err, assumed, ckpt);
    el.append(nameCell);
    const cells: RowEl["cells"] = [];
    for (const c of COLUMNS.slice(1)) {
      const cell = div(`mw-td${c.numeric ? " mw-num" : " mw-shape"}`);
      const bar = c.bar ? div(`mw-bar mw-bar-${c.bar}`) : null;
      const text = span("mw-val");
      if (bar) cell.append(bar);
      cell.append(text);
      el.append(cell);
      cells.push({ el: cell, text, bar });
    }
    return { el, caret, name, type, badge, err, assumed, ckpt, nameCell, cells, shown: -1, version: -1 };
  }

  private render(): void {
    const headH = this.head.offsetHeight || ROW_HEIGHT;
    const win = visibleWindow(
      Math.max(0, this.el.scrollTop - headH),
      this.el.clientHeight || 420,
      ROW_HEIGHT,
      this.rows.length,
      OVERSCAN,
    );
    const count = win.end - win.start;
    while (this.pool.length < count) {
      const r = this.makeRow();
      this.pool.push(r);
      this.body.append(r.el);
    }
    // row i always goes to slot i % pool size: a row still in view keeps its element and, when
    // nothing changed since it was filled, is not rewritten (scrolling by a few rows touches few)
    const n = this.pool.length;
    const used = new Uint8Array(n);
    for (let i = win.start; i < win.end; i++) {
      const slot = i % n;
      used[slot] = 1;
      const r = this.pool[slot] as RowEl;
      if (r.shown === i && r.version === this.version) continue;
      this.fill(r, this.rows[i] as Row, i);
      r.shown = i;
      r.version = this.version;
    }
    for (let k = 0; k < n; k++) {
      if (used[k]) continue;
      const r = this.pool[k] as RowEl;
      if (r.shown === -1) continue;
      r.el.style.display = "none";
      r.el.dataset.row = "";
      r.shown = -1;
    }
  }

  private fill(r: RowEl, row: Row, i: number): void {
    const d = this.h.describe(row, i);
    const el = r.el;
    el.style.display = "";
    el.style.transform = `translateY(${i * ROW_HEIGHT}px)`;
    el.dataset.row = String(i);
    el.dataset.key = row.node.key;
    el.setAttribute("aria-level", String(row.level + 1));
    el.setAttribute("aria-selected", String(i === this.selected));
    if (row.hasChildren) el.setAttribute("aria-expanded", String(row.expanded));
    else el.removeAttribute("aria-expanded");
    el.classList.toggle("mw-selected", i === this.selected);
    el.classList.toggle("mw-error-row", d.error);
    el.classList.toggle("mw-dim", d.dim);
    el.classList.toggle("mw-group", d.group);
    el.classList.toggle("mw-unmatched", !row.matched);
    el.classList.toggle("mw-highlight", this.highlighted.has(i));
    r.nameCell.style.paddingLeft = `${6 + row.level * 16}px`;
    r.caret.textContent = row.hasChildren ? (row.expanded ? "▾" : "▸") : "";
    r.caret.classList.toggle("mw-leaf", !row.hasChildren);
    r.caret.title = row.hasChildren ? (row.expanded ? "Collapse" : "Expand") : "";
    r.name.textContent = d.name;
    r.type.textContent = d.type;
    r.badge.textContent = d.calls > 1 ? `×${d.calls}` : "";
    r.badge.title = d.calls > 1 ? `called ${d.calls} times` : "";
    r.err.style.display = d.error ? "" : "none";
    r.assumed.style.display = d.assumed ? "" : "none";
    r.ckpt.style.display = d.checkpoint ? "" : "none";
    r.ckpt.title = d.checkpoint ? `Checkpoint:\n${d.checkpoint}` : "";
    el.classList.toggle("mw-ckpt-row", Boolean(d.checkpoint));
    r.nameCell.title = `${d.name} (${d.type})`;
    const values = [d.inputs, d.outputs, d.params, d.paramBytes, d.activationBytes, d.flops];
    for (let k = 0; k < values.length; k++) {
      const c = r.cells[k] as RowEl["cells"][number];
      const v = values[k] as Cell;
      c.text.textContent = v.text;
      c.el.title = v.title ?? v.text;
      if (c.bar) {
        const f = Math.max(0, Math.min(1, v.fraction ?? 0));
        c.bar.style.width = `${(f * 100).toFixed(1)}%`;
      }
    }
  }
}
