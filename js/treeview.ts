/**
 * The tree *view*: a virtualized table. Only the rows in the viewport (plus a few) are in the
 * DOM; row elements are pooled and refilled on scroll, so 25,000+ modules scroll smoothly.
 *
 * The view knows nothing about payloads: the app hands it the flattened rows and a `describe`
 * function that returns the text of a row's cells. Every string goes through `textContent`.
 */
import { COLUMNS, DROP_ORDER, DROPPED_LABELS, PENDING_TEXT, cellValues, columnLayout, type Cell, type RowCells } from "./columns";
import { visibleWindow, type Row, type SortColumn } from "./tree";

export { OUTPUT_MEM_HINT, columnLayout, type Cell, type RowCells } from "./columns";

export const ROW_HEIGHT = 26;
/** Rows rendered beyond each edge of the viewport. */
const OVERSCAN = 4;

export interface TreeViewHandlers {
  describe(row: Row, index: number): RowCells;
  onSelect(index: number): void;
  /** `open`: undefined toggles. */
  /** `deep`: open everything below, folded groups and all their members (Alt+click). */
  onToggle(index: number, open?: boolean, deep?: boolean): void;
  onSort(column: SortColumn): void;
}

function div(cls: string, text?: string): HTMLDivElement {
  const d = document.createElement("div");
  d.className = cls;
  if (text !== undefined) d.textContent = text;
  return d;
}

/** An element holding one text node that is rewritten in place (no new node per fill). */
interface TextEl<E extends HTMLElement = HTMLElement> {
  el: E;
  text: Text;
}

function textEl<K extends "div" | "span">(tag: K, cls: string, text = ""): TextEl<HTMLElementTagNameMap[K]> {
  const el = document.createElement(tag);
  el.className = cls;
  const node = document.createTextNode(text);
  el.append(node);
  return { el, text: node };
}

function setText(t: TextEl, value: string): void {
  if (t.text.data !== value) t.text.data = value;
}

function setAttr(el: HTMLElement, name: string, value: string): void {
  if (el.getAttribute(name) !== value) el.setAttribute(name, value);
}

/**
 * One pooled row. A row is kept to few layout objects, because scrolling refills every visible
 * row each frame: a cell is one element with one text node, and a number's proportional bar is
 * the cell's background (`background-size`), not an element of its own.
 */
interface RowEl {
  el: HTMLDivElement;
  nameCell: HTMLDivElement;
  caret: TextEl<HTMLSpanElement>;
  name: TextEl<HTMLSpanElement>;
  /** The class, in parts (`splitType`): a group's count ("80 × ") and the tail stay, the head
   * between them shortens with "…". */
  type: { el: HTMLSpanElement; count: TextEl<HTMLSpanElement>; head: TextEl<HTMLSpanElement>; tail: TextEl<HTMLSpanElement> };
  /** "×3", the error, assumption and checkpoint marks: created when a row first needs them. */
  marks: Partial<Record<"badge" | "err" | "assumed" | "ckpt", HTMLSpanElement>>;
  cells: (TextEl<HTMLDivElement> & { bar: boolean; fraction: number })[];
  /** What the row was last filled with: tooltips are made from it on hover. */
  cellsShown: RowCells | null;
  /** Row index it shows (-1: hidden) and the view version it was filled at. */
  shown: number;
  version: number;
}

function nameTitle(d: RowCells): string {
  return d.type ? `${d.name} (${d.type})` : d.name;
}

const MARKS = {
  badge: { cls: "mw-badge", text: "" },
  err: { cls: "mw-err-icon", text: "⚠" },
  assumed: { cls: "mw-assumed-icon", text: "≈" },
  ckpt: { cls: "mw-ckpt-icon", text: "✕" },
} as const;

const MARK_TITLES = {
  err: "This module raised during the trace",
  assumed:
    "Rests on an assumption: the trace assumed a value meta tensors do not have (see Details)",
} as const;

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
  private nameHead!: HTMLDivElement;
  /** "+3 in Details": how many columns a narrow table left out (`showHidden`). */
  private hiddenMark = document.createElement("span");
  private nameSortTitle = "";
  private timeShown = false;

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
      const cell = div(`mw-th mw-col-${c.key}${c.numeric ? " mw-num" : ""}`, c.label);
      if (c.key === "name") {
        this.nameHead = cell;
        this.hiddenMark.className = "mw-hidden-cols";
        cell.append(this.hiddenMark);
      }
      cell.setAttribute("role", "columnheader");
      if (c.sort) {
        const sort = c.sort;
        cell.classList.add("mw-sortable");
        cell.title = `${c.hint ? `${c.hint}\n` : ""}Sort siblings by this column (click again to reverse, a third time to reset)`;
        cell.addEventListener("click", () => this.h.onSort(sort));
        this.headCells.set(sort, cell);
        if (c.key === "name") this.nameSortTitle = cell.title;
      }
      this.head.append(cell);
    }
    this.body = div("mw-tbody");
    this.el.append(this.head, this.body);
    parent.append(this.el);

    // the table's own width without its scrollbar gutter, as the resize observer measures it
    this.layoutColumns(this.el.clientWidth || parent.clientWidth);
    if (typeof ResizeObserver !== "undefined") {
      this.resizeObs = new ResizeObserver(() => this.layoutColumns(this.el.clientWidth));
      this.resizeObs.observe(this.el);
    }
    this.el.addEventListener("scroll", this.onScroll, { passive: true });
    this.el.addEventListener("keydown", this.onKey);
    this.body.addEventListener("click", this.onClick);
    this.body.addEventListener("dblclick", this.onDblClick);
    this.body.addEventListener("mouseover", this.onOver);
  }

  setSort(column: SortColumn, descending: boolean): void {
    this.sortState = { column, descending };
    for (const [col, cell] of this.headCells) {
      cell.classList.toggle("mw-sorted", col === column);
      cell.dataset.dir = col === column ? (descending ? "desc" : "asc") : "";
    }
  }

  /** A training step: the FLOPs column counts forward and backward (its header says so). */
  setTraining(training: boolean): void {
    const head = this.headCells.get("flops");
    if (!head || head.dataset.training === String(training)) return;
    head.dataset.training = String(training);
    head.textContent = training ? "Step FLOPs" : "FLOPs";
    head.title = training
      ? "FLOPs of the training step: forward plus backward (hover a cell for each). Click to sort"
      : "Sort siblings by this column (click again to reverse, a third time to reset)";
  }

  /** Show the Time column (an analysis timed on a GPU) or leave it out. */
  setTime(on: boolean): void {
    if (on === this.timeShown) return;
    this.timeShown = on;
    this.el.classList.toggle("mw-has-time", on);
    const last = this.colsWidth > 0 ? this.colsWidth + 2 : 0;
    this.colsWidth = -1;
    this.layoutColumns(this.el.clientWidth || last);
    this.version += 1;
    this.render();
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

  /** Lay the columns out for a table `width` wide (see `columnLayout`); only when it changes. */
  layoutColumns(width: number): void {
    const w = Math.floor(width) - 2;
    if (w === this.colsWidth || w <= 0) return;
    // how many columns the last layout left out (none yet: null)
    const before = this.colsWidth > 0 ? DROP_ORDER.filter((c) => this.el.classList.contains(`mw-hide-${c}`)).length : null;
    this.colsWidth = w;
    const layout = columnLayout(w, before, this.timeShown);
    this.el.style.setProperty("--mw-cols", layout.template);
    this.el.style.setProperty("--mw-indent", `${indentFor(Number.parseInt(layout.template, 10))}px`);
    this.el.style.setProperty("--mw-min-width", `${layout.minWidth}px`);
    for (const col of DROP_ORDER) {
      this.el.classList.toggle(`mw-hide-${col}`, layout.hidden.includes(col));
    }
    this.showHidden(layout.hidden.map((c) => DROPPED_LABELS[c]));
  }

  /** The module header says which columns a narrow table left out ("+3"), and where they are. */
  private showHidden(labels: string[]): void {
    const tip = labels.length
      ? `Too narrow for ${labels.join(", ")}: select a row to see them in Details, or widen the view`
      : "";
    this.nameHead.title = [tip, this.nameSortTitle].filter((x) => x).join("\n");
    this.hiddenMark.textContent = labels.length ? `+${labels.length} in Details` : "";
    this.hiddenMark.title = tip;
  }

  destroy(): void {
    this.resizeObs?.disconnect();
    cancelAnimationFrame(this.frame);
    this.el.removeEventListener("scroll", this.onScroll);
    this.el.removeEventListener("keydown", this.onKey);
    this.body.removeEventListener("click", this.onClick);
    this.body.removeEventListener("dblclick", this.onDblClick);
    this.body.removeEventListener("mouseover", this.onOver);
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
      if (e.altKey) this.h.onToggle(i, true, true);
      else this.h.onToggle(i);
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
    const caret = textEl("span", "mw-caret");
    const name = textEl("span", "mw-mname");
    const type = {
      el: document.createElement("span"),
      count: textEl("span", "mw-mtype-count"),
      head: textEl("span", "mw-mtype-head"),
      tail: textEl("span", "mw-mtype-tail"),
    };
    type.el.className = "mw-mtype";
    type.el.append(type.count.el, type.head.el, type.tail.el);
    nameCell.append(caret.el, name.el, type.el);
    el.append(nameCell);
    const cells: RowEl["cells"] = [];
    for (const c of COLUMNS.slice(1)) {
      const bar = c.bar !== undefined;
      const cell = textEl("div", `mw-td mw-col-${c.key} ${c.numeric ? "mw-num" : "mw-shape"}${bar ? ` mw-barred mw-barred-${c.bar}` : ""}`);
      el.append(cell.el);
      cells.push({ ...cell, bar, fraction: -1 });
    }
    return { el, nameCell, caret, name, type, marks: {}, cells, cellsShown: null, shown: -1, version: -1 };
  }

  /** Show or hide one of the name cell's marks, creating it the first time it is shown. */
  private mark(r: RowEl, which: keyof typeof MARKS, on: boolean, text?: string, title?: string): void {
    let m = r.marks[which];
    if (!on) {
      if (m && m.style.display !== "none") m.style.display = "none";
      return;
    }
    if (!m) {
      m = document.createElement("span");
      m.className = MARKS[which].cls;
      m.textContent = MARKS[which].text;
      if (which in MARK_TITLES) m.title = MARK_TITLES[which as keyof typeof MARK_TITLES];
      // marks keep their order (badge, error, assumed, checkpoint) whichever appears first
      const order = Object.keys(MARKS) as (keyof typeof MARKS)[];
      const after = order.slice(order.indexOf(which) + 1).map((k) => r.marks[k]).find((x) => x);
      r.nameCell.insertBefore(m, after ?? null);
      r.marks[which] = m;
    }
    m.style.display = "";
    if (text !== undefined && m.textContent !== text) m.textContent = text;
    if (title !== undefined) m.title = title;
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
    r.cellsShown = d;
    if (r.shown === -1) el.style.display = "";
    el.style.transform = `translateY(${i * ROW_HEIGHT}px)`;
    el.dataset.row = String(i);
    el.dataset.key = row.node.key;
    setAttr(el, "aria-level", String(row.level + 1));
    setAttr(el, "aria-selected", String(i === this.selected));
    if (row.hasChildren) setAttr(el, "aria-expanded", String(row.expanded));
    else el.removeAttribute("aria-expanded");
    el.classList.toggle("mw-selected", i === this.selected);
    el.classList.toggle("mw-error-row", d.error);
    el.classList.toggle("mw-dim", d.dim);
    el.classList.toggle("mw-pending", d.pending === true);
    el.classList.toggle("mw-group", d.group);
    el.classList.toggle("mw-unmatched", !row.matched);
    el.classList.toggle("mw-highlight", this.highlighted.has(i));
    el.classList.toggle("mw-ckpt-row", Boolean(d.checkpoint));
    // the indent per level is the table's --mw-indent (narrower in a narrow table)
    const level = String(row.level);
    if (r.nameCell.style.getPropertyValue("--mw-level") !== level) r.nameCell.style.setProperty("--mw-level", level);
    setText(r.caret, row.hasChildren ? (row.expanded ? "▾" : "▸") : "");
    r.caret.el.classList.toggle("mw-leaf", !row.hasChildren);
    setText(r.name, d.name);
    // a name gives way only after its class's head, and keeps 5 characters ("norm" stays whole)
    const minCh = `${Math.min(d.name.length, 5)}ch`;
    if (r.name.el.style.minWidth !== minCh) r.name.el.style.minWidth = minCh;
    const [head, tail] = splitType(d.type);
    const count = /^\d+ × /.exec(head)?.[0] ?? "";
    setText(r.type.count, count);
    setText(r.type.head, head.slice(count.length));
    setText(r.type.tail, tail);
    if (r.nameCell.hasAttribute("title")) r.nameCell.title = nameTitle(d);
    this.mark(r, "badge", d.calls > 1, `×${d.calls}`, `called ${d.calls} times`);
    this.mark(r, "err", d.error);
    this.mark(r, "assumed", d.assumed);
    this.mark(r, "ckpt", Boolean(d.checkpoint), undefined, `Checkpoint:\n${d.checkpoint ?? ""}`);
    const values = cellValues(d);
    for (let k = 0; k < values.length; k++) {
      const c = r.cells[k] as RowEl["cells"][number];
      const v = values[k] as Cell;
      setText(c, v.text);
      // a cell waiting for its module's calls (the trace runs): muted, the known ones are not
      const waits = d.pending === true && v.text === PENDING_TEXT;
      if (c.el.classList.contains("mw-td-pending") !== waits) c.el.classList.toggle("mw-td-pending", waits);
      // a tooltip shown before (see onOver) follows the new value
      if (c.el.hasAttribute("title")) c.el.title = v.title ?? v.text;
      if (c.bar) {
        // whole tenths of a percent: a bar moves only when its width does
        const f = Math.round(Math.max(0, Math.min(1, v.fraction ?? 0)) * 1000);
        if (f !== c.fraction) {
          c.fraction = f;
          c.el.style.backgroundSize = `${f / 10}% var(--mw-bar-h)`;
        }
      }
    }
    // the Time cell's tag: what bounds the module (CSS draws it from the attribute)
    const timeCell = r.cells[values.length - 1];
    const bound = d.time?.bound ?? "";
    if (timeCell && timeCell.el.dataset.bound !== bound) timeCell.el.dataset.bound = bound;
  }

  /** Tooltips are made when the pointer reaches a cell, not for every row scrolled past. */
  private onOver = (e: MouseEvent): void => {
    const target = e.target as HTMLElement;
    const rowEl = target.closest?.(".mw-row") as HTMLElement | null;
    const r = rowEl && this.pool.find((p) => p.el === rowEl);
    const d = r?.cellsShown;
    if (!r || !d) return;
    if (target === r.nameCell || r.nameCell.contains(target)) {
      if (!Object.values(r.marks).includes(target as HTMLSpanElement)) {
        r.nameCell.title = nameTitle(d);
      }
      r.caret.el.title = r.caret.text.data === "" ? "" : r.caret.text.data === "▾" ? "Collapse" : "Expand";
      return;
    }
    const k = r.cells.findIndex((c) => c.el === target);
    const v = cellValues(d)[k];
    if (k >= 0 && v) target.title = v.title ?? v.text;
  };
}

/**
 * Pixels per tree level in a module column `width` wide: 16, and less in a narrow column, where
 * deep rows would otherwise spend their room on indentation and cut their names.
 */
export function indentFor(width: number): number {
  return width >= 280 ? 16 : width >= 230 ? 12 : width >= 200 ? 8 : 6;
}

/** The shortest and longest tail of a class label kept whole ("DecoderLayer", "Embedding"). */
const TAIL_MIN = 8;
const TAIL_MAX = 14;

/**
 * A class label split for a middle ellipsis done by CSS: the head shrinks with "…", the tail
 * never does. The tail starts at a word of the class's CamelCase, 8 to 14 characters from the
 * end: "80 × LlamaDecoderLayer" squeezed reads "80 × Ll…DecoderLayer". A short label is all tail:
 * it is never cut ("LlamaRMSNorm").
 */
export function splitType(type: string): [string, string] {
  if (type.length <= TAIL_MAX) return ["", type];
  let at = type.length - TAIL_MIN;
  while (at > type.length - TAIL_MAX && !/[A-Z]/.test(type[at] ?? "")) at -= 1;
  if (!/[A-Z]/.test(type[at] ?? "")) at = type.length - TAIL_MIN - 1;
  return [type.slice(0, at), type.slice(at)];
}
