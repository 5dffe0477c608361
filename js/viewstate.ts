/**
 * The view state: what the user did to the view (rows opened, filter, sort, selection,
 * precision, tab, depth), as `session.ts` is what the kernel did.
 *
 * `reduceView(state, action)` returns the next state and never changes the one it is given (the
 * set of open rows is copied when it changes). It touches no DOM, timer or clock, so each
 * transition is a unit test of its own (`viewstate.test.ts`); `App` (`app.ts`) dispatches the
 * actions, renders from the state and runs the side effects (redraws, the kernel's `select`).
 *
 * Actions that need the model's tree (`expandToDepth`, `revealKeys`) carry it: the tree is
 * derived from the session's analysis, not part of the view state.
 */
import type { DtypeChoice } from "./charts";
import type { Analysis } from "./protocol";
import { expandToDepth, moduleKey, revealKeys, type SortColumn, type Tree, type TreeNode } from "./tree";

/** The tabs under the table, in order, with their labels. */
export const TABS = [
  ["details", "Details"],
  ["memory", "Memory by module"],
  ["timeline", "Memory timeline"],
  ["graph", "Graph"],
  ["stages", "Stages"],
] as const;
/** Tabs shown only when the analysis has what they draw (a pipeline's ranks). */
export function tabAvailable(tab: Tab, a: Analysis | null): boolean {
  return tab !== "stages" || a?.stages !== undefined;
}
export type Tab = (typeof TABS)[number][0];

export interface Sort {
  readonly column: SortColumn;
  readonly descending: boolean;
}

export interface ViewState {
  /** Keys of the open rows (`moduleKey`, group keys). */
  readonly expanded: ReadonlySet<string>;
  /** The depth the tree opens to (the menu; the memory chart shows modules at it). */
  readonly depth: number;
  /** The depth asked for (the `depth` trait), clamped to each new model's depth. */
  readonly preferredDepth: number;
  /** The filter box's text ("" none). */
  readonly filter: string;
  readonly sort: Sort;
  /** The key of the selected row (the root's for a new model), or null. */
  readonly selectedKey: string | null;
  /** The precision switch. */
  readonly dtype: DtypeChoice;
  readonly tab: Tab;
  /** "Leave out parameters" on the timeline; null: not chosen (the view picks per model). */
  readonly leaveOut: boolean | null;
}

export type ViewAction =
  /** A new model is shown (`tree` null: none): open it to the preferred depth, select its root. */
  | { type: "model"; tree: Tree | null }
  /** The `depth` trait: the preferred depth, the tree opened to it (folded groups stay folded). */
  | { type: "preferDepth"; depth: number; tree: Tree | null }
  /** The depth menu: open to `depth`; its last entry ("all") opens folded groups too. */
  | { type: "depth"; depth: number; tree: Tree | null }
  | { type: "filter"; text: string }
  | { type: "dtype"; dtype: DtypeChoice }
  | { type: "tab"; tab: Tab }
  /** A column header: numeric columns go descending, ascending, then back to model order. */
  | { type: "sort"; column: SortColumn }
  /** Open or close one row (ignored under a filter: rows are open because of their matches). */
  | { type: "toggle"; key: string; open: boolean }
  /** Alt+click on a caret: open `node` and everything below it, every folded member too. */
  | { type: "openBelow"; node: TreeNode }
  | { type: "collapseAll"; tree: Tree | null }
  | { type: "select"; key: string }
  /** Select module row `module` from outside the table (a chart, the error banner): open what
   * hides it and clear the filter, so that its row shows. */
  | { type: "reveal"; module: number; tree: Tree }
  | { type: "leaveOut"; value: boolean };

export const DEFAULT_DEPTH = 2;

export const initialViewState: ViewState = {
  expanded: new Set(),
  depth: DEFAULT_DEPTH,
  preferredDepth: DEFAULT_DEPTH,
  filter: "",
  sort: { column: "order", descending: true },
  selectedKey: null,
  dtype: "recorded",
  tab: "details",
  leaveOut: null,
};

/** The depth of the deepest module of the tree's model (root = 0; 0 without a tree). */
export function treeDepth(tree: Tree | null): number {
  let d = 0;
  for (const m of tree?.analysis.modules ?? []) if (m.depth > d) d = m.depth;
  return d;
}

/** A new analysis is of the same model (same modules): the view state is kept. */
export function sameModel(prev: Analysis | null, a: Analysis | null): boolean {
  return (
    prev !== null &&
    a !== null &&
    prev.modules.length === a.modules.length &&
    prev.title === a.title &&
    prev.modules.every((m, i) => m.type === a.modules[i]?.type)
  );
}

/** The module a node stands for (a folded group: its first member). */
export const moduleOf = (node: TreeNode): number => (node.kind === "module" ? node.module : (node.members[0] as number));

/** The next view state after `action`; `s` is left as it is. */
export function reduceView(s: ViewState, action: ViewAction): ViewState {
  switch (action.type) {
    case "model":
      return showModel(s, action.tree);
    case "preferDepth":
      return preferDepth(s, action.depth, action.tree);
    case "depth":
      return {
        ...s,
        depth: action.depth,
        expanded: action.tree
          ? expandToDepth(action.tree, action.depth, action.depth >= treeDepth(action.tree))
          : s.expanded,
      };
    case "filter":
      return action.text === s.filter ? s : { ...s, filter: action.text };
    case "dtype":
      return action.dtype === s.dtype ? s : { ...s, dtype: action.dtype };
    case "tab":
      return action.tab === s.tab ? s : { ...s, tab: action.tab };
    case "sort":
      return { ...s, sort: nextSort(s.sort, action.column) };
    case "toggle":
      return toggle(s, action.key, action.open);
    case "openBelow":
      return s.filter.trim() ? s : { ...s, expanded: withKeys(s.expanded, keysBelow(action.node)) };
    case "collapseAll":
      return { ...s, expanded: new Set(action.tree?.root ? [action.tree.root.key] : []) };
    case "select":
      return action.key === s.selectedKey ? s : { ...s, selectedKey: action.key };
    case "reveal":
      return {
        ...s,
        expanded: withKeys(s.expanded, revealKeys(action.tree, action.module)),
        selectedKey: moduleKey(action.module),
        filter: "",
      };
    case "leaveOut":
      return { ...s, leaveOut: action.value };
  }
}

/** A new model opens to its depth with repeated layers folded, its root selected (so that the
 * details panel shows the totals). */
function showModel(s: ViewState, tree: Tree | null): ViewState {
  const depth = Math.max(1, Math.min(s.preferredDepth, treeDepth(tree)));
  return {
    ...s,
    depth,
    expanded: tree ? expandToDepth(tree, depth) : new Set(),
    selectedKey: tree?.root ? tree.root.key : null,
    tab: tabAvailable(s.tab, tree?.analysis ?? null) ? s.tab : "details",
  };
}

function preferDepth(s: ViewState, asked: number, tree: Tree | null): ViewState {
  if (!Number.isFinite(asked) || asked < 1) return s;
  const preferredDepth = Math.floor(asked);
  const depth = Math.max(1, Math.min(preferredDepth, treeDepth(tree)));
  return { ...s, preferredDepth, depth, expanded: tree ? expandToDepth(tree, depth) : s.expanded };
}

function nextSort(s: Sort, column: SortColumn): Sort {
  const numeric = column !== "name";
  if (s.column !== column) return { column, descending: numeric };
  if (s.descending === numeric) return { column, descending: !numeric };
  return { column: "order", descending: true };
}

function toggle(s: ViewState, key: string, open: boolean): ViewState {
  if (s.filter.trim() || s.expanded.has(key) === open) return s;
  const expanded = new Set(s.expanded);
  if (open) expanded.add(key);
  else expanded.delete(key);
  return { ...s, expanded };
}

function keysBelow(node: TreeNode): string[] {
  const keys: string[] = [];
  const visit = (n: TreeNode): void => {
    if (n.children.length === 0) return;
    keys.push(n.key);
    for (const c of n.children) visit(c);
  };
  visit(node);
  return keys;
}

function withKeys(expanded: ReadonlySet<string>, keys: readonly string[]): ReadonlySet<string> {
  if (keys.every((k) => expanded.has(k))) return expanded;
  return new Set([...expanded, ...keys]);
}
