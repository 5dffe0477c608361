/**
 * The details panel of the selected module (or folded group) and the error banner.
 * Built with createElement/textContent only: names, types and messages are never HTML.
 */
import {
  formatBytes,
  formatCount,
  formatDuration,
  formatExact,
  formatFlops,
  formatShape,
} from "./format";
import type { Analysis, CallInfo, ErrorInfo, ModuleInfo, TensorInfo } from "./protocol";
import { nodePath, nodeType, nodeValues, type Aggregate, type Tree, type TreeNode } from "./tree";

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  cls = "",
  text?: string,
): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

/** Copy text with the async clipboard, falling back to a hidden textarea + execCommand. */
export async function copyText(text: string): Promise<boolean> {
  try {
    if (navigator.clipboard && window.isSecureContext) {
      await navigator.clipboard.writeText(text);
      return true;
    }
  } catch {
    // fall through to the fallback: clipboard permission denied or not focused
  }
  const ta = document.createElement("textarea");
  ta.value = text;
  ta.setAttribute("readonly", "");
  ta.style.position = "fixed";
  ta.style.opacity = "0";
  document.body.append(ta);
  ta.select();
  let ok = false;
  try {
    ok = document.execCommand("copy");
  } catch {
    ok = false;
  }
  ta.remove();
  return ok;
}

function table(headers: string[], rows: (string | Node)[][], cls = ""): HTMLTableElement {
  const t = h("table", `mw-dtable ${cls}`.trim());
  const thead = h("thead");
  const tr = h("tr");
  for (const x of headers) tr.append(h("th", "", x));
  thead.append(tr);
  const tbody = h("tbody");
  for (const r of rows) {
    const row = h("tr");
    for (const c of r) {
      const td = h("td");
      if (typeof c === "string") td.textContent = c;
      else td.append(c);
      row.append(td);
    }
    tbody.append(row);
  }
  t.append(thead, tbody);
  return t;
}

function tensorTable(tensors: readonly TensorInfo[]): HTMLElement {
  if (tensors.length === 0) return h("div", "mw-muted", "no tensors");
  return table(
    ["name", "shape", "dtype", "stride", "requires_grad"],
    tensors.map((t) => [
      t.name,
      formatShape(t.shape),
      t.dtype.replace(/^torch\./, ""),
      formatShape(t.stride),
      t.requiresGrad ? "yes" : "no",
    ]),
  );
}

function kv(pairs: [string, string][]): HTMLElement {
  const dl = h("dl", "mw-kv");
  for (const [k, v] of pairs) dl.append(h("dt", "", k), h("dd", "", v));
  return dl;
}

/** A source line as tracebacks write it: "Cell In[7], line 6" (a notebook cell, as IPython
 * names it), else "path.py:6" (`explain.where_text`). */
export function whereText(file: string, line: number): string {
  if (!line) return file;
  return file.startsWith("Cell In[") ? `${file}, line ${line}` : `${file}:${line}`;
}

/** The explained error: what happened, where, why, and the fix. */
export function errorBlock(err: ErrorInfo, compact = false): HTMLElement {
  const box = h("div", "mw-error-box");
  box.setAttribute("role", "alert");
  if (err.title) box.append(h("div", "mw-error-title", err.title));
  const head = h("div", "mw-error-head");
  head.append(h("span", "mw-error-icon", "⚠"), h("strong", "", err.type || "Error"));
  if (err.message) head.append(h("span", "mw-error-msg", `: ${err.message}`));
  box.append(head);
  const where: string[] = [];
  if (err.module) where.push(`in module ${err.module}`);
  if (err.file) where.push(whereText(err.file, err.line));
  if (err.op) where.push(`op ${err.op}`);
  if (where.length) box.append(h("div", "mw-error-where", where.join(" · ")));
  if (err.code && !compact) box.append(h("pre", "mw-code", err.code));
  if (err.explanation) {
    const p = h("div", "mw-error-expl");
    p.append(h("strong", "", "Why: "), document.createTextNode(err.explanation));
    box.append(p);
  }
  if (err.fix) {
    const p = h("div", "mw-error-fix");
    p.append(h("strong", "", "Fix: "), document.createTextNode(err.fix));
    box.append(p);
  }
  return box;
}

function callBlock(a: Analysis, call: CallInfo, k: number, total: number): HTMLElement {
  const box = h("details", "mw-call");
  box.open = total <= 3 || k === 0;
  const sum = h("summary");
  const parts = [
    total > 1 ? `Call ${k + 1} of ${total}` : "Call",
    `#${call.index}`,
    call.backwardFlops
      ? `${formatFlops(call.flops)} forward + ${formatFlops(call.backwardFlops)} backward`
      : formatFlops(call.flops),
    `output mem ${formatBytes(call.activationBytes)}`,
  ];
  if (call.durationUs) parts.push(formatDuration(call.durationUs));
  sum.textContent = parts.join(" · ");
  if (call.error) sum.append(h("span", "mw-tag mw-tag-error", "raised"));
  if (call.assumed) sum.append(h("span", "mw-tag mw-tag-assumed", "assumed"));
  box.append(sum);
  if (call.error && a.error && (a.error.call === call.index || a.error.call < 0)) {
    box.append(errorBlock(a.error, true));
  }
  box.append(h("div", "mw-subhead", "Inputs"), tensorTable(call.inputs));
  box.append(h("div", "mw-subhead", "Outputs"), tensorTable(call.outputs));
  if (call.backwardOps.length) {
    // a training step: each op's forward and backward FLOPs side by side
    const both = new Map<string, [number, number]>();
    for (const o of call.ops) both.set(o.op, [o.flops, 0]);
    for (const o of call.backwardOps) {
      const [fwd, bwd] = both.get(o.op) ?? [0, 0];
      both.set(o.op, [fwd, bwd + o.flops]);
    }
    const rows = [...both].sort((x, y) => y[1][0] + y[1][1] - (x[1][0] + x[1][1]));
    box.append(
      h("div", "mw-subhead", "FLOPs by op (own body)"),
      table(
        ["op", "forward", "backward"],
        rows.map(([op, [fwd, bwd]]) => [op, fwd ? formatFlops(fwd) : "–", bwd ? formatFlops(bwd) : "–"]),
        "mw-ops",
      ),
    );
  } else if (call.ops.length) {
    const ops = call.ops.slice().sort((x, y) => y.flops - x.flops);
    box.append(
      h("div", "mw-subhead", "FLOPs by op (own body)"),
      table(
        ["op", "FLOPs", "exact"],
        ops.map((o) => [o.op, formatFlops(o.flops), formatExact(o.flops)]),
        "mw-ops",
      ),
    );
  } else {
    box.append(
      h("div", "mw-muted", `own body: ${formatFlops(call.selfFlops)} (no FLOP-counted ops)`),
    );
  }
  return box;
}

export interface DetailsContext {
  analysis: Analysis;
  tree: Tree;
  aggs: readonly Aggregate[];
  paramBytes: (m: ModuleInfo) => number;
  dtypeLabel: string;
  onCopy: (path: string) => void;
}

export function renderDetails(parent: HTMLElement, node: TreeNode | null, ctx: DetailsContext): void {
  parent.textContent = "";
  if (!node) {
    parent.append(
      h("div", "mw-muted mw-pad", "Select a module in the tree (click, or use the arrow keys)."),
    );
    return;
  }
  const a = ctx.analysis;
  const path = nodePath(ctx.tree, node);
  const shownPath = path || a.title;
  const v = nodeValues(ctx.tree, node, ctx.aggs, ctx.paramBytes);
  const head = h("div", "mw-dhead");
  const title = h("div", "mw-dtitle");
  const type = nodeType(ctx.tree, node);
  title.append(h("code", "mw-path", shownPath));
  if (type !== shownPath) title.append(h("span", "mw-mtype", type));
  head.append(title);
  if (path) {
    // the root's qualified name is "": nothing to copy
    const copy = h("button", "mw-btn", "Copy path");
    copy.type = "button";
    copy.title = "Copy the qualified module name (as in named_modules())";
    copy.addEventListener("click", () => ctx.onCopy(path));
    head.append(copy);
  }
  parent.append(head);

  const memberNote =
    node.kind === "group"
      ? `${node.members.length} identical modules folded (same class, structure and parameter count); numbers are sums. Details of the first one below.`
      : "";
  if (memberNote) parent.append(h("div", "mw-note", memberNote));
  const traced = a.status !== "structural";
  const rows: [string, string][] = [
    ["parameters", `${formatCount(v.params)} (${formatExact(v.params)})`],
    [`parameter memory (${ctx.dtypeLabel})`, formatBytes(v.paramBytes)],
  ];
  // while the trace runs, a module not called yet has no numbers but its structure's
  if (traced && !(a.status === "running" && v.calls === 0)) {
    rows.push(
      ["output mem (its outputs' new storage)", formatBytes(v.activationBytes)],
      ["FLOPs", `${formatFlops(v.flops)} (${formatExact(v.flops)})`],
      ...(v.backwardFlops
        ? ([
            ["↳ forward", formatFlops(v.flops - v.backwardFlops)],
            ["↳ backward", formatFlops(v.backwardFlops)],
          ] as [string, string][])
        : []),
      ["calls", String(v.calls)],
    );
  }
  // training: what the step keeps for this module's parameters, as the memory chart shows it
  const members = node.kind === "module" ? [node.module] : node.members;
  const own = a.memory.modules;
  const sumOf = (xs: readonly number[]): number => members.reduce((s, i) => s + (xs[i] ?? 0), 0);
  // one rank of several: the tree counts the model, the chart what the rank holds of it
  if (own.paramBytes.length) rows.push(["parameter memory a rank (recorded dtype)", formatBytes(sumOf(own.paramBytes))]);
  if (own.gradientBytes.length) rows.push(["gradients", formatBytes(sumOf(own.gradientBytes))]);
  if (own.optimizerStateBytes.length) rows.push(["optimizer state", formatBytes(sumOf(own.optimizerStateBytes))]);
  const mi = node.kind === "module" ? node.module : (node.members[0] as number);
  const m = a.modules[mi];
  // the constructor's settings, as print(model) shows them (Module.extra_repr)
  if (m?.extraRepr) rows.push(["settings", m.extraRepr]);
  parent.append(kv(rows));
  if (!m) return;
  if (m.bufferBytes) parent.append(h("div", "mw-muted", `buffers: ${formatBytes(m.bufferBytes)}`));

  if (m.ownParams.length) {
    parent.append(
      h("div", "mw-subhead", "Own parameters"),
      table(
        ["name", "shape", "dtype", "elements"],
        m.ownParams.map((p) => [
          p.name,
          formatShape(p.shape),
          p.dtype.replace(/^torch\./, ""),
          formatCount(p.shape.reduce((x, y) => x * y, 1)),
        ]),
      ),
    );
  }
  const mine = new Set(m.calls);
  const assumptions = a.assumptions.filter(
    (x) => mine.has(x.call) || (x.call < 0 && x.module === m.path),
  );
  if (assumptions.length) {
    parent.append(
      h("div", "mw-subhead", "Assumptions"),
      table(
        ["kind", "op", "assumed", "where", "times", "override with"],
        assumptions.map((x) => [
          x.kind,
          x.op,
          x.value,
          x.file ? `${x.file}:${x.line}` : x.module || a.title,
          String(x.count),
          x.site,
        ]),
      ),
    );
    for (const x of assumptions) {
      if (x.code) parent.append(h("pre", "mw-code", x.code));
      // the helpers the check went through, up to the model's line (innermost first)
      if (x.stack.length > 1) parent.append(h("pre", "mw-code", x.stack.join("\n")));
    }
  }
  const calls = m.calls.map((j) => a.calls[j]).filter((c): c is CallInfo => c !== undefined);
  if (calls.length === 0) {
    parent.append(
      h(
        "div",
        "mw-muted mw-pad",
        a.status === "structural"
          ? "No forward pass recorded: this analysis is structural (no inputs were given)."
          : a.status === "running"
            ? "Not traced yet: its shapes, output memory and FLOPs come with its calls."
            : "This module was not called during the forward pass.",
      ),
    );
    return;
  }
  parent.append(h("div", "mw-subhead", calls.length > 1 ? `${calls.length} calls` : "Call"));
  calls.forEach((c, k) => parent.append(callBlock(a, c, k, calls.length)));
}
