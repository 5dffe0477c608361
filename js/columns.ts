/**
 * The tree table's columns: what each row holds (`RowCells`), the columns' labels, sorts and
 * bars (`COLUMNS`), and their widths for a table of a given width (`columnLayout`). Pure: no
 * DOM; `treeview.ts` draws them.
 *
 * The Time column (an analysis with `gpu=`, see `timing.ts`) shows each module's estimated
 * time and what bounds it ("compute", "memory", "comm"); it is left out without `time`.
 */
import type { SortColumn } from "./tree";

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
  /** The estimated time on the GPU (`analyze(..., gpu=...)`); absent without one. */
  time?: TimeCell;
}

/** A Time cell: the time and what bounds it ("compute", "memory", "comm"; "" none). */
export interface TimeCell extends Cell {
  bound: string;
}

export interface Column {
  key: keyof RowCells | "name";
  label: string;
  sort?: SortColumn;
  numeric?: boolean;
  bar?: string;
  /** What the column holds: its header's tooltip. */
  hint?: string;
}

/** The one definition of the output-memory column (README "What the numbers mean"). */
export const OUTPUT_MEM_HINT =
  "Output mem: bytes of new storage this module's outputs hold, summed over its calls (views and " +
  "returned inputs hold none). Not the memory used inside the module, and not what is live at the " +
  "peak: the memory tab shows the peak by category.";

/** The Time column's header tooltip. */
export const TIME_HINT =
  "Time: the estimated time of this module's calls on the GPU, forward and backward, its " +
  "sub-modules included; the tag says what bounds it: compute (FLOPs over the dtype's peak), " +
  "memory (bytes moved over HBM bandwidth) or comm (collectives).";

export const COLUMNS: Column[] = [
  { key: "name", label: "Module", sort: "name" },
  { key: "inputs", label: "Input shapes" },
  { key: "outputs", label: "Output shapes" },
  { key: "params", label: "Params", sort: "params", numeric: true, bar: "params" },
  { key: "paramBytes", label: "Param mem", sort: "paramBytes", numeric: true, bar: "params" },
  {
    key: "activationBytes",
    label: "Output mem",
    sort: "activationBytes",
    numeric: true,
    bar: "acts",
    hint: OUTPUT_MEM_HINT,
  },
  { key: "flops", label: "FLOPs", sort: "flops", numeric: true, bar: "flops" },
  { key: "time", label: "Time", sort: "time", numeric: true, bar: "time", hint: TIME_HINT },
];

/** Widths of the numeric columns (params, param mem, activations, FLOPs), pixels. */
const FIXED_COLUMNS = [80, 98, 110, 104];
/** Width of the Time column (a bound tag and a time), pixels; only with `time`. */
export const TIME_WIDTH = 132;
/** The module, input-shape and output-shape columns: minimum widths and shares of the rest. */
const FLEX_MIN = [220, 130, 130];
const FLEX_SHARE = [2.4, 1, 1];
const sum = (xs: number[]): number => xs.reduce((x, y) => x + y, 0);

/** How far below its minimum width a table keeps the columns it shows (a scrollbar's width). */
const SLACK = 24;

/** Columns left out, in this order, of a table narrower than all columns' minimums. */
export type DroppedColumn = "inputs" | "outputs";
export const DROP_ORDER: DroppedColumn[] = ["inputs", "outputs"];

export interface ColumnLayout {
  /** `grid-template-columns` in whole pixels. */
  template: string;
  /** Shape columns left out (their values stay in the Details panel). */
  hidden: DroppedColumn[];
  /** Below this the table scrolls sideways. */
  minWidth: number;
}

/**
 * The columns of a table `width` wide, computed once per width instead of by the layout engine
 * for every row: the numbers keep their widths; the module and shape columns share what is left
 * 2.4 : 1 : 1, never below their minimums. A narrow table (a notebook beside a side panel) leaves
 * out the input shapes, then the output shapes, before it scrolls sideways. `time`: the Time
 * column is shown (one more fixed column, last).
 */
export function columnLayout(width: number, shown: number | null = null, time = false): ColumnLayout {
  const fixedColumns = time ? [...FIXED_COLUMNS, TIME_WIDTH] : FIXED_COLUMNS;
  const fixed = sum(fixedColumns);
  let dropped = 0;
  const need = (d: number): number => fixed + sum(FLEX_MIN.slice(0, FLEX_MIN.length - d));
  // a column on screen (`shown`: how many were left out before) stays until the table is
  // SLACK px narrower than it needs, squeezing the module column: a scrollbar that comes and
  // goes (the tree's, the page's, the notebook's) does not make columns come and go
  const kept = (d: number): boolean => shown !== null && d <= shown;
  const room = (d: number): number => need(d) - (kept(d) ? SLACK : 0);
  while (dropped < DROP_ORDER.length && width < room(dropped)) dropped += 1;
  // the module column is first; input shapes (index 1) go before output shapes (index 2)
  const keep = [0, 1, 2].filter((i) => i === 0 || i > dropped);
  const mins = keep.map((i) => FLEX_MIN[i] as number);
  const squeeze = kept(dropped) ? Math.max(0, Math.min(SLACK, need(dropped) - width)) : 0;
  mins[0] = (mins[0] as number) - squeeze;
  const shares = keep.map((i) => FLEX_SHARE[i] as number);
  const free = Math.max(0, width - fixed);
  let flex = shares.map((s) => Math.floor((free * s) / sum(shares)));
  // a column below its minimum takes its minimum; the others share the rest
  if (flex.some((x, i) => x < (mins[i] as number))) {
    const floor = mins.map((m, i) => Math.max(m, flex[i] as number));
    const over = sum(floor) - free;
    if (over > 0) {
      const room = floor.map((x, i) => x - (mins[i] as number));
      const total = sum(room);
      flex = floor.map((x, i) => (total > 0 ? x - Math.ceil((over * (room[i] as number)) / total) : x));
      flex = flex.map((x, i) => Math.max(mins[i] as number, x));
    } else flex = floor;
  }
  return {
    template: [...flex, ...fixedColumns].map((x) => `${x}px`).join(" "),
    hidden: DROP_ORDER.slice(0, dropped),
    minWidth: need(dropped) - squeeze,
  };
}

/** A row's cells in the order of `COLUMNS` after the module column (Time: empty without it). */
export function cellValues(d: RowCells): Cell[] {
  return [d.inputs, d.outputs, d.params, d.paramBytes, d.activationBytes, d.flops, d.time ?? NO_TIME];
}

const NO_TIME: TimeCell = { text: "", bound: "" };
