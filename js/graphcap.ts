/**
 * The Graph tab's cap on siblings: a module with thousands of children drawn (5,000 blocks of an
 * `nn.Sequential` opened in place, 1,000 distinct Linears that never fold) shows its first
 * `STEP` and one "… N more" node standing for the rest, which shows more when clicked. The
 * layout then handles what a reader can see, not the whole model. DOM-free.
 */
import type { GEdge, GNode, GraphModel } from "./graph";

/** Children of one module drawn before the rest become a "… N more" node. */
export const STEP = 48;
/** A tail this short is drawn rather than folded into a "more" node. */
const SLACK = 8;

/** The key of the "more" node standing for `prefix`'s hidden children. */
export const moreKey = (prefix: string): string => `${prefix}${prefix ? "." : ""}…`;

/** For each module path prefix: its children's first segments in order of appearance. */
function childOrder(nodes: readonly GNode[]): Map<string, Map<string, number>> {
  const order = new Map<string, Map<string, number>>();
  for (const n of nodes) {
    if (n.more !== null || (n.rows[0] ?? -1) < 0) continue;
    const segs = n.key.split(".");
    let prefix = "";
    for (const seg of segs) {
      let kids = order.get(prefix);
      if (!kids) order.set(prefix, (kids = new Map()));
      if (!kids.has(seg)) kids.set(seg, kids.size);
      prefix = prefix ? `${prefix}.${seg}` : seg;
    }
  }
  return order;
}

/** The shallowest prefix of `key` whose children run past what is shown, or null. */
function hiddenUnder(key: string, order: Map<string, Map<string, number>>, shown: ReadonlyMap<string, number>): string | null {
  let prefix = "";
  for (const seg of key.split(".")) {
    const kids = order.get(prefix);
    const limit = shown.get(prefix) ?? STEP;
    if (kids && kids.size > limit + SLACK && (kids.get(seg) ?? 0) >= limit) return prefix;
    prefix = prefix ? `${prefix}.${seg}` : seg;
  }
  return null;
}

function moreNode(prefix: string): GNode {
  return { key: moreKey(prefix), rows: [], label: "", type: "", repeats: 0, calls: 0, flops: 0, memory: 0, group: null, openGroup: null, peak: false, more: prefix, kind: "more", detail: "" };
}

/**
 * `g` with, under each module drawing more than `shown.get(path) ?? STEP` children, the rest
 * folded into one "… N more" node (its `more`: that module's path, "" for the root). Its
 * numbers are the hidden nodes' sums; edges to and from them run to it; edges among them are
 * left out.
 */
export function capSiblings(g: GraphModel, shown: ReadonlyMap<string, number> = new Map()): GraphModel {
  const order = childOrder(g.nodes);
  const to = new Map<string, string>();
  const out: GNode[] = [];
  const mores = new Map<string, { node: GNode; kids: Set<string>; types: Set<string> }>();
  for (const n of g.nodes) {
    const prefix = n.more === null && (n.rows[0] ?? -1) >= 0 ? hiddenUnder(n.key, order, shown) : null;
    if (prefix === null) {
      out.push(n);
      continue;
    }
    let m = mores.get(prefix);
    if (!m) {
      m = { node: moreNode(prefix), kids: new Set(), types: new Set() };
      mores.set(prefix, m);
      out.push(m.node);
    }
    const rest = prefix ? n.key.slice(prefix.length + 1) : n.key;
    m.kids.add(rest.split(".")[0] ?? rest);
    m.types.add(n.type);
    const node = m.node;
    node.rows.push(...n.rows);
    node.repeats += n.repeats;
    node.calls += n.calls;
    node.flops += n.flops;
    node.memory += n.memory;
    node.peak ||= n.peak;
    to.set(n.key, node.key);
  }
  if (mores.size === 0) return g;
  for (const { node, kids, types } of mores.values()) {
    node.label = `… ${kids.size.toLocaleString("en-US")} more`;
    node.type = types.size === 1 ? [...types][0] ?? "" : `${types.size} types`;
  }
  return { depth: g.depth, nodes: out, edges: remapEdges(g.edges, to) };
}

/** `edges` with their ends renamed by `to`, merged where they meet, the ones inside a node left out. */
function remapEdges(edges: readonly GEdge[], to: ReadonlyMap<string, string>): GEdge[] {
  const merged = new Map<string, GEdge>();
  for (const e of edges) {
    const src = to.get(e.src) ?? e.src;
    const dst = to.get(e.dst) ?? e.dst;
    if (src === dst && (src !== e.src || dst !== e.dst)) continue;
    const id = `${src}\u0000${dst}\u0000${e.tied ? 1 : 0}`;
    const have = merged.get(id);
    if (have) {
      have.count += e.count;
      for (const op of e.ops) if (!have.ops.includes(op) && have.ops.length < 6) have.ops.push(op);
    } else merged.set(id, { ...e, src, dst, ops: [...e.ops] });
  }
  return [...merged.values()];
}

/** How many of `prefix`'s children to show after its "more" node is clicked: twice as many. */
export function showMore(shown: Map<string, number>, prefix: string): void {
  shown.set(prefix, 2 * (shown.get(prefix) ?? STEP));
}
