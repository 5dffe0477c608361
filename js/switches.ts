/**
 * The kernel switches: mode, optimizer and target device. Changing one asks the kernel to
 * analyze again (`{type: "rerun", ...}`); without a kernel (the standalone page) they are shown
 * disabled, with a tooltip that says why. They render from the session (`session.ts`) and hold
 * no state of their own besides the DOM.
 */
import { h } from "./details";
import {
  DEVICES,
  MODES,
  OPTIMIZERS,
  type Analysis,
  type Device,
  type Mode,
  type Optimizer,
  type RerunMessage,
} from "./protocol";
import { canRerun, initialSession, type Session } from "./session";

/** What each optimizer and device is called in the menus (every name of protocol.ts has one). */
export const OPTIMIZER_LABELS: Record<Optimizer | "none", string> = {
  adamw: "AdamW",
  adam: "Adam",
  sgd: "SGD",
  "sgd-momentum": "SGD + momentum",
  none: "none",
};
export const DEVICE_LABELS: Record<Device, string> = {
  cuda: "CUDA kernels",
  cpu: "CPU",
  math: "math path",
};
const NO_KERNEL = "No kernel: this page cannot re-run the analysis (run the cell in a notebook)";
/** The generate button's tooltip: what it is, and how to leave it. */
const GENERATE_TITLE =
  "This analysis traced generate() (mode='generate'): the prefill and every decode step. Inference or training re-runs one forward pass or a training step of the same model.";
const NO_ANSWER =
  "No answer from the kernel: this widget was restored from a saved notebook, and no model in " +
  "the kernel is behind it. Run its cell again to use these switches.";

export class Switches {
  readonly el = h("div", "mw-switches");
  private modeBox = h("div", "mw-seg mw-mode");
  private generateBtn = h("button", "mw-seg-btn mw-active", "generate");
  private optimizerSel = h("select", "mw-select mw-optimizer");
  private deviceSel = h("select", "mw-select mw-device");
  private session: Session = initialSession;

  /** `onRerun` absent: no kernel, the switches are shown disabled. */
  constructor(private onRerun?: (msg: RerunMessage) => void) {
    const modeLabel = h("span", "mw-label", "Mode ");
    for (const m of MODES) {
      const b = h("button", "mw-seg-btn", m);
      b.type = "button";
      b.dataset.mode = m;
      b.addEventListener("click", this.onModeClick);
      this.modeBox.append(b);
    }
    // mode="generate" is not a switch position: shown lit, alone, while it is the analysis'
    this.generateBtn.type = "button";
    this.generateBtn.dataset.mode = "generate";
    this.generateBtn.disabled = true;
    this.generateBtn.title = GENERATE_TITLE;
    this.generateBtn.style.display = "none";
    this.modeBox.append(this.generateBtn);
    modeLabel.append(this.modeBox);
    for (const v of [...OPTIMIZERS, "none" as const]) {
      const o = h("option", "", OPTIMIZER_LABELS[v]);
      o.value = v;
      this.optimizerSel.append(o);
    }
    for (const v of DEVICES) {
      const o = h("option", "", DEVICE_LABELS[v]);
      o.value = v;
      this.deviceSel.append(o);
    }
    this.optimizerSel.setAttribute("aria-label", "Optimizer (training)");
    this.deviceSel.setAttribute("aria-label", "Target device");
    const optLabel = h("label", "mw-label", "Optimizer ");
    optLabel.append(this.optimizerSel);
    const devLabel = h("label", "mw-label", "Device ");
    devLabel.append(this.deviceSel);
    devLabel.title = "The device the memory numbers are for: it picks the attention kernel";
    this.optimizerSel.addEventListener("change", this.onSwitch);
    this.deviceSel.addEventListener("change", this.onSwitch);
    this.el.append(modeLabel, optLabel, devLabel);
    if (!onRerun) {
      this.el.classList.add("mw-no-kernel");
      this.el.title = NO_KERNEL;
      for (const el of [this.optimizerSel, this.deviceSel]) el.title = NO_KERNEL;
      for (const b of this.modeBox.querySelectorAll("button")) b.title = NO_KERNEL;
    }
  }

  /** Show the optimizer and device an analysis was run with. */
  showAnalyzed(a: Analysis): void {
    this.optimizerSel.value = a.optimizer ?? "none";
    this.deviceSel.value = a.device;
  }

  render(s: Session): void {
    this.session = s;
    const kernel = this.onRerun !== undefined;
    const off = !canRerun(s, kernel);
    const generating = s.analysis?.mode === "generate" && !s.rerunning;
    this.generateBtn.style.display = generating ? "" : "none";
    this.generateBtn.setAttribute("aria-pressed", String(generating));
    for (const b of this.modeBox.querySelectorAll<HTMLButtonElement>("button")) {
      if (b === this.generateBtn) continue;
      const on = !generating && b.dataset.mode === s.mode;
      b.classList.toggle("mw-active", on);
      b.setAttribute("aria-pressed", String(on));
      b.disabled = off;
    }
    this.optimizerSel.disabled = off || s.mode !== "training";
    this.deviceSel.disabled = off;
    if (kernel) this.optimizerSel.title = s.mode === "training" ? "" : "Used in training mode";
    this.el.classList.toggle("mw-busy", s.rerunning);
    if (kernel) this.el.title = s.kernelAlive ? "" : NO_ANSWER;
  }

  destroy(): void {
    for (const b of this.modeBox.querySelectorAll("button")) b.removeEventListener("click", this.onModeClick);
    this.optimizerSel.removeEventListener("change", this.onSwitch);
    this.deviceSel.removeEventListener("change", this.onSwitch);
  }

  private onModeClick = (e: Event): void => {
    const m = (e.currentTarget as HTMLElement).dataset.mode as Mode;
    if (m !== this.session.mode) this.request(m);
  };

  private onSwitch = (): void => this.request(this.session.mode);

  /** Send `{type: "rerun", mode, optimizer, device}` (the view shows "re-running…" until done). */
  private request(mode: Mode): void {
    if (!this.onRerun || !canRerun(this.session, true)) return;
    const opt = this.optimizerSel.value;
    this.onRerun({
      type: "rerun",
      mode,
      optimizer: opt === "none" ? null : (opt as Optimizer),
      device: this.deviceSel.value as Device,
    });
  }
}
