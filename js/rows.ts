/**
 * What each row of the tree table shows (`RowCells`): name, type, calls, shapes and the numbers
 * with their inline bars, at the precision the switch shows. Pure: it reads the tree and the
 * aggregates and returns text, tooltips and bar fractions; `TreeView` draws them.
 */
import type { DtypeChoice } from "./charts";
import { checkpointMarker } from "./checkpoint";
import { NONE, formatBytes, formatCount, formatExact, formatFlops, formatShapes } from "./format";
import type { Analysis, CallInfo, ModuleInfo } from "./protocol";
import { nodeName, nodeType, nodeValues, type Aggregate, type GroupNode, type Row, type Tree } from "./tree";
import { PENDING_TEXT, type Cell, type RowCells, type TimeCell } from "./columns";
import { formatSeconds } from "./timing";

/** The largest value of each column: its inline bars are fractions of it. */
export interface Scales {
  params: number;
  paramBytes: number;
  acts: number;
  flops: number;
  /** The largest module time (1 without `time`). */
  time: number;
}

/** What the cells are computed from (rebuilt when the analysis, the dtype or the rows change). */
export interface RowContext {
  tree: Tree;
  aggs: readonly Aggregate[];
  /** Module row i or something below it was called. */
  reached: readonly boolean[];
  scales: Scales;
  dtype: DtypeChoice;
  paramBytes: (m: ModuleInfo) => number;
  /** Output memory at the switch's precision. */
  outputBytes: (bytes: number) => number;
  /** Module path -> checkpoint problems of its own parameters (`checkpointProblems`). */
  checkpoint: Map<string, string[]>;
}

/** Largest values, for the inline bars (computed once per aggregate or dtype change). */
export function computeScales(a: Analysis | null, aggs: readonly Aggregate[], paramBytes: (m: ModuleInfo) => number): Scales {
  const root = a?.modules[0];
  if (!a || !root) return { params: 1, paramBytes: 1, acts: 1, flops: 1, time: 1 };
  let acts = 0;
  let flops = 0;
  for (const g of aggs) {
    if (g.activationBytes > acts) acts = g.activationBytes;
    if (g.flops > flops) flops = g.flops;
  }
  const time = Math.max(0, ...(a.time?.moduleS ?? []));
  return { params: root.params || 1, paramBytes: paramBytes(root) || 1, acts: acts || 1, flops: flops || 1, time: time || 1 };
}

/** Module row i was called, or something below it was. */
export function reachedModules(a: Analysis | null, aggs: readonly Aggregate[]): boolean[] {
  const reached = aggs.map((g) => g.calls > 0);
  const mods = a?.modules ?? [];
  for (let i = mods.length - 1; i > 0; i--) {
    const p = (mods[i] as ModuleInfo).parent;
    if (reached[i] && p >= 0) reached[p] = true;
  }
  return reached;
}

function shapesCell(calls: CallInfo[], which: "inputs" | "outputs"): Cell {
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

const CONTAINER_HINT = "not called itself (a container): see its children";
/** Containers without a `forward` (`CONTAINERS` in `views/widget.py`): never called themselves. */
const CONTAINER_TYPES = new Set(["ModuleList", "ModuleDict", "ParameterList", "ParameterDict"]);
export const PENDING_HINT = "not traced yet: its shapes, FLOPs and output memory come with its calls";

/** A pending cell: the trace runs and this module's calls have not arrived. */
const pendingCell = (): Cell => ({ text: PENDING_TEXT, title: PENDING_HINT, fraction: 0 });

/**
 * The Time cell of a node: its seconds on the GPU and what bounds it (a folded group: the
 * bound of its slowest member); undefined without `analysis.time`.
 */
export function timeCell(a: Analysis, members: readonly number[], seconds: number, shown: boolean, scale: number): TimeCell | undefined {
  const t = a.time;
  if (!t) return undefined;
  let slowest = members[0] ?? 0;
  for (const i of members) if ((t.moduleS[i] ?? 0) > (t.moduleS[slowest] ?? 0)) slowest = i;
  const bound = shown ? (t.bound[slowest] ?? "") : "";
  const many = members.length > 1 ? `, summed over ${members.length} modules` : "";
  return {
    text: shown ? formatSeconds(seconds) : "–",
    title: shown
      ? `${formatSeconds(seconds)} on ${t.gpu}${bound ? ` (${bound}-bound)` : ""}: forward and backward, sub-modules included${many}`
      : CONTAINER_HINT,
    fraction: seconds / scale,
    bound,
  };
}

/** The cells of one row. */
export function describeRow(ctx: RowContext, row: Row): RowCells {
  const { tree, scales: s } = ctx;
  const a = tree.analysis;
  const node = row.node;
  const v = nodeValues(tree, node, ctx.aggs, ctx.paramBytes);
  const mi = node.kind === "module" ? node.module : (node.members[0] as number);
  const m = a.modules[mi] as ModuleInfo;
  const calls = m.calls.map((j) => a.calls[j]).filter((c): c is CallInfo => c !== undefined);
  const traced = a.status !== "structural";
  // while the trace runs, a module whose calls have not arrived is pending (its structure,
  // parameters included, is known; its shapes and costs are not), unless it is a container
  // without `forward` with a called child
  const pending = a.status === "running" && v.calls === 0 && !(ctx.reached[mi] === true && CONTAINER_TYPES.has(m.type));
  // a container that is never called itself (ModuleList): its numbers are in its children
  const container = traced && v.calls === 0 && ctx.reached[mi] === true && !pending;
  const name = nodeName(tree, node);
  const type = nodeType(tree, node);
  const shown = traced && !container;
  const out = ctx.outputBytes(v.activationBytes);
  return {
    name,
    type: m.parent < 0 && node.kind === "module" && type === name ? "" : type,
    calls: node.kind === "module" ? v.calls : Math.round(v.calls / node.members.length),
    error: v.error,
    assumed: v.assumed,
    dim: traced && v.calls === 0 && !container && !pending,
    pending,
    checkpoint: checkpointMarker(ctx.checkpoint, a, node, row.hasChildren && !row.expanded),
    group: node.kind === "group",
    inputs: pending ? pendingCell() : shapesCell(calls, "inputs"),
    outputs: pending ? pendingCell() : shapesCell(calls, "outputs"),
    params: { text: v.params ? formatCount(v.params) : NONE, title: `${formatExact(v.params)} parameters`, fraction: v.params / s.params },
    paramBytes: {
      text: v.paramBytes ? formatBytes(v.paramBytes) : NONE,
      title: `${formatExact(v.paramBytes)} bytes`,
      fraction: v.paramBytes / s.paramBytes,
    },
    activationBytes: pending
      ? pendingCell()
      : {
          text: shown && out ? formatBytes(out) : NONE,
          title: container
            ? CONTAINER_HINT
            : `${formatExact(out)} bytes (outputs' new storage, ${a.mode === "generate" ? "its largest call: generate() runs the model once per token" : "summed over calls"}${ctx.dtype === "recorded" ? "" : `, at ${ctx.dtype}`})`,
          fraction: v.activationBytes / s.acts,
        },
    flops: pending
      ? pendingCell()
      : {
          text: shown && v.flops ? formatFlops(v.flops) : NONE,
          title: container
            ? CONTAINER_HINT
            : v.backwardFlops
              ? `${formatExact(v.flops)} FLOPs: forward ${formatExact(v.flops - v.backwardFlops)} + backward ${formatExact(v.backwardFlops)}`
              : `${formatExact(v.flops)} FLOPs`,
          fraction: v.flops / s.flops,
        },
    time: timeCell(a, node.kind === "module" ? [node.module] : node.members, v.time, shown, s.time),
  };
}

/**
 * What the table says when it has no rows ("" when it has some); `waiting`: the kernel said
 * what the analysis waits for (the model is not built yet, so there is no tree to show).
 */
export function emptyText(a: Analysis | null, rows: number, filter: string, waiting = false): string {
  if (!a) return waiting ? "The module tree shows here as soon as the model is built." : "Nothing analyzed yet.";
  if (rows > 0) return "";
  if (filter.trim()) return `No module name, type or path matches “${filter.trim()}”.`;
  if (a.status === "running") return "Waiting for the module tree…";
  if (a.status === "error" && a.modules.length === 0) return "No module tree: the analysis stopped before the model was built.";
  return "This model has no modules.";
}

/** How far the trace is through the model's repeated layers. */
export interface LayerProgress {
  /** The group's path and range ("model.layers.0–79"). */
  label: string;
  /** Members whose own call arrived (a call arrives when it ends: the layer is traced). */
  done: number;
  total: number;
}

/**
 * The largest run of repeated siblings (a decoder's layers) and how many of them have been
 * traced: null when the model has none. Calls arrive as they end, so a layer counts once its
 * forward is over.
 */
export function layerProgress(tree: Tree, aggs: readonly Aggregate[]): LayerProgress | null {
  let best: GroupNode | null = null;
  for (const node of tree.nodes) {
    for (const c of node?.children ?? []) if (c.kind === "group" && (!best || c.members.length > best.members.length)) best = c;
  }
  if (!best) return null;
  const done = best.members.filter((i) => (aggs[i]?.calls ?? 0) > 0).length;
  return { label: nodeName(tree, best), done, total: best.members.length };
}
