/**
 * The header (title, chips, totals), the notes under it, the error banner and the progress line
 * (with its clocks). Each renders from the analysis and the session it is given, holding only
 * its DOM.
 */
import { errorBlock, h } from "./details";
import { formatBytes, formatCount, formatExact, formatFlops } from "./format";
import { PeakLine } from "./peakline";
import type { Analysis } from "./protocol";
import { servingNote, servingTotals } from "./serving";
import type { LayerProgress } from "./rows";
import { RERUN_WAIT_MS, rerunUnanswered, type Session } from "./session";
import { stepText, stepTitle } from "./timing";
import type { Aggregate } from "./tree";

/** The parameter memory shown: its label (the dtype, if not as recorded) and its bytes. */
export interface ParamMemory {
  label: string;
  bytes: number;
  /** The peak at the precision switch's choice, when it is not "recorded". */
  peak?: { label: string; bytes: number; note: string; gradients: number; optimizerState: number };
}

export class Header {
  readonly el = h("div", "mw-header");
  /** The notes line: placed by the view under the banners, not in the header box. */
  readonly notesEl = h("div", "mw-notes");
  private titleEl = h("div", "mw-title");
  private chips = h("div", "mw-chips");
  private totalsEl = h("div", "mw-totals");
  /** The peak's split, a budget and the levers (`peakline.ts`). */
  readonly peakLine = new PeakLine();

  constructor() {
    const titleBox = h("div", "mw-titlebox");
    titleBox.append(this.titleEl, this.chips);
    this.el.append(titleBox, this.totalsEl, this.peakLine.el);
  }

  render(a: Analysis | null, rootAgg: Aggregate | undefined, params: ParamMemory): void {
    this.titleEl.textContent = a ? a.title : "meta_widget";
    this.chips.textContent = "";
    this.totalsEl.textContent = "";
    this.notesEl.textContent = "";
    this.peakLine.render(a);
    if (!a) return;
    for (const c of [a.source, a.mode, a.status]) {
      if (c) this.chips.append(h("span", `mw-chip mw-chip-${c}`, c));
    }
    for (const [label, title] of a.settings ?? []) {
      const chip = h("span", "mw-chip mw-chip-setting", label);
      chip.title = title;
      this.chips.append(chip);
    }
    for (const [label, value, title] of totals(a, rootAgg, params)) {
      const item = h("span", "mw-total");
      item.title = title;
      item.append(h("span", "mw-total-label", label), h("span", "mw-total-value", value));
      this.totalsEl.append(item);
    }
    const notes = a.notes.slice();
    const paged = a.serving && a.status !== "running" ? servingNote(a.serving) : null;
    if (paged) notes.unshift(paged);
    if (a.assumptions.length) {
      const n = a.assumptions.length;
      notes.push(
        `The trace assumed ${n} value${n > 1 ? "s" : ""} that meta tensors do not have; rows marked ≈ rest on ${n > 1 ? "them" : "it"} (see Details).`,
      );
    }
    for (const n of notes) {
      const line = h("div", "mw-note");
      line.append(h("span", "mw-info-icon", "i"), document.createTextNode(n));
      this.notesEl.append(line);
    }
  }
}

/** The header's totals as `[label, value, tooltip]`; values still being traced read "…". */
function totals(a: Analysis, rootAgg: Aggregate | undefined, params: ParamMemory): [string, string, string][] {
  const root = a.modules[0];
  const t = a.totals;
  const running = a.status === "running";
  const items: [string, string, string][] = [
    ["params", formatCount(t.params || root?.params || 0), `${formatExact(t.params || root?.params || 0)} parameters (tied counted once); trainable ${formatExact(t.trainable_params)}`],
    [
      "FLOPs",
      running ? "…" : formatFlops(t.flops || rootAgg?.flops || 0),
      "as torch.utils.flop_counter.FlopCounterMode counts them",
    ],
    [params.label, formatBytes(params.bytes), "1 KiB = 1024 bytes"],
    params.peak
      ? [params.peak.label, running ? "…" : formatBytes(params.peak.bytes), params.peak.note]
      : [
          "peak",
          running ? "…" : formatBytes(t.peak_bytes),
          a.mode === "generate"
            ? `maximum of live bytes over the whole generate() (the prefill and every decode step, the KV cache included)${a.memory.peakPhase ? ` (reached in the ${a.memory.peakPhase})` : ""}, at the recorded dtypes`
            : a.mode === "training"
            ? `maximum of live bytes over a steady training step (forward, backward, optimizer step; the optimizer state live from its start)${a.memory.peakPhase ? ` (reached in ${a.memory.peakPhase}${a.memory.peakStep ? ` of step ${a.memory.peakStep}` : ""})` : ""}, at the recorded dtypes; the first step peaks at ${formatBytes(a.memory.firstStepPeakBytes)}`
            : "maximum of live bytes over the forward pass, at the recorded dtypes",
        ],
  ];
  if (a.mode === "training") {
    const m = a.memory;
    const p = params.peak;
    const at = p ? ` (${p.label.replace(/^peak \(|\)$/g, "")})` : "";
    items.push(
      [
        `gradients${p ? " (est.)" : ""}`,
        running ? "…" : formatBytes(p ? p.gradients : m.gradientBytes),
        `gradient memory: one gradient per trainable parameter${at}`,
      ],
      [
        `optimizer state${p ? " (est.)" : ""}`,
        running ? "…" : formatBytes(p ? p.optimizerState : m.optimizerStateBytes),
        `optimizer state on the device${at}${m.optimizerHostBytes ? `; ${formatBytes(m.optimizerHostBytes)} more on the host` : ""}`,
      ],
    );
  }
  const m = a.memory;
  if (a.time && !running && m.deviceBytes > m.reservedBytes && m.reservedBytes > 0) {
    items.push([
      `on the ${a.time.gpu}`,
      formatBytes(m.deviceBytes),
      `what the GPU would hold at the peak, as nvidia-smi shows it, and what plan and max_fit hold against a budget: PyTorch's caching allocator reserved ${formatBytes(m.reservedBytes)} (the peak's tensors in its rounded blocks and segments, cuBLAS workspaces) + ${formatBytes(m.deviceBytes - m.reservedBytes)} outside it (the CUDA context; NCCL's buffers under parallel=)`,
    ]);
  }
  if (a.serving) {
    if (!running) items.push(...servingTotals(a.serving));
  } else if (a.time) items.push(["step", stepText(a.time), stepTitle(a.time)]);
  return items;
}

const NO_ANSWER =
  ` No answer from the kernel in ${RERUN_WAIT_MS / 1000} s: it is busy with another cell, or gone ` +
  "(restarted, or this notebook was reopened without it). Still waiting; if nothing comes, run the cell again.";

/** Seconds since `since` (a `now`), as the progress line writes them. */
const seconds = (now: number, since: number): string => `${(Math.max(0, now - since) / 1000).toFixed(1)} s`;

/**
 * The progress line: what the analysis waits for before its trace (the warm-up, the model's
 * build), the calls and layers recorded while tracing, the phase, the analysis of the trace, a
 * re-run waiting, the time taken. `layers`: how far the trace is through the repeated layers.
 */
export function renderProgress(el: HTMLElement, s: Session, now: number, layers: LayerProgress | null = null): void {
  const a = s.analysis;
  el.textContent = "";
  el.title = "";
  const running = a?.status === "running";
  const wait = s.wait ?? null;
  // before the trace: the kernel said what it waits for (no module tree yet)
  const before = !running && wait !== null;
  const waiting = s.rerunning && !running;
  el.style.display = running || waiting || before || s.rerunError || s.elapsedS !== null ? "" : "none";
  el.classList.toggle("mw-rerunning", s.rerunning);
  const stalled = rerunUnanswered(s, now) && !before;
  el.classList.toggle("mw-rerun-stalled", stalled);
  if (before) {
    const text = `${s.rerunning ? "Re-running · " : ""}${wait.text} · ${seconds(now, wait.since)} so far`;
    el.append(h("span", "mw-spinner"), h("span", "mw-waiting", text));
    return;
  }
  if (waiting) {
    el.append(h("span", "mw-spinner"), h("span", "", `Re-running (${s.mode})…`));
    if (stalled) el.append(h("span", "mw-rerun-error", NO_ANSWER));
    return;
  }
  if (s.rerunError && !running) {
    el.append(h("span", "mw-rerun-error", `Cannot re-run: ${s.rerunError}`));
    return;
  }
  if (!a) return;
  if (running) {
    const n = a.callCount;
    const m = s.expectedCalls;
    // `expected_calls` is estimated before the trace (one call per module that is not a
    // container): modules never called or called several times make the real count differ;
    // after the forward pass of a training step, the line says which phase runs now
    const step = s.phase === "optimizer" ? "optimizer step" : `${s.phase} pass`;
    const recorded = `${formatExact(n)} calls recorded`;
    const layersDone = layers && layers.total > 1 ? `${layers.done} of ${layers.total} layers traced · ` : "";
    const done =
      wait?.state === "analyze"
        ? `${wait.text} · ${recorded}`
        : s.phase
          ? `forward pass done (${formatExact(n)} calls) · ${step}…`
          : n === 0 && wait?.state === "trace"
            ? wait.text
            : `tracing: ${layersDone}${recorded}${m ? ` / ${formatExact(m)} expected (estimate)` : ""}`;
    const text = `${s.rerunning ? "Re-running · " : ""}${done} · ${seconds(now, s.startedAt)}`;
    el.title = [
      m ? "Expected calls are estimated before the trace as one per module; modules never called or called several times make the real count differ." : "",
      layersDone && layers ? `Layers of ${layers.label} whose forward call has ended.` : "",
    ]
      .filter(Boolean)
      .join(" ");
    const bar = h("div", "mw-progress-bar");
    const fill = h("div", "mw-progress-fill");
    fill.style.width = s.phase || wait?.state === "analyze" ? "100%" : m ? `${Math.min(100, (100 * n) / m).toFixed(1)}%` : "0%";
    bar.append(fill);
    el.append(h("span", "mw-spinner"), h("span", "", text), bar);
  } else if (s.elapsedS !== null) {
    el.append(h("span", "", `${formatExact(a.callCount)} calls recorded in ${s.elapsedS.toFixed(2)} s`));
    // the cell ran longer than the trace (the model built, the analysis made): say how long
    if (s.totalS !== undefined && s.totalS > s.elapsedS + 0.05) {
      const all = h("span", "mw-total-time", ` · ${s.totalS.toFixed(2)} s in all`);
      all.title = "From the start of analyze (or of the re-run) to the end: the model built on the meta device, traced, and its memory and FLOPs analyzed";
      el.append(all);
    }
    if (s.reran) {
      const where = h("span", "mw-in-python", " · in Python: a.widget().analysis");
      where.title =
        "This re-run is kept in the kernel as the widget's analysis: w.analysis, or a.widget().analysis for the analysis a you displayed (a itself is unchanged).";
      el.append(where);
    }
  }
}

/**
 * The progress line and its clocks: redrawn every 250 ms while an analysis runs (from its first
 * `waiting` or its `start`: the clock runs in the page, the kernel sends each state once), and once
 * when a re-run has gone unanswered for `RERUN_WAIT_MS` (`watchRerun`).
 */
export class ProgressLine {
  readonly el = h("div", "mw-progress");
  private timer: ReturnType<typeof setInterval> | null = null;
  private rerunTimer: ReturnType<typeof setTimeout> | null = null;

  /** `session`: the session to draw, read at each redraw; `layers`: the trace's layers so far. */
  constructor(
    private session: () => Session,
    private layers: () => LayerProgress | null = () => null,
  ) {}

  render(): void {
    renderProgress(this.el, this.session(), performance.now(), this.layers());
  }

  start(): void {
    this.stop();
    this.timer = setInterval(() => this.render(), 250);
  }

  watchRerun(): void {
    if (this.rerunTimer !== null) clearTimeout(this.rerunTimer);
    this.rerunTimer = setTimeout(() => {
      this.rerunTimer = null;
      this.render();
    }, RERUN_WAIT_MS);
  }

  stop(): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  destroy(): void {
    this.stop();
    if (this.rerunTimer !== null) clearTimeout(this.rerunTimer);
  }
}

/** The error banner: the explained error, and a button that shows the module in the tree. */
export function renderBanner(el: HTMLElement, a: Analysis | null, showModule: (module: number) => void): void {
  el.textContent = "";
  const err = a?.error;
  el.style.display = err ? "" : "none";
  if (!err || !a) return;
  const box = errorBlock(err);
  const call = a.calls[err.call];
  const module = call ? call.module : a.modules.findIndex((m) => m.path === err.module);
  if (module >= 0) {
    const go = h("button", "mw-btn", "Show in tree");
    go.type = "button";
    go.addEventListener("click", () => showModule(module));
    box.append(go);
  }
  el.append(box);
}
