/**
 * The header's peak line: what the peak is made of, held against a budget (the GPU's memory of
 * an analysis with `gpu=`, or one typed in), and the levers that bring it down with what each
 * gives. bf16 and int4 are the payload's own `what_if` numbers; checkpointing and FSDP are
 * estimates from the peak's split, and say so.
 */
import { gpuBudget, memoryText, type Budget } from "./budget";
import { recordedFloatBytes } from "./charts";
import { h } from "./details";
import { formatBytes } from "./format";
import { MEMORY_CATEGORIES, type Analysis, type TensorInfo } from "./protocol";

/** Short names of the memory categories in the peak line. */
const SHORT: Record<string, string> = {
  parameters: "params",
  buffers: "buffers",
  inputs: "inputs",
  gradients: "grads",
  "optimizer state": "optimizer",
  activations: "activations",
  temporaries: "temporaries",
  "KV cache (sliding window)": "KV cache (sliding)",
};

/** FSDP sizes tried, smallest first: the first that fits the budget is shown. */
const FSDP_SIZES = [2, 4, 8, 16, 32, 64, 128];

export interface Lever {
  /** "bf16", "int4", "checkpointing 80 blocks", "FSDP 8". */
  name: string;
  /** The peak with this lever. */
  bytes: number;
  /** True where the number is this view's estimate, not the analysis's own. */
  estimate: boolean;
  /** How the number is made. */
  title: string;
}

/** The peak's categories as `[short name, bytes]`, in the stacking order, zeros left out. */
export function peakSplit(a: Analysis): [string, number][] {
  const cats = a.memory.categories;
  const known = MEMORY_CATEGORIES as readonly string[];
  // then the kernel's own categories (the KV cache; a parallel trace's buffers)
  const extra = Object.keys(cats).filter((c) => !known.includes(c));
  return [...known, ...extra].filter((c) => (cats[c] ?? 0) > 0).map((c) => [SHORT[c] ?? c, cats[c] ?? 0]);
}

const ELEMENT_BYTES: Record<string, number> = {
  float64: 8, float32: 4, float16: 2, bfloat16: 2, int64: 8, int32: 4, int16: 2, int8: 1, uint8: 1, bool: 1,
};

function tensorBytes(t: TensorInfo | undefined): number {
  if (!t) return 0;
  const bpe = ELEMENT_BYTES[t.dtype.replace(/^torch\./, "")] ?? 4;
  return t.shape.reduce((p, d) => p * d, 1) * bpe;
}

/**
 * The longest run of same-type siblings (a transformer's layers): how many, and the bytes of
 * their outputs (what checkpointing keeps: each block's input is the previous one's output).
 */
export function repeatedBlocks(a: Analysis): { count: number; type: string; boundaryBytes: number } {
  let best: number[] = [];
  for (const m of a.modules) {
    const byType = new Map<string, number[]>();
    for (const c of m.children) {
      const t = a.modules[c]?.type ?? "";
      const run = byType.get(t);
      if (run) run.push(c);
      else byType.set(t, [c]);
    }
    for (const run of byType.values()) if (run.length > best.length) best = run;
  }
  let boundary = 0;
  for (const i of best) {
    const call = a.modules[i]?.calls[0];
    boundary += tensorBytes(call === undefined ? undefined : a.calls[call]?.outputs[0]);
  }
  return { count: best.length, type: a.modules[best[0] ?? 0]?.type ?? "", boundaryBytes: boundary };
}

/** What each lever gives, for an analysis whose peak splits by category. */
export function levers(a: Analysis, budget: Budget | null): Lever[] {
  const peak = a.totals.peak_bytes;
  const cats = a.memory.categories;
  const out: Lever[] = [];
  const bf16 = a.memory.whatIf.bf16?.total;
  if (bf16 !== undefined && recordedFloatBytes(a) > 2 && bf16 < peak) {
    out.push({ name: "bf16", bytes: bf16, estimate: false, title: "a.what_if(dtype='bfloat16'): weights, gradients, optimizer state and activations in bf16" });
  }
  const int4 = a.memory.whatIf.int4?.total;
  if (a.mode !== "training" && int4 !== undefined && int4 < peak) {
    out.push({ name: "int4 weights", bytes: int4, estimate: false, title: "a.what_if(weights='int4'): weight-only 4-bit quantization, activations as recorded" });
  }
  const act = cats.activations ?? 0;
  const blocks = repeatedBlocks(a);
  if (a.mode === "training" && act > 0 && blocks.count >= 2) {
    const kept = act / blocks.count + blocks.boundaryBytes;
    if (kept < act) {
      out.push({
        name: `checkpointing ${blocks.count} × ${blocks.type}`,
        bytes: peak - act + kept,
        estimate: true,
        title: `Estimate: activations at the peak (${formatBytes(act)}) become one block's share (÷ ${blocks.count}) plus each block's input (${formatBytes(blocks.boundaryBytes)}); a.plan_checkpointing() traces it.`,
      });
    }
  }
  const sharded = (cats.parameters ?? 0) + (cats.gradients ?? 0) + (cats["optimizer state"] ?? 0);
  if (sharded > 0 && !a.comms?.length) {
    const at = (n: number): number => peak - sharded * (1 - 1 / n);
    const n = FSDP_SIZES.find((k) => budget !== null && at(k) <= budget.bytes) ?? 8;
    out.push({
      name: `FSDP ${n}`,
      bytes: at(n),
      estimate: true,
      title: `Estimate: parameters, gradients and optimizer state (${formatBytes(sharded)}) sharded over ${n} GPUs, activations as they are; analyze(..., parallel={"fsdp": ${n}}) traces it.`,
    });
  }
  return out;
}

/** "fits: 45 % of H100 80 GiB" or "over H100 80 GiB by 3.2 GiB". */
export function budgetVerdict(peak: number, budget: Budget): string {
  const pct = (100 * peak) / budget.bytes;
  if (peak <= budget.bytes) return `fits: ${pct < 1 ? "< 1" : Math.round(pct)} % of ${budget.label}`;
  return `over ${budget.label} by ${formatBytes(peak - budget.bytes)}`;
}

/** The peak line (see the module docstring), with its own typed-in budget. */
export class PeakLine {
  readonly el = h("div", "mw-peakline");
  private typed: number | null = null;
  private a: Analysis | null = null;
  private input = document.createElement("input");

  constructor() {
    this.input.type = "number";
    this.input.min = "0";
    this.input.step = "any";
    this.input.placeholder = "GiB";
    this.input.className = "mw-budget-input";
    this.input.title = "A memory budget in GiB to hold the peak against (the GPU's, when analyze was given gpu=)";
    this.input.addEventListener("change", () => {
      const v = Number(this.input.value);
      this.typed = this.input.value !== "" && v > 0 ? v * 1024 ** 3 : null;
      this.render(this.a);
    });
  }

  /** The budget held against: the typed one, else the GPU's. */
  budget(a: Analysis | null): Budget | null {
    if (this.typed !== null) return { bytes: this.typed, label: memoryText(this.typed) };
    return gpuBudget(a);
  }

  render(a: Analysis | null): void {
    this.a = a;
    this.el.textContent = "";
    const split = a ? peakSplit(a) : [];
    this.el.style.display = a && a.status !== "running" && split.length ? "" : "none";
    if (!a || !split.length) return;
    const peak = a.totals.peak_bytes;
    const parts = h("span", "mw-peak-split");
    parts.append(h("span", "mw-peak-total", `peak ${formatBytes(peak)}`), document.createTextNode(" = "));
    parts.append(document.createTextNode(split.map(([n, b]) => `${n} ${formatBytes(b)}`).join(" + ")));
    const budget = this.budget(a);
    const against = h("span", "mw-budget");
    against.append(document.createTextNode("budget "), this.input);
    if (budget) {
      const fits = peak <= budget.bytes;
      against.append(h("span", fits ? "mw-fits" : "mw-over", ` ${budgetVerdict(peak, budget)}`));
    }
    this.el.append(parts, against);
    const list = levers(a, budget);
    if (!list.length) return;
    const box = h("span", "mw-levers");
    for (const l of list) {
      const fits = budget !== null && l.bytes <= budget.bytes;
      const item = h("span", `mw-lever${fits ? " mw-fits" : ""}`, `${l.name}${l.estimate ? " (est.)" : ""} → ${formatBytes(l.bytes)}${fits ? " ✓" : ""}`);
      item.title = l.title;
      box.append(item);
    }
    this.el.append(box);
  }
}
