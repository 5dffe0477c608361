/**
 * The Graph tab's model: DOM-free. The payload carries the graph of module rows at depth 1, 2,
 * ... unfolded (`payload.graph`, `meta_widget.views.graph_frame.encode_graph`); `foldGraph`
 * folds it as the tree folds (a run of identical numbered siblings is one node, the edges from
 * one member to the next left out) except the groups opened in place, and sums each node's
 * FLOPs and memory.
 */
import type { Analysis, Dictionaries, GraphEdgeInfo, GraphLevel, GraphOpNode } from "./protocol";
import { groupLabels, type Aggregate, type Tree } from "./tree";

/** The node rows of the model's inputs, its outputs and the KV cache it returns. */
export const INPUT = -1;
export const OUTPUT = -2;
export const CACHE = -3;
/** The first op node's (an attention, a residual add) key in a level: `level.ops[-4 - key]`. */
export const FIRST_OP = -4;

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);
const nums = (v: unknown): number[] => (Array.isArray(v) ? v.map((x) => (typeof x === "number" ? x : 0)) : []);

/** Decode `payload.graph` (junk or absent: no levels). */
export function decodeGraph(raw: unknown, dict: Dictionaries): GraphLevel[] {
  if (!isObj(raw) || !Array.isArray(raw.levels)) return [];
  const out: GraphLevel[] = [];
  for (const l of raw.levels) {
    if (!isObj(l)) continue;
    const depth = typeof l.depth === "number" ? l.depth : out.length + 1;
    if (typeof l.as === "number") {
      const same = out.find((x) => x.depth === l.as);
      if (same) out.push({ ...same, depth });
      continue;
    }
    const src = nums(l.src);
    const dst = nums(l.dst);
    const tensor = nums(l.tensor);
    const count = nums(l.count);
    const kind = nums(l.kind);
    const ops = Array.isArray(l.ops) ? l.ops : [];
    const opnodes: GraphOpNode[] = (Array.isArray(l.opnodes) ? l.opnodes : []).map((o) => {
      const [row, k, name, detail, flops] = nums(o);
      const text = (i: number | undefined): string => dict.strings[i ?? -1] ?? "";
      return { row: row ?? -1, kind: text(k), name: text(name) || "<op>", detail: text(detail), flops: flops ?? 0 };
    });
    const edges: GraphEdgeInfo[] = src.map((s, i) => {
      const t = dict.tensors[tensor[i] ?? -1];
      const k = dict.strings[kind[i] ?? -1] ?? "data";
      return {
        src: s,
        dst: dst[i] ?? 0,
        shape: t ? (dict.shapes[t[0]] ?? []) : [],
        dtype: t ? (dict.strings[t[1]] ?? "?") : "?",
        requiresGrad: t ? t[3] === 1 : false,
        ops: nums(ops[i]).map((o) => dict.strings[o] ?? "?"),
        count: count[i] ?? 1,
        tied: k === "tied",
        kind: k,
      };
    });
    out.push({ depth, nodes: nums(l.nodes), calls: nums(l.calls), edges, ops: opnodes });
  }
  return out;
}

export type Metric = "flops" | "memory";

export interface GNode {
  key: string;
  /** Module rows it stands for (a folded node: its members'), or [INPUT] / [OUTPUT]. */
  rows: number[];
  label: string;
  type: string;
  repeats: number;
  calls: number;
  flops: number;
  /** Parameter bytes plus output mem (the new storage its outputs hold). */
  memory: number;
  /** The folded group it closes (a key of `tree.groupOf`), to open it in place; or null. */
  group: string | null;
  /** The open group it is a member of, to close it again; or null. */
  openGroup: string | null;
  /** The module the peak happens in is in it. */
  peak: boolean;
  /** A "… N more" node (graphcap.ts): the path of the module whose children it hides; or null. */
  more: string | null;
  /** "module", "input", "output", "cache", or an op node's: "attention", "residual". */
  kind: string;
  /** An op node's: the attention's kernel, the residual's branch ("+ self_attn"); or "". */
  detail: string;
}

export interface GEdge {
  src: string;
  dst: string;
  shape: number[];
  dtype: string;
  /** Bytes of the first tensor it carries. */
  bytes: number;
  ops: string[];
  count: number;
  tied: boolean;
  /** "data", "tied", "residual" (the residual stream: the spine) or "cache" (the KV cache). */
  kind: string;
  /** In a training step: the gradient the backward pass hands back along it (0: none). */
  gradBytes: number;
}

export interface GraphModel {
  depth: number;
  nodes: GNode[];
  edges: GEdge[];
}

const DTYPE_BYTES: Record<string, number> = {
  float64: 8, int64: 8, complex64: 8, float32: 4, int32: 4, bfloat16: 2, float16: 2, int16: 2,
  int8: 1, uint8: 1, bool: 1, float8_e4m3fn: 1, float8_e5m2: 1,
};

export function tensorBytes(shape: readonly number[], dtype: string): number {
  return shape.reduce((a, b) => a * b, 1) * (DTYPE_BYTES[dtype] ?? 4);
}

/** The level to draw for `depth`: the deepest one at most `depth` (or the shallowest). */
export function levelFor(a: Analysis, depth: number): GraphLevel | null {
  const levels = a.graph ?? [];
  let best: GraphLevel | null = null;
  for (const l of levels) if (l.depth <= depth && (!best || l.depth > best.depth)) best = l;
  return best ?? levels[0] ?? null;
}

/** The depths with a graph, ascending. */
export function graphDepths(a: Analysis): number[] {
  return (a.graph ?? []).map((l) => l.depth);
}

interface Folding {
  key: string;
  label: string;
  /** (group key, member position) of each closed group on the row's path. */
  member: [string, number][];
  group: string | null;
  openGroup: string | null;
}

/** How row `i` folds, given the open groups. */
function folding(tree: Tree, i: number, open: ReadonlySet<string>, labels: Map<string, string>, pos: Map<number, number>): Folding {
  const mods = tree.analysis.modules;
  const keys: string[] = [];
  const names: string[] = [];
  const member: [string, number][] = [];
  let group: string | null = null;
  let openGroup: string | null = null;
  for (let j = i; j > 0; j = mods[j]?.parent ?? 0) {
    const g = tree.groupOf[j] ?? null;
    const name = mods[j]?.name ?? "";
    if (g && !open.has(g)) {
      keys.push(g);
      names.push(labels.get(g) ?? name);
      member.push([g, pos.get(j) ?? 0]);
      group ??= g; // the innermost closed group: the one that opens in place
    } else {
      keys.push(name);
      names.push(name);
      if (g && j === i) openGroup = g;
    }
  }
  return { key: keys.reverse().join("."), label: names.reverse().join(".") || tree.analysis.title, member, group, openGroup };
}

/** Each row's position within its group (`tree.groupOf`), 0 first. */
function positions(tree: Tree): Map<number, number> {
  const pos = new Map<number, number>();
  const seen = new Map<string, number>();
  tree.groupOf.forEach((g, i) => {
    if (g === null) return;
    const k = seen.get(g) ?? 0;
    pos.set(i, k);
    seen.set(g, k + 1);
  });
  return pos;
}

const facts = new WeakMap<Tree, { labels: Map<string, string>; pos: Map<number, number> }>();

/** The tree's group labels and member positions, computed once per tree (25,000 rows: ms). */
function treeFacts(tree: Tree): { labels: Map<string, string>; pos: Map<number, number> } {
  let f = facts.get(tree);
  if (!f) facts.set(tree, (f = { labels: groupLabels(tree), pos: positions(tree) }));
  return f;
}

/** Rows holding the peak: the peak call's module and its ancestors. */
function peakRows(a: Analysis): Set<number> {
  const out = new Set<number>();
  const call = a.peak ? a.calls[a.peak.call] : undefined;
  for (let r = call ? call.module : -1; r >= 0; r = a.modules[r]?.parent ?? -1) out.add(r);
  return out;
}

/** The nodes that are no module: their name (the key is `<name>`) and type line. */
const IO: Record<number, [string, string]> = {
  [INPUT]: ["input", "the model's inputs"],
  [OUTPUT]: ["output", "what the model returns"],
  [CACHE]: ["cache", "the KV cache it returns"],
};
/** An op node's type line, by kind. */
const OP_TYPES: Record<string, string> = { attention: "attention", residual: "residual add" };

/** The graph to draw: `level` folded as the tree, except the groups in `open`. */
export function foldGraph(tree: Tree, level: GraphLevel, open: ReadonlySet<string>, aggs: readonly Aggregate[]): GraphModel {
  const a = tree.analysis;
  const { labels, pos } = treeFacts(tree);
  const peak = peakRows(a);
  const fold = new Map<number, Folding>();
  const ops = level.ops ?? [];
  const at = (row: number): Folding => {
    let f = fold.get(row);
    if (!f) {
      const op = row <= FIRST_OP ? ops[FIRST_OP - row] : undefined;
      if (op) {
        // an op node: its module's folding, its own name under the module's path
        const m = op.row >= 0 ? folding(tree, op.row, open, labels, pos) : null;
        const join = (p: string | undefined): string => (p ? `${p}.${op.name}` : op.name);
        f = { key: join(m?.key), label: join(m?.label), member: m?.member ?? [], group: m?.group ?? null, openGroup: null };
      } else if (row < 0) {
        const name = IO[row]?.[0] ?? "?";
        f = { key: `<${name}>`, label: name, member: [], group: null, openGroup: null };
      } else f = folding(tree, row, open, labels, pos);
      fold.set(row, f);
    }
    return f;
  };
  const nodes = new Map<string, GNode>();
  level.nodes.forEach((row, k) => {
    const f = at(row);
    const op = row <= FIRST_OP ? ops[FIRST_OP - row] : undefined;
    const m = op ? undefined : a.modules[row];
    const agg = op ? undefined : aggs[row];
    let n = nodes.get(f.key);
    if (!n) {
      const type = op ? OP_TYPES[op.kind] ?? op.kind : m ? m.type : IO[row]?.[1] ?? "?";
      const kind = op ? op.kind : m ? "module" : IO[row]?.[0] ?? "?";
      n = { key: f.key, rows: [], label: f.label, type, repeats: 0, calls: 0, flops: 0, memory: 0, group: f.group, openGroup: f.openGroup, peak: false, more: null, kind, detail: op?.detail ?? "" };
      nodes.set(f.key, n);
    }
    n.rows.push(op ? op.row : row);
    n.repeats += 1;
    n.calls += level.calls[k] ?? 0;
    n.flops += op ? op.flops : agg ? agg.flops : 0;
    n.memory += (m ? m.paramBytes : 0) + (agg ? agg.activationBytes : 0);
    if (!op && peak.has(row)) n.peak = true;
  });
  const training = a.mode === "training";
  const edges = new Map<string, GEdge>();
  for (const e of level.edges) {
    const s = at(e.src);
    const d = at(e.dst);
    if (crossesRepeats(s.member, d.member)) continue;
    const id = `${s.key}\u0000${d.key}\u0000${e.tied ? 1 : 0}`;
    const have = edges.get(id);
    if (have) {
      have.count += e.count;
      for (const op of e.ops) if (!have.ops.includes(op) && have.ops.length < 6) have.ops.push(op);
      continue;
    }
    const bytes = tensorBytes(e.shape, e.dtype);
    edges.set(id, {
      src: s.key,
      dst: d.key,
      shape: e.shape,
      dtype: e.dtype,
      bytes,
      ops: [...e.ops],
      count: e.count,
      tied: e.tied,
      kind: e.kind,
      gradBytes: training && e.requiresGrad && !e.tied ? bytes : 0,
    });
  }
  return { depth: level.depth, nodes: [...nodes.values()], edges: [...edges.values()] };
}

/** Whether an edge runs from one member of a closed group to another (the repeat itself). */
function crossesRepeats(src: [string, number][], dst: [string, number][]): boolean {
  for (const [g, p] of src) for (const [h, q] of dst) if (g === h && p !== q) return true;
  return false;
}

/** The node that shows module row `row`: the one holding it or its nearest ancestor. */
export function nodeOfRow(g: GraphModel, a: Analysis, row: number): GNode | null {
  const byRow = new Map<number, GNode>();
  // (an op node's rows are the modules running it: never the node showing them)
  for (const n of g.nodes) if (!OP_TYPES[n.kind]) for (const r of n.rows) byRow.set(r, n);
  for (let r = row; r >= 0; r = a.modules[r]?.parent ?? -1) {
    const n = byRow.get(r);
    if (n) return n;
  }
  return null;
}

/** 0..1: where `value` sits between the smallest and largest non-zero values (log scale). */
export function shade(value: number, values: readonly number[]): number {
  const pos = values.filter((v) => v > 0);
  if (value <= 0 || pos.length === 0) return 0;
  const lo = Math.log(Math.min(...pos));
  const hi = Math.log(Math.max(...pos));
  return hi > lo ? (Math.log(value) - lo) / (hi - lo) : 1;
}
