/**
 * The tree *model*: pure functions over a decoded `Analysis`, no DOM.
 *
 * - `aggregate`: per-module numbers from its calls (calls, FLOPs, activation bytes, error).
 * - `buildTree`: the module tree, with runs of repeated identical siblings folded into groups
 *   ("0–79 · 80 × LlamaDecoderLayer"). Identical = same class, same param count, and the same
 *   structure below (child names, classes and param counts, recursively). Only numbered
 *   siblings (ModuleList / Sequential entries, consecutive) fold.
 * - `flatten`: the rows to show, given what is expanded, a filter (ancestors of matches stay
 *   visible and open) and a sort of siblings by a column.
 * - `visibleWindow`: which of those rows are in the viewport (virtualization).
 */
import type { Analysis, ModuleInfo } from "./protocol";

// ---------------------------------------------------------------------------------------------
// Aggregates
// ---------------------------------------------------------------------------------------------

export interface Aggregate {
  /** Number of calls of this module. */
  calls: number;
  /**
   * Sum of its calls' FLOPs (each call's FLOPs include its sub-calls); in a training step, those
   * of their backward too: the FLOPs the step spends on this module.
   */
  flops: number;
  /** The part of `flops` spent in the backward pass (training). */
  backwardFlops: number;
  /** Sum over its calls of the bytes of new storage their outputs hold. */
  activationBytes: number;
  /** One of its calls raised. */
  error: boolean;
  /** One of its calls rests on an assumption (see `Analysis.assumptions`). */
  assumed: boolean;
}

export function aggregate(a: Analysis): Aggregate[] {
  const out: Aggregate[] = a.modules.map(() => ({
    calls: 0,
    flops: 0,
    backwardFlops: 0,
    activationBytes: 0,
    error: false,
    assumed: false,
  }));
  // generate() runs the model once per token: a module's output memory is one call's (the
  // largest), not the sum over hundreds of steps that no moment holds at once
  const perStep = a.mode === "generate";
  for (const c of a.calls) {
    if (!c) continue;
    const g = out[c.module];
    if (!g) continue;
    g.calls += c.repeats;
    g.flops += c.flops + c.backwardFlops;
    g.backwardFlops += c.backwardFlops;
    if (perStep) g.activationBytes = Math.max(g.activationBytes, c.activationBytes / c.repeats);
    else g.activationBytes += c.activationBytes;
    if (c.error) g.error = true;
    if (c.assumed) g.assumed = true;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Tree with folded groups
// ---------------------------------------------------------------------------------------------

export interface ModuleNode {
  kind: "module";
  key: string;
  module: number;
  children: TreeNode[];
}

export interface GroupNode {
  kind: "group";
  key: string;
  /** Module rows of the folded siblings, in order. */
  members: number[];
  /** "0–79" */
  label: string;
  type: string;
  children: ModuleNode[];
}

export type TreeNode = ModuleNode | GroupNode;

export interface Tree {
  analysis: Analysis;
  root: ModuleNode | null;
  /** Node of each module row. */
  nodes: ModuleNode[];
  /** Key of the group a module row is a member of, or null. */
  groupOf: (string | null)[];
}

export const moduleKey = (i: number): string => `m${i}`;

/**
 * A structural signature id per module: equal ids mean same class, same param count and the
 * same subtree (children names, recursively with the same rule). Computed bottom-up; children
 * come after their parent in `named_modules()` order.
 */
export function signatures(modules: readonly ModuleInfo[]): number[] {
  const ids = new Map<string, number>();
  const sig = new Array<number>(modules.length).fill(0);
  for (let i = modules.length - 1; i >= 0; i--) {
    const m = modules[i] as ModuleInfo;
    const kids = m.children.map((c) => `${(modules[c] as ModuleInfo).name}:${sig[c]}`).join(",");
    const key = `${m.type}|${m.params}|${kids}`;
    let id = ids.get(key);
    if (id === undefined) {
      id = ids.size;
      ids.set(key, id);
    }
    sig[i] = id;
  }
  return sig;
}

function groupLabel(first: string, last: string): string {
  return `${first}–${last}`;
}

function index(m: ModuleInfo): number | null {
  return /^\d+$/.test(m.name) ? Number(m.name) : null;
}

/**
 * Build the display tree; runs of at least `minRun` identical siblings with consecutive
 * numeric names (`layers.0`, `layers.1`, ...) become a group.
 */
export function buildTree(a: Analysis, minRun = 2): Tree {
  const n = a.modules.length;
  const nodes: ModuleNode[] = a.modules.map((m) => ({
    kind: "module",
    key: moduleKey(m.index),
    module: m.index,
    children: [],
  }));
  const groupOf: (string | null)[] = new Array<string | null>(n).fill(null);
  const sig = signatures(a.modules);
  for (const m of a.modules) {
    const node = nodes[m.index] as ModuleNode;
    const kids = m.children;
    let k = 0;
    while (k < kids.length) {
      let end = k + 1;
      const s = sig[kids[k] as number];
      const first = index(a.modules[kids[k] as number] as ModuleInfo);
      // only numbered siblings fold (ModuleList / Sequential entries): q_proj, k_proj, v_proj
      // stay distinct even when they are identical Linears
      if (first !== null) {
        while (
          end < kids.length &&
          sig[kids[end] as number] === s &&
          index(a.modules[kids[end] as number] as ModuleInfo) === first + (end - k)
        )
          end += 1;
      }
      if (end - k >= minRun) {
        const members = kids.slice(k, end);
        const first = a.modules[members[0] as number] as ModuleInfo;
        const last = a.modules[members[members.length - 1] as number] as ModuleInfo;
        const key = `g${first.index}`;
        for (const i of members) groupOf[i] = key;
        node.children.push({
          kind: "group",
          key,
          members,
          label: groupLabel(first.name, last.name),
          type: first.type,
          children: members.map((i) => nodes[i] as ModuleNode),
        });
      } else {
        for (let j = k; j < end; j++) node.children.push(nodes[kids[j] as number] as ModuleNode);
      }
      k = end;
    }
  }
  return { analysis: a, root: n > 0 ? (nodes[0] as ModuleNode) : null, nodes, groupOf };
}

// ---------------------------------------------------------------------------------------------
// Values of a node (module or group sum)
// ---------------------------------------------------------------------------------------------

export type SortColumn = "order" | "name" | "params" | "paramBytes" | "activationBytes" | "flops" | "time";

export interface NodeValues {
  params: number;
  paramBytes: number;
  activationBytes: number;
  /** Forward FLOPs, plus the backward's in a training step (see `Aggregate.flops`). */
  flops: number;
  backwardFlops: number;
  /** Estimated seconds on the GPU (`analysis.time`, sub-modules included); 0 without one. */
  time: number;
  calls: number;
  error: boolean;
  assumed: boolean;
}

/** `paramBytes(m)` lets the dtype switch change parameter memory. */
export function nodeValues(
  tree: Tree,
  node: TreeNode,
  aggs: readonly Aggregate[],
  paramBytes: (m: ModuleInfo) => number = (m) => m.paramBytes,
): NodeValues {
  const members = node.kind === "module" ? [node.module] : node.members;
  const v: NodeValues = {
    params: 0,
    paramBytes: 0,
    activationBytes: 0,
    flops: 0,
    backwardFlops: 0,
    time: 0,
    calls: 0,
    error: false,
    assumed: false,
  };
  const seconds = tree.analysis.time?.moduleS;
  for (const i of members) {
    v.time += seconds?.[i] ?? 0;
    const m = tree.analysis.modules[i] as ModuleInfo;
    const g = aggs[i];
    v.params += m.params;
    v.paramBytes += paramBytes(m);
    if (g) {
      v.activationBytes += g.activationBytes;
      v.flops += g.flops;
      v.backwardFlops += g.backwardFlops;
      v.calls += g.calls;
      v.error = v.error || g.error;
      v.assumed = v.assumed || g.assumed;
    }
  }
  return v;
}

export function nodeName(tree: Tree, node: TreeNode): string {
  if (node.kind === "group") return node.label;
  const m = tree.analysis.modules[node.module] as ModuleInfo;
  return m.parent < 0 ? tree.analysis.title || m.type : m.name;
}

export function nodeType(tree: Tree, node: TreeNode): string {
  if (node.kind === "group") return `${node.members.length} × ${node.type}`;
  return (tree.analysis.modules[node.module] as ModuleInfo).type;
}

/** Qualified path: "model.layers.3"; a group: "model.layers.0–79"; the root: "". */
export function nodePath(tree: Tree, node: TreeNode): string {
  const mods = tree.analysis.modules;
  if (node.kind === "module") return (mods[node.module] as ModuleInfo).path;
  const first = mods[node.members[0] as number] as ModuleInfo;
  const parent = mods[first.parent];
  const prefix = parent && parent.path ? `${parent.path}.` : "";
  return `${prefix}${node.label}`;
}

// ---------------------------------------------------------------------------------------------
// Flatten: expanded set + filter + sort -> rows
// ---------------------------------------------------------------------------------------------

export interface Row {
  node: TreeNode;
  /** Indentation level of the row (a group's members sit one level below the group). */
  level: number;
  hasChildren: boolean;
  expanded: boolean;
  /** Index of the parent row in the row list, -1 at the top. */
  parentRow: number;
  /** The row matched the filter itself (not only kept as an ancestor). */
  matched: boolean;
}

export interface FlattenOptions {
  expanded: ReadonlySet<string>;
  /** What `moduleMatcher` reads: a name or class substring, or a dotted path / glob; "" none. */
  filter?: string;
  /** Further restriction, e.g. "has been called" while streaming. */
  keep?: (m: ModuleInfo) => boolean;
  sort?: { column: SortColumn; descending: boolean };
  aggs?: readonly Aggregate[];
  paramBytes?: (m: ModuleInfo) => number;
}

/**
 * The search box's rule, case-insensitive. A query with a dot or a star is a module path:
 * `mlp.c_fc` finds `h.0.mlp.c_fc` (whole segments, from any depth), `*` stands for one
 * segment or part of one (`layers.*.mlp`, `h.*.attn.c_*`), and the last segment may be
 * unfinished while typing (`mlp.c_f`). Any other query is a substring of a module's own name
 * or of its class name (`attn`, `Linear`).
 */
export function moduleMatcher(filter: string): ((m: ModuleInfo) => boolean) | null {
  const q = filter.trim().toLowerCase();
  if (!q) return null;
  if (!q.includes(".") && !q.includes("*")) {
    return (m) => m.name.toLowerCase().includes(q) || m.type.toLowerCase().includes(q);
  }
  const glob = q
    .replace(/^\.+|\.+$/g, "")
    .split("*")
    .map((part) => part.replace(/[.+?^${}()|[\]\\]/g, "\\$&"))
    .join("[^.]*");
  const re = new RegExp(`(^|\\.)${glob}[^.]*$`);
  return (m) => re.test(m.path.toLowerCase());
}

/** Which modules match `filter`/`keep`; ancestors of a match are kept too (`visible`). */
export function filterModules(
  a: Analysis,
  filter: string | undefined,
  keep?: (m: ModuleInfo) => boolean,
): { matched: boolean[]; visible: boolean[] } | null {
  const match = moduleMatcher(filter ?? "");
  if (!match && !keep) return null;
  const matched = a.modules.map((m) => (!keep || keep(m)) && (!match || match(m)));
  const visible = matched.slice();
  for (let i = a.modules.length - 1; i > 0; i--) {
    const p = (a.modules[i] as ModuleInfo).parent;
    if (visible[i] && p >= 0) visible[p] = true;
  }
  return { matched, visible };
}

function sortValue(
  tree: Tree,
  node: TreeNode,
  column: SortColumn,
  opts: FlattenOptions,
): number | string {
  if (column === "name") return nodeName(tree, node).toLowerCase();
  if (column === "order") return 0;
  return sortNumber(tree, node, column, opts);
}

/**
 * The number a node sorts by. A container that is never called itself (a ModuleList) has no
 * FLOPs or activations of its own: it sorts by the sum of its children's, so it sorts with
 * the work it holds.
 */
function sortNumber(
  tree: Tree,
  node: TreeNode,
  column: Exclude<SortColumn, "name" | "order">,
  opts: FlattenOptions,
): number {
  const v = nodeValues(tree, node, opts.aggs ?? [], opts.paramBytes);
  if (v.calls > 0 || (column !== "flops" && column !== "activationBytes" && column !== "time")) return v[column];
  let sum = 0;
  for (const c of node.children) sum += sortNumber(tree, c, column, opts);
  return sum;
}

export function flatten(tree: Tree, opts: FlattenOptions): Row[] {
  const rows: Row[] = [];
  if (!tree.root) return rows;
  const f = filterModules(tree.analysis, opts.filter, opts.keep);
  const isVisible = (node: TreeNode): boolean =>
    !f ||
    (node.kind === "module"
      ? f.visible[node.module] === true
      : node.members.some((i) => f.visible[i]));
  const isMatched = (node: TreeNode): boolean =>
    !f ||
    (node.kind === "module"
      ? f.matched[node.module] === true
      : node.members.some((i) => f.matched[i]));
  const sort = opts.sort && opts.sort.column !== "order" ? opts.sort : null;
  // a text filter opens the ancestors of its matches; `keep` alone respects `expanded`
  const autoOpen = (opts.filter ?? "").trim() !== "";

  const visit = (node: TreeNode, level: number, parentRow: number): void => {
    let kids: TreeNode[] = node.children.filter(isVisible);
    // matches inside a folded group stay folded: its first member with a match stands for all
    if (autoOpen && node.kind === "group") kids = kids.slice(0, 1);
    // with a filter, a kept node is open when something below it is kept
    const expanded = autoOpen ? kids.length > 0 : opts.expanded.has(node.key);
    const row = rows.length;
    rows.push({
      node,
      level,
      hasChildren: node.children.length > 0,
      expanded: expanded && node.children.length > 0,
      parentRow,
      matched: isMatched(node),
    });
    if (!expanded) return;
    if (sort) {
      const keyed = kids.map((k, i) => ({ k, i, v: sortValue(tree, k, sort.column, opts) }));
      keyed.sort((x, y) => {
        const c = x.v < y.v ? -1 : x.v > y.v ? 1 : 0;
        return (sort.descending ? -c : c) || x.i - y.i;
      });
      kids = keyed.map((e) => e.k);
    }
    for (const k of kids) visit(k, level + 1, row);
  };
  if (isVisible(tree.root)) visit(tree.root, 0, -1);
  return rows;
}

/**
 * Keys to open so that every module down to `depth` (root = 0) shows. Groups stay folded
 * unless `openGroups` ("Depth: all"); either way only a group's first member opens below it,
 * so that opening a group of 80 layers shows 80 rows, one of them open, not 80 open layers.
 */
export function expandToDepth(tree: Tree, depth: number, openGroups = false): Set<string> {
  const keys = new Set<string>();
  const mods = tree.analysis.modules;
  // a later member of a folded group, or anything below one
  const later: boolean[] = new Array<boolean>(mods.length).fill(false);
  for (const m of mods) {
    const g = tree.groupOf[m.index] ?? null;
    later[m.index] = (m.parent >= 0 && later[m.parent] === true) || (g !== null && g !== `g${m.index}`);
    if (later[m.index]) continue;
    if (m.depth < depth && m.children.length > 0) keys.add(moduleKey(m.index));
    if (openGroups && g !== null && m.depth <= depth) keys.add(g);
  }
  return keys;
}

/**
 * Module `i`'s path with each folded group it sits in written as the group ("layers.0–79.mlp"
 * for "layers.3.mlp"): equal for the same module of every member, so charts can fold them.
 */
export function foldedPath(tree: Tree, i: number, labels = groupLabels(tree)): string {
  const mods = tree.analysis.modules;
  const parts: string[] = [];
  for (let j = i; j > 0; j = mods[j]?.parent ?? 0) {
    const g = tree.groupOf[j];
    parts.push(g ? (labels.get(g) ?? mods[j]?.name ?? "") : (mods[j]?.name ?? ""));
  }
  return parts.reverse().join(".");
}

/** Group key -> its label ("0–79"). */
export function groupLabels(tree: Tree): Map<string, string> {
  const out = new Map<string, string>();
  for (const n of tree.nodes) for (const c of n.children) if (c.kind === "group") out.set(c.key, c.label);
  return out;
}

/** Keys to open so that module row `i` is visible: its ancestors and the groups holding them. */
export function revealKeys(tree: Tree, i: number): string[] {
  const keys: string[] = [];
  const mods = tree.analysis.modules;
  const g = tree.groupOf[i];
  if (g) keys.push(g);
  let p = mods[i]?.parent ?? -1;
  while (p >= 0) {
    keys.push(moduleKey(p));
    const pg = tree.groupOf[p];
    if (pg) keys.push(pg);
    p = (mods[p] as ModuleInfo).parent;
  }
  return keys;
}

/** Modules at `depth`, plus shallower leaves: a frontier whose parameters add up to the total. */
export function frontier(a: Analysis, depth: number): number[] {
  return a.modules
    .filter((m) => m.depth === depth || (m.depth < depth && m.children.length === 0))
    .map((m) => m.index);
}

// ---------------------------------------------------------------------------------------------
// Virtualization
// ---------------------------------------------------------------------------------------------

export interface Window {
  /** First row to render. */
  start: number;
  /** One past the last row to render. */
  end: number;
}

/** Rows intersecting [scrollTop, scrollTop + height), widened by `overscan` rows each side. */
export function visibleWindow(
  scrollTop: number,
  height: number,
  rowHeight: number,
  total: number,
  overscan = 8,
): Window {
  if (total <= 0 || rowHeight <= 0) return { start: 0, end: 0 };
  const first = Math.floor(Math.max(0, scrollTop) / rowHeight);
  const last = Math.ceil((Math.max(0, scrollTop) + Math.max(0, height)) / rowHeight);
  return {
    start: Math.max(0, Math.min(total, first - overscan)),
    end: Math.max(0, Math.min(total, last + overscan)),
  };
}
