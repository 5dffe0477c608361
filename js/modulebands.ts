/**
 * Module bands along the memory timeline's x axis: which module was running at each point,
 * at the shallowest depth that splits the pass (no one module holds half of the points, so a
 * Llama gets `layers.0` … `layers.79`, not `model`). Pure; drawn by charts.ts.
 */
import type { Analysis } from "./protocol";

export interface ModuleRun {
  /** First and one-past-last timeline point of the run. */
  start: number;
  end: number;
  /** Short name of the module ("layers.17", "lm_head"); "" where no module at that depth ran. */
  name: string;
}

const MAX_DEPTH = 6;

/** The module at `depth` (or above it, when the call is shallower) whose call ran at point `i`. */
function moduleAt(a: Analysis, i: number, depth: number): number {
  let m = a.calls[a.timeline.call[i] ?? -1]?.module ?? -1;
  while (m >= 0 && (a.modules[m]?.depth ?? 0) > depth) m = a.modules[m]?.parent ?? -1;
  return m >= 0 && a.modules[m]?.depth === depth ? m : -1;
}

/** The last path component, with its parent's where the last is an index ("layers.17"). */
function shortName(path: string): string {
  const parts = path.split(".");
  const last = parts[parts.length - 1] ?? "";
  return /^\d+$/.test(last) && parts.length > 1 ? `${parts[parts.length - 2]}.${last}` : last;
}

function runsAt(a: Analysis, depth: number): { runs: ModuleRun[]; widest: number } {
  const n = a.timeline.bytes.length;
  const runs: ModuleRun[] = [];
  const held = new Map<number, number>();
  let prev = -2;
  for (let i = 0; i < n; i++) {
    const m = moduleAt(a, i, depth);
    if (m >= 0) held.set(m, (held.get(m) ?? 0) + 1);
    const last = runs[runs.length - 1];
    if (m === prev && last) last.end = i + 1;
    else runs.push({ start: i, end: i + 1, name: m >= 0 ? shortName(a.modules[m]?.path ?? "") : "" });
    prev = m;
  }
  return { runs, widest: Math.max(0, ...held.values()) };
}

/** The runs of modules over `a`'s timeline (see the module docstring); `[]` without calls. */
export function moduleRuns(a: Analysis): ModuleRun[] {
  const n = a.timeline.bytes.length;
  if (n === 0 || a.calls.length === 0) return [];
  let best: ModuleRun[] = [];
  for (let depth = 1; depth <= MAX_DEPTH; depth++) {
    const { runs, widest } = runsAt(a, depth);
    if (widest === 0) break;
    best = runs;
    if (widest < n / 2) break;
  }
  return best;
}
