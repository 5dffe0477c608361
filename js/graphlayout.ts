/**
 * The Graph tab's layout: dagre's layered layout, with each chain of nodes (one edge out of
 * each, one edge into the next: a stack of blocks) given to dagre as one box and stacked inside
 * it, a long one in columns read top to bottom, left to right. A chain needs no layered layout;
 * dagre's cost grows faster than its node count (a 100-node chain: ~0.2 s), so a long model
 * lays out in the time of its branches. DOM-free.
 */
import dagre from "@dagrejs/dagre";
import { straighten } from "./graphspine";

export interface Point {
  x: number;
  y: number;
}

/** A node's box: its centre and size (as dagre gives it). */
export interface Box extends Point {
  width: number;
  height: number;
}

export interface Layout {
  boxes: Map<string, Box>;
  /** Each edge's polyline, by edge index ([] for one from a node to itself). */
  points: Point[][];
  width: number;
  height: number;
}

/** Space between ranks, and between neighbours in a rank (pixels). */
export const RANK_SEP = 36;
const NODE_SEP = 24;
const MARGIN = 8;
/** Chains this long or longer are stacked by hand. */
const MIN_CHAIN = 3;
/** Chains this long or longer wrap into columns, so that the graph's shape suits a page. */
const WRAP = 16;
/** A wrapped chain's columns are this many nodes tall at least. */
const MIN_ROWS = 6;
/** Space between a wrapped chain's columns (room for the edge from one to the next). */
const COL_GAP = 40;
/** A node feeding this many others does not break chains: its edges into one are stubs. */
const FAN = 4;

interface Ends {
  src: string;
  dst: string;
  /** "residual": the residual stream, kept straight (the spine). */
  kind?: string;
}

/** How much more dagre straightens a residual stream's edge than another (its spine). */
const SPINE_WEIGHT = 8;

/** Nodes that feed `FAN` or more others (a rotary embedding or a mask every layer reads). */
export function broadcasters(edges: readonly Ends[]): Set<string> {
  const fan = new Map<string, Set<string>>();
  for (const e of edges) if (e.src !== e.dst) (fan.get(e.src) ?? fan.set(e.src, new Set()).get(e.src))?.add(e.dst);
  return new Set([...fan].filter(([, to]) => to.size >= FAN).map(([k]) => k));
}

/** Those of `fans` that feed `FAN` or more members of one of `runs` past its first. */
function feeding(runs: readonly string[][], edges: readonly Ends[], fans: ReadonlySet<string>): Set<string> {
  const at = new Map<string, number>();
  runs.forEach((run, i) => run.forEach((k, j) => j > 0 && at.set(k, i)));
  const count = new Map<string, number>();
  const out = new Set<string>();
  for (const e of edges) {
    const i = at.get(e.dst);
    if (!fans.has(e.src) || i === undefined) continue;
    const id = `${e.src}\u0000${i}`;
    count.set(id, (count.get(id) ?? 0) + 1);
    if ((count.get(id) ?? 0) >= FAN) out.add(e.src);
  }
  return out;
}

/**
 * The chains of `keys` (in order): runs linked by an edge that is its source's only way out and
 * its target's only way in, the edges from `skip` (broadcasters) not counted.
 */
export function chains(keys: readonly string[], edges: readonly Ends[], skip: ReadonlySet<string> = new Set()): string[][] {
  const outs = new Map<string, string[]>();
  const ins = new Map<string, string[]>();
  for (const e of edges) {
    if (e.src === e.dst || skip.has(e.src)) continue;
    (outs.get(e.src) ?? outs.set(e.src, []).get(e.src))?.push(e.dst);
    (ins.get(e.dst) ?? ins.set(e.dst, []).get(e.dst))?.push(e.src);
  }
  const link = (u: string): string | null => {
    const o = outs.get(u);
    const v = o && o.length === 1 ? (o[0] as string) : null;
    return v !== null && ins.get(v)?.length === 1 ? v : null;
  };
  const continues = (v: string): boolean => {
    const i = ins.get(v);
    return i?.length === 1 && link(i[0] as string) === v;
  };
  const seen = new Set<string>();
  const out: string[][] = [];
  const walk = (head: string): void => {
    const run = [head];
    seen.add(head);
    for (let v = link(head); v !== null && !seen.has(v); v = link(v)) {
      run.push(v);
      seen.add(v);
    }
    out.push(run);
  };
  for (const k of keys) if (!seen.has(k) && !continues(k)) walk(k);
  for (const k of keys) if (!seen.has(k)) walk(k); // a ring: no head, start anywhere
  return out;
}

/** What dagre would make of a graph of node `id` alone. */
function place(g: InstanceType<typeof dagre.graphlib.Graph>, id: string): void {
  const n = g.node(id) as Box;
  Object.assign(n, { x: MARGIN + n.width / 2, y: MARGIN + n.height / 2 });
  Object.assign(g.graph() as object, { width: n.width + 2 * MARGIN, height: n.height + 2 * MARGIN });
}

/**
 * How a chain of `n` nodes `colW` wide and `height` tall stacks: in columns of `rows`, read top
 * to bottom, left to right, as many as make it about `aspect` times wider than tall.
 */
function grid(n: number, colW: number, height: number, aspect: number): { rows: number; cols: number } {
  const fit = Math.ceil(Math.sqrt((n * (colW + COL_GAP)) / (aspect * (height + RANK_SEP))));
  const rows = n < WRAP ? n : Math.min(n, Math.max(MIN_ROWS, fit));
  return { rows, cols: Math.ceil(n / rows) };
}

/** The boxes of a chain's members inside `p`, the box dagre gave the whole chain. */
function stack(run: readonly string[], p: Box, shape: { rows: number; cols: number }, widths: ReadonlyMap<string, number>, height: number, boxes: Map<string, Box>): void {
  const { rows, cols } = shape;
  const colW = (p.width - (cols - 1) * COL_GAP) / cols;
  run.forEach((k, j) => {
    const col = Math.floor(j / rows);
    boxes.set(k, {
      x: p.x - p.width / 2 + col * (colW + COL_GAP) + colW / 2,
      y: p.y - p.height / 2 + (j % rows) * (height + RANK_SEP) + height / 2,
      width: widths.get(k) ?? 0,
      height,
    });
  });
}

/** An edge between neighbours of a chain: straight down, or round to the next column's top. */
function link(a: Box, b: Box): Point[] {
  const bottom = { x: a.x, y: a.y + a.height / 2 };
  const top = { x: b.x, y: b.y - b.height / 2 };
  if (b.x === a.x && b.y > a.y) return [bottom, top];
  const below = bottom.y + RANK_SEP / 3;
  const above = top.y - RANK_SEP / 3;
  const side = b.x > a.x ? (a.x + a.width / 2 + b.x - b.width / 2) / 2 : Math.max(a.x + a.width / 2, b.x + b.width / 2) + COL_GAP / 2;
  return [bottom, { x: a.x, y: below }, { x: side, y: below }, { x: side, y: above }, { x: b.x, y: above }, top];
}

/**
 * Lay out nodes of `widths` (all `height` tall) and `edges` top to bottom; a long chain wraps
 * into columns to be about `aspect` (the view's width / height) times wider than tall.
 */
export function layoutGraph(widths: ReadonlyMap<string, number>, edges: readonly Ends[], height: number, aspect = 1.6): Layout {
  const keys = [...widths.keys()];
  const wide = broadcasters(edges);
  const first = chains(keys, edges, wide);
  const fans = feeding(first, edges, wide);
  // the residual stream's adds stand alone: they move into the spine's column (graphspine.ts)
  const spine = new Set(edges.filter((e) => e.kind === "residual" && e.src !== e.dst).map((e) => e.dst));
  const runs = apart(fans.size === wide.size ? first : chains(keys, edges, fans), spine);
  const head = new Set(runs.map((r) => r[0] as string));
  const holder = new Map<string, string>();
  const shapes = new Map<string, { rows: number; cols: number }>();
  const g = new dagre.graphlib.Graph({ multigraph: true });
  g.setGraph({ rankdir: "TB", nodesep: NODE_SEP, ranksep: RANK_SEP, marginx: MARGIN, marginy: MARGIN });
  g.setDefaultEdgeLabel(() => ({}));
  runs.forEach((run, i) => {
    const id = `\u0001chain${i}`;
    for (const k of run) holder.set(k, run.length >= MIN_CHAIN ? id : k);
    if (run.length >= MIN_CHAIN) {
      const colW = Math.max(...run.map((k) => widths.get(k) ?? 0));
      const { rows, cols } = grid(run.length, colW, height, aspect);
      shapes.set(id, { rows, cols });
      g.setNode(id, { width: cols * colW + (cols - 1) * COL_GAP, height: rows * (height + RANK_SEP) - RANK_SEP });
    } else for (const k of run) g.setNode(k, { width: widths.get(k) ?? 0, height });
  });
  const inside = new Set<number>();
  const stubs = new Set<number>();
  edges.forEach((e, i) => {
    const s = holder.get(e.src) as string;
    const d = holder.get(e.dst) as string;
    if (e.src === e.dst) return;
    if (fans.has(e.src) && d !== e.dst && !head.has(e.dst)) stubs.add(i); // into a chain's middle
    else if (s === d && s !== e.src) inside.add(i);
    else g.setEdge(s, d, e.kind === "residual" ? { weight: SPINE_WEIGHT } : {}, String(i));
  });
  if (g.nodeCount() === 1 && g.edgeCount() === 0) place(g, g.nodes()[0] as string);
  else dagre.layout(g); // (its first call compiles: tens of ms, spared for one straight chain)
  const boxes = new Map<string, Box>();
  for (const run of runs) {
    const id = holder.get(run[0] as string) as string;
    const shape = shapes.get(id); // (none: a short run, each node dagre's own)
    if (shape) stack(run, g.node(id) as Box, shape, widths, height, boxes);
    else for (const k of run) boxes.set(k, { ...(g.node(k) as Box) });
  }
  const points = edges.map((e, i): Point[] => {
    if (e.src === e.dst) return [];
    const a = boxes.get(e.src) as Box;
    const b = boxes.get(e.dst) as Box;
    if (inside.has(i)) return link(a, b);
    if (stubs.has(i)) return [{ x: b.x - b.width / 2 - COL_GAP / 2, y: b.y }, { x: b.x - b.width / 2, y: b.y }];
    const pts = ((g.edge({ v: holder.get(e.src) as string, w: holder.get(e.dst) as string, name: String(i) }) as { points?: Point[] } | undefined)?.points ?? []).map((p) => ({ ...p }));
    // a chain's edges leave its last member and enter its first, not the stack's edge
    if (pts.length && holder.get(e.src) !== e.src && b.y > a.y) pts[0] = { x: a.x, y: a.y + a.height / 2 };
    if (pts.length && holder.get(e.dst) !== e.dst && b.y > a.y) pts[pts.length - 1] = { x: b.x, y: b.y - b.height / 2 };
    return pts;
  });
  const bounds = g.graph() as { width?: number; height?: number };
  const width = straighten(spine, boxes, edges, points, bounds.width ?? 0, RANK_SEP, MARGIN) ?? bounds.width ?? 0;
  return { boxes, points, width, height: bounds.height ?? 0 };
}

/** `runs` with each of `alone` a run of its own (the runs around it split). */
function apart(runs: string[][], alone: ReadonlySet<string>): string[][] {
  if (alone.size === 0) return runs;
  const out: string[][] = [];
  for (const run of runs) {
    let part: string[] = [];
    for (const k of run) {
      if (!alone.has(k)) {
        part.push(k);
        continue;
      }
      if (part.length) out.push(part);
      out.push([k]);
      part = [];
    }
    if (part.length) out.push(part);
  }
  return out;
}
