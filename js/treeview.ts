/**
 * The tree *view*: a virtualized table. Only the rows in the viewport (plus a few) are in the
 * DOM; row elements are pooled and refilled on scroll, so 25,000+ modules scroll smoothly.
 *
 * The view knows nothing about payloads: the app hands it the flattened rows and a `describe`
 * function that returns the text of a row's cells. Every string goes through `textContent`.
 */
import { visibleWindow, type Row, type SortColumn } from "./tree";

export const ROW_HEIGHT = 26;

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
  nameCell: HTMLDivElement;
  cells: { el: HTMLDivElement; text: HTMLSpanElement; bar: HTMLDivElement | null }[];
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
    this.render();
  }

  /** Refill the visible rows (numbers changed, e.g. while streaming or a dtype switch). */
  refresh(): void {
    this.render();
  }

  setSelected(index: number, scroll = true): void {
    this.selected = index;
    if (scroll) this.scrollTo(index);
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

  destroy(): void {
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
    nameCell.append(caret, name, type, badge, err, assumed);
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
    return { el, caret, name, type, badge, err, assumed, nameCell, cells };
  }

  private render(): void {
    const headH = this.head.offsetHeight || ROW_HEIGHT;
    const win = visibleWindow(
      Math.max(0, this.el.scrollTop - headH),
      this.el.clientHeight || 420,
      ROW_HEIGHT,
      this.rows.length,
    );
    const count = win.end - win.start;
    while (this.pool.length < count) {
      const r = this.makeRow();
      this.pool.push(r);
      this.body.append(r.el);
    }
    for (let k = 0; k < this.pool.length; k++) {
      const r = this.pool[k] as RowEl;
      if (k >= count) {
        r.el.style.display = "none";
        r.el.dataset.row = "";
        continue;
      }
      const i = win.start + k;
      this.fill(r, this.rows[i] as Row, i);
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
