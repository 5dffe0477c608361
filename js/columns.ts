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

/** What a cell shows while the trace runs and its module's calls have not arrived. */
export const PENDING_TEXT = "…";

export interface RowCells {
  name: string;
  type: string;
  /** Shown as "×3" when a module ran more than once. */
  calls: number;
  error: boolean;
  /** Its numbers rest on an assumption the trace made. */
  assumed: boolean;
  /** Never called (the trace is over). */
  dim: boolean;
  /** The trace runs and this module's calls have not arrived: its cells are pending. */
  pending?: boolean;
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

/** Width of the Time column (a bound tag and a time), pixels; only with `time`. */
export const TIME_WIDTH = 132;

/** The module column's minimum, and how far it gives way once every other column it may
 * leave out is out (a table narrower than the module, Params and Time columns). */
export const NAME_MIN = 220;
const NAME_FLOOR = 170;

/** A track of the grid: its minimum width and its share of the room left (0: fixed width). */
interface Track {
  key: Column["key"];
  min: number;
  share: number;
}

/** The module, input-shape and output-shape columns share what is left 2.4 : 1 : 1. */
const TRACKS: Track[] = [
  { key: "name", min: NAME_MIN, share: 2.4 },
  { key: "inputs", min: 130, share: 1 },
  { key: "outputs", min: 130, share: 1 },
  { key: "params", min: 80, share: 0 },
  { key: "paramBytes", min: 98, share: 0 },
  { key: "activationBytes", min: 110, share: 0 },
  { key: "flops", min: 104, share: 0 },
  { key: "time", min: TIME_WIDTH, share: 0 },
];
const sum = (xs: number[]): number => xs.reduce((x, y) => x + y, 0);

/** How far below its minimum width a table keeps the columns it shows (a scrollbar's width). */
const SLACK = 24;

/**
 * Columns left out, in this order, of a table narrower than all columns' minimums: the shapes,
 * then the parameter memory (the parameters times their bytes), the output memory, the FLOPs.
 * The module, Params and Time (with `gpu=`) columns always stay: what a model weighs and how
 * long it takes are the first questions (issue 40). Every value left out is in Details.
 */
export type DroppedColumn = "inputs" | "outputs" | "paramBytes" | "activationBytes" | "flops";
export const DROP_ORDER: DroppedColumn[] = ["inputs", "outputs", "paramBytes", "activationBytes", "flops"];

/** The header label of each column that may be left out (the module header lists them). */
export const DROPPED_LABELS: Record<DroppedColumn, string> = {
  inputs: "Input shapes",
  outputs: "Output shapes",
  paramBytes: "Param mem",
  activationBytes: "Output mem",
  flops: "FLOPs",
};

export interface ColumnLayout {
  /** `grid-template-columns` in whole pixels. */
  template: string;
  /** Columns left out (their values stay in the Details panel). */
  hidden: DroppedColumn[];
  /** Below this the table scrolls sideways. */
  minWidth: number;
}

/** Share `free` pixels among flexible tracks in proportion to `shares`, each at least its min. */
function shareOut(free: number, mins: number[], shares: number[]): number[] {
  let flex = shares.map((s) => Math.floor((free * s) / sum(shares)));
  if (!flex.some((x, i) => x < (mins[i] as number))) return flex;
  // a column below its minimum takes its minimum; the others share the rest
  const floor = mins.map((m, i) => Math.max(m, flex[i] as number));
  const over = sum(floor) - free;
  if (over <= 0) return floor;
  const room = floor.map((x, i) => x - (mins[i] as number));
  const total = sum(room);
  flex = floor.map((x, i) => (total > 0 ? x - Math.ceil((over * (room[i] as number)) / total) : x));
  return flex.map((x, i) => Math.max(mins[i] as number, x));
}

/**
 * The columns of a table `width` wide, computed once per width instead of by the layout engine
 * for every row: the numbers keep their widths; the module and shape columns share what is left
 * 2.4 : 1 : 1, never below their minimums. A narrow table (a notebook beside a side panel) leaves
 * out columns in `DROP_ORDER` before it scrolls sideways; with all of them out the module column
 * gives way down to `NAME_FLOOR`. `shown`: how many columns the table on screen leaves out (null:
 * none is on screen). `time`: the Time column is shown.
 */
export function columnLayout(width: number, shown: number | null = null, time = false): ColumnLayout {
  const tracks = TRACKS.filter((t) => t.key !== "time" || time);
  const order = DROP_ORDER.filter((c) => tracks.some((t) => t.key === c));
  const keptTracks = (d: number): Track[] => tracks.filter((t) => !(order.slice(0, d) as string[]).includes(t.key));
  const need = (d: number): number => sum(keptTracks(d).map((t) => t.min));
  // a column on screen stays until the table is SLACK px narrower than it needs, squeezing the
  // module column: a scrollbar that comes and goes (the tree's, the page's, the notebook's) does
  // not make columns come and go
  const kept = (d: number): boolean => shown !== null && d <= shown;
  const room = (d: number): number => need(d) - (kept(d) ? SLACK : 0);
  let dropped = 0;
  while (dropped < order.length && width < room(dropped)) dropped += 1;
  const visible = keptTracks(dropped);
  const give = dropped === order.length ? NAME_MIN - NAME_FLOOR : kept(dropped) ? SLACK : 0;
  const squeeze = Math.max(0, Math.min(give, need(dropped) - width));
  const flexTracks = visible.filter((t) => t.share > 0);
  const mins = flexTracks.map((t) => t.min - (t.key === "name" ? squeeze : 0));
  const fixed = sum(visible.filter((t) => t.share === 0).map((t) => t.min));
  const flex = shareOut(Math.max(0, width - fixed), mins, flexTracks.map((t) => t.share));
  let k = 0;
  const px = visible.map((t) => (t.share > 0 ? (flex[k++] as number) : t.min));
  return {
    template: px.map((x) => `${x}px`).join(" "),
    hidden: order.slice(0, dropped),
    minWidth: need(dropped) - squeeze,
  };
}

/** A row's cells in the order of `COLUMNS` after the module column (Time: empty without it). */
export function cellValues(d: RowCells): Cell[] {
  return [d.inputs, d.outputs, d.params, d.paramBytes, d.activationBytes, d.flops, d.time ?? NO_TIME];
}

const NO_TIME: TimeCell = { text: "", bound: "" };
