/**
 * The Python <-> JS contract, typed. The wire format is documented in
 * `meta_widget/protocol.py` (its docstring is the contract); this file mirrors it.
 *
 * Decode at the boundary: `decode()` is the one function that turns a raw payload or a raw
 * custom message into typed objects. Views only ever see `Analysis` and `Message`.
 * `applyCalls()` applies an incremental `calls` message to an `Analysis` in place.
 *
 * Decoding is defensive: a missing column reads as zeros / empty lists, an unknown id as "?" /
 * `[]`, so that a partial or newer payload still renders what it can.
 */

import { type Comm, decodeComms } from "./comms";

export const VERSION = 1;

// ---------------------------------------------------------------------------------------------
// Wire types (what Python sends, before decoding)
// ---------------------------------------------------------------------------------------------

/** `[shape_id, dtype_sid, stride_id, requires_grad 0/1]` */
export type WireTensor = [number, number, number, number];
/** `[name_sid, tensor_id]` */
export type WireNamedTensor = [number, number];

export interface WireModules {
  name: number[];
  type: number[];
  parent: number[];
  params: number[];
  param_bytes: number[];
  float_params: number[];
  buffer_bytes: number[];
  own_params: WireNamedTensor[][];
}

export interface WireCalls {
  module: number[];
  parent: number[];
  flops: number[];
  self_flops: number[];
  activation_bytes: number[];
  inputs: WireNamedTensor[][];
  outputs: WireNamedTensor[][];
  /** `[[op_sid, flops], ...]` per call */
  ops: [number, number][][];
  duration_us: number[];
  error: number[];
  /** Optional (newer kernels): 1 where the call took an assumption or holds results from one. */
  assumed?: number[];
  /**
   * Optional: in training, `[[op_sid, flops], ...]` of the backward of what the call's own body
   * computed; a call's whole backward (sub-calls included) is summed here from these.
   */
  backward_ops?: [number, number][][];
}

export interface WireTimeline {
  bytes: number[];
  call: number[];
  op: number[];
  /** Optional (newer kernels): phase name sid per event (forward | backward | optimizer). */
  phase?: number[];
  /** Optional: memory category -> live bytes of it at each point (they add up to `bytes`). */
  categories?: Record<string, number[]>;
}

export interface WireErrorInfo {
  type?: string;
  message?: string;
  module?: string;
  call?: number;
  file?: string;
  line?: number;
  code?: string;
  explanation?: string;
  fix?: string;
  title?: string;
  op?: string;
}

export interface WirePayload {
  version: number;
  title: string;
  source: string;
  mode: string;
  status: string;
  strings: string[];
  shapes: number[][];
  tensors: WireTensor[];
  modules: WireModules;
  calls: WireCalls;
  timeline: WireTimeline;
  totals: Partial<Record<keyof Totals | string, number>>;
  peak: { bytes: number; call: number; module: string; op: string } | null;
  error: WireErrorInfo | null;
  notes: string[];
  assumptions?: Record<string, unknown>[];
  memory?: Record<string, unknown>;
  checkpoint?: Record<string, unknown>;
}

// ---------------------------------------------------------------------------------------------
// Decoded types (what the views use)
// ---------------------------------------------------------------------------------------------

export type Status = "structural" | "running" | "done" | "error";

export interface TensorInfo {
  /** Path into the Python structure: "args[0]", "attention_mask", "[0]", "logits", ... */
  name: string;
  shape: number[];
  dtype: string;
  stride: number[];
  requiresGrad: boolean;
}

export interface ModuleInfo {
  /** Row in `named_modules()` order. */
  index: number;
  /** Local attribute name; "" for the root. */
  name: string;
  /** Qualified name: names joined by "." from the root; "" for the root. */
  path: string;
  type: string;
  parent: number;
  depth: number;
  children: number[];
  /** Parameters in the subtree, tied ones counted once. */
  params: number;
  paramBytes: number;
  floatParams: number;
  bufferBytes: number;
  ownParams: TensorInfo[];
  /** Rows of this module's calls, in start order (filled as calls arrive). */
  calls: number[];
}

export interface OpFlops {
  op: string;
  flops: number;
}

export interface CallInfo {
  index: number;
  module: number;
  parent: number;
  /** FLOPs of this call, its sub-calls included. */
  flops: number;
  selfFlops: number;
  /** Bytes of new storage its outputs hold. */
  activationBytes: number;
  inputs: TensorInfo[];
  outputs: TensorInfo[];
  ops: OpFlops[];
  durationUs: number;
  error: boolean;
  /** The call took an assumption (a value meta tensors do not have) or uses results of one. */
  assumed: boolean;
  /** Training: FLOPs of the backward of what this call computed, its sub-calls included. */
  backwardFlops: number;
  /** Training: the backward's FLOPs by op, own body only. */
  backwardOps: OpFlops[];
}

/** Where the trace assumed a value it could not know (e.g. `if mask.all():` taken as True). */
export interface Assumption {
  kind: string;
  op: string;
  value: string;
  module: string;
  call: number;
  file: string;
  line: number;
  code: string;
  count: number;
  /** Key to override it with (`"file.py:LINE"`, `"In[8]:3"`, the module path, `"module@CALL"`). */
  site: string;
  /** The frames from the op out to the site, innermost first (`"import_utils.py:2011 in f"`). */
  stack: string[];
}

export interface Timeline {
  bytes: number[];
  call: number[];
  op: string[];
  /** Phase of each event ("forward", "backward", "optimizer"); empty when not sent. */
  phase: string[];
  /** Memory category -> its live bytes at each event (they add up to `bytes`); empty when not sent. */
  categories: Record<string, number[]>;
}

/** The seven memory categories, in the order the views stack them. */
export const MEMORY_CATEGORIES = [
  "parameters",
  "buffers",
  "inputs",
  "gradients",
  "optimizer state",
  "activations",
  "temporaries",
] as const;

export interface Memory {
  /** Bytes live at the peak by category; they add up to the peak. Empty when not sent. */
  categories: Record<string, number>;
  /** Phase name -> index of its first timeline event. */
  phases: Record<string, number>;
  peakPhase: string | null;
  gradientBytes: number;
  optimizerStateBytes: number;
  optimizerHostBytes: number;
  /**
   * The peak by category at each precision of the switch (`fp32`, `bf16`, ... ; Python's
   * `a.what_if()`): every category, `total`, and `activation_scale` (the factor activations and
   * temporaries get). Empty when not sent.
   */
  whatIf: Record<string, Record<string, number>>;
  /** What each module's subtree owns (`memory.modules`; see `ModuleMemory`). */
  modules: ModuleMemory;
}

/**
 * What each module's subtree owns, every parameter credited to its first owner (Python's
 * `meta_widget.module_memory`), so that the memory chart's bars add up to the totals.
 */
export interface ModuleMemory {
  /**
   * Row -> the part of its `paramBytes` / `floatParams` that a module outside its subtree owns
   * (GPT-2's `lm_head`: its weight is `transformer.wte`'s). Rows absent own all of theirs.
   */
  tied: Map<number, { bytes: number; floatParams: number }>;
  /** Training: gradient bytes per module row (subtree); empty when not sent (inference). */
  gradientBytes: number[];
  /** Training: optimizer-state bytes per module row (subtree); empty when not sent. */
  optimizerStateBytes: number[];
}

export interface ShapeMismatch {
  name: string;
  model: number[];
  checkpoint: number[];
}
export interface DtypeMismatch {
  name: string;
  model: string;
  checkpoint: string;
}

/** How the model's state dict and a checkpoint disagree (`payload.checkpoint`). */
export interface CheckpointDiff {
  matched: string[];
  missing: string[];
  unexpected: string[];
  shapeMismatches: ShapeMismatch[];
  dtypeMismatches: DtypeMismatch[];
  tied: { name: string; tiedTo: string }[];
  hints: string[];
  ok: boolean;
}

export interface Totals {
  params: number;
  trainable_params: number;
  flops: number;
  param_bytes: number;
  buffer_bytes: number;
  input_bytes: number;
  activation_bytes: number;
  peak_bytes: number;
}

export interface Peak {
  bytes: number;
  call: number;
  module: string;
  op: string;
}

export interface ErrorInfo {
  type: string;
  message: string;
  module: string;
  /** Row of the call that raised, or -1. */
  call: number;
  file: string;
  line: number;
  code: string;
  explanation: string;
  fix: string;
  /** Optional extras (sent by the kernel, not in protocol.py's list): a headline and the aten op. */
  title: string;
  op: string;
}

/** Dictionaries kept so that later incremental messages can be resolved (ids continue). */
export interface Dictionaries {
  strings: string[];
  shapes: number[][];
  tensors: WireTensor[];
}

export interface Analysis {
  version: number;
  title: string;
  source: string;
  mode: string;
  /** The optimizer of a training step (`null`: none) and the target device of the kernels. */
  optimizer: string | null;
  device: string;
  status: Status;
  modules: ModuleInfo[];
  /** Sparse while streaming: `calls[j]` is undefined until call j arrived. */
  calls: (CallInfo | undefined)[];
  /** How many entries of `calls` are filled. */
  callCount: number;
  timeline: Timeline;
  totals: Totals;
  peak: Peak | null;
  error: ErrorInfo | null;
  notes: string[];
  assumptions: Assumption[];
  memory: Memory;
  checkpoint: CheckpointDiff | null;
  dict: Dictionaries;
  /** A parallel trace's collectives (`analyze(..., parallel=...)`, see comms.ts). */
  comms?: Comm[];
}

export interface StartMessage {
  type: "start";
  /** An estimate made before the trace (one call per non-container module), never exact. */
  expectedCalls: number;
  payload: Analysis | null;
}
export interface CallsMessage {
  type: "calls";
  strings: string[];
  shapes: number[][];
  tensors: WireTensor[];
  /** Row indexes where the calls go, matching the columns of `calls`. */
  index: number[];
  calls: WireCalls;
}
/** A training step's forward pass is over; this phase runs now (it records no new calls). */
export interface PhaseMessage {
  type: "phase";
  phase: string;
}
export interface DoneMessage {
  type: "done";
  elapsedS: number;
}
export interface ErrorMessage {
  type: "error";
  error: ErrorInfo;
}
/** The kernel-side widget answers the view's `hello`: it is alive and can re-run. */
export interface ReadyMessage {
  type: "ready";
}
export type Message = StartMessage | CallsMessage | PhaseMessage | DoneMessage | ErrorMessage | ReadyMessage;

/** Front end -> kernel. */
/** Sent once by a view with a kernel when it mounts; the kernel-side widget answers `ready`. */
export interface HelloMessage {
  type: "hello";
}
export interface SelectMessage {
  type: "select";
  module: number;
}

/** The fixed name sets, as `meta_widget/choices.py` defines them (checked by choices.test.ts). */
export const MODES = ["inference", "training"] as const;
export const PHASES = ["forward", "backward", "optimizer"] as const;
export const DEVICES = ["cuda", "cpu", "math"] as const;
export const OPTIMIZERS = ["adamw", "adam", "sgd", "sgd-momentum"] as const;
export type Mode = (typeof MODES)[number];
export type Phase = (typeof PHASES)[number];
export type Device = (typeof DEVICES)[number];
export type Optimizer = (typeof OPTIMIZERS)[number];

/** Front end -> kernel: analyze again with these switches (`widget.RERUN_OPTIONS`). */
export interface RerunMessage {
  type: "rerun";
  mode: Mode;
  /** `null`: no optimizer (training without optimizer state). */
  optimizer: Optimizer | null;
  device: Device;
}

// ---------------------------------------------------------------------------------------------
// Decoding helpers
// ---------------------------------------------------------------------------------------------

type Obj = Record<string, unknown>;

function isObj(v: unknown): v is Obj {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}
function num(v: unknown, dflt = 0): number {
  return typeof v === "number" && Number.isFinite(v) ? v : dflt;
}
function str(v: unknown, dflt = ""): string {
  return typeof v === "string" ? v : dflt;
}
function arr<T = unknown>(v: unknown): T[] {
  return Array.isArray(v) ? (v as T[]) : [];
}
function col<T>(o: Obj, key: string, i: number, dflt: T): T {
  const c = o[key];
  if (!Array.isArray(c)) return dflt;
  const v = c[i] as T | undefined;
  return v === undefined || v === null ? dflt : v;
}

const STATUSES: readonly Status[] = ["structural", "running", "done", "error"];

function resolveTensor(d: Dictionaries, name: string, tid: number): TensorInfo {
  const t = d.tensors[tid];
  if (!t) return { name, shape: [], dtype: "?", stride: [], requiresGrad: false };
  return {
    name,
    shape: d.shapes[t[0]] ?? [],
    dtype: d.strings[t[1]] ?? "?",
    stride: d.shapes[t[2]] ?? [],
    requiresGrad: t[3] === 1,
  };
}

function resolveNamed(d: Dictionaries, list: unknown): TensorInfo[] {
  return arr<unknown>(list).map((pair) => {
    const p = arr<number>(pair);
    return resolveTensor(d, d.strings[num(p[0])] ?? "?", num(p[1], -1));
  });
}

function decodeError(raw: unknown): ErrorInfo | null {
  if (!isObj(raw)) return null;
  return {
    type: str(raw.type, "Error"),
    message: str(raw.message),
    module: str(raw.module),
    call: num(raw.call, -1),
    file: str(raw.file),
    line: num(raw.line, 0),
    code: str(raw.code),
    explanation: str(raw.explanation),
    fix: str(raw.fix),
    title: str(raw.title),
    op: str(raw.op),
  };
}

function decodeAssumption(o: Obj): Assumption {
  const v = o.value;
  return {
    kind: str(o.kind),
    op: str(o.op),
    value: typeof v === "string" ? v : v === undefined || v === null ? "" : JSON.stringify(v),
    module: str(o.module),
    call: num(o.call, -1),
    file: str(o.file),
    line: num(o.line, 0),
    code: str(o.code),
    count: num(o.count, 1),
    site: str(o.site),
    stack: arr<unknown>(o.stack).map((x) => str(x)),
  };
}

/** `{name: [number]}`, anything else left out. */
function decodeSeries(raw: unknown): Record<string, number[]> {
  const out: Record<string, number[]> = {};
  if (!isObj(raw)) return out;
  for (const [name, values] of Object.entries(raw)) {
    if (Array.isArray(values)) out[name] = values.map((v) => num(v));
  }
  return out;
}

function decodeMemory(raw: unknown): Memory {
  const m = isObj(raw) ? raw : {};
  const nums = (v: unknown): Record<string, number> => {
    const out: Record<string, number> = {};
    if (isObj(v)) for (const [k, x] of Object.entries(v)) if (typeof x === "number") out[k] = x;
    return out;
  };
  return {
    categories: nums(m.categories),
    phases: nums(m.phases),
    peakPhase: typeof m.peak_phase === "string" ? m.peak_phase : null,
    gradientBytes: num(m.gradient_bytes),
    optimizerStateBytes: num(m.optimizer_state_bytes),
    optimizerHostBytes: num(m.optimizer_host_bytes),
    whatIf: isObj(m.what_if)
      ? Object.fromEntries(Object.entries(m.what_if).filter(([, v]) => isObj(v)).map(([k, v]) => [k, nums(v)]))
      : {},
    modules: decodeModuleMemory(m.modules),
  };
}

function decodeModuleMemory(raw: unknown): ModuleMemory {
  const m = isObj(raw) ? raw : {};
  const tied = new Map<number, { bytes: number; floatParams: number }>();
  for (const t of arr<unknown>(m.tied)) {
    const [row, bytes, floatParams] = arr<unknown>(t).map((x) => num(x));
    if (row !== undefined) tied.set(row, { bytes: bytes ?? 0, floatParams: floatParams ?? 0 });
  }
  const column = (v: unknown): number[] => arr<unknown>(v).map((x) => num(x));
  return { tied, gradientBytes: column(m.gradient_bytes), optimizerStateBytes: column(m.optimizer_state_bytes) };
}

function decodeCheckpoint(raw: unknown): CheckpointDiff | null {
  if (!isObj(raw)) return null;
  const names = (v: unknown): string[] => arr<unknown>(v).map((x) => str(x));
  const shape = (v: unknown): number[] => arr<unknown>(v).map((x) => num(x));
  const missing = names(raw.missing);
  const unexpected = names(raw.unexpected);
  const shapeMismatches = arr<unknown>(raw.shape_mismatches)
    .filter(isObj)
    .map((o) => ({ name: str(o.name), model: shape(o.model), checkpoint: shape(o.checkpoint) }));
  return {
    matched: names(raw.matched),
    missing,
    unexpected,
    shapeMismatches,
    dtypeMismatches: arr<unknown>(raw.dtype_mismatches)
      .filter(isObj)
      .map((o) => ({ name: str(o.name), model: str(o.model), checkpoint: str(o.checkpoint) })),
    tied: arr<unknown>(raw.tied)
      .filter(isObj)
      .map((o) => ({ name: str(o.name), tiedTo: str(o.tied_to) })),
    hints: names(raw.hints),
    ok:
      typeof raw.ok === "boolean"
        ? raw.ok
        : missing.length === 0 && unexpected.length === 0 && shapeMismatches.length === 0,
  };
}

function decodeCallRow(d: Dictionaries, c: Obj, i: number, index: number): CallInfo {
  return {
    index,
    module: num(col(c, "module", i, -1), -1),
    parent: num(col(c, "parent", i, -1), -1),
    flops: num(col(c, "flops", i, 0)),
    selfFlops: num(col(c, "self_flops", i, 0)),
    activationBytes: num(col(c, "activation_bytes", i, 0)),
    inputs: resolveNamed(d, col(c, "inputs", i, [])),
    outputs: resolveNamed(d, col(c, "outputs", i, [])),
    ops: decodeOps(d, col(c, "ops", i, [])),
    durationUs: num(col(c, "duration_us", i, 0)),
    error: num(col(c, "error", i, 0)) === 1,
    assumed: num(col(c, "assumed", i, 0)) === 1,
    backwardFlops: 0, // summed over the tree once every call is in (sumBackward)
    backwardOps: decodeOps(d, col(c, "backward_ops", i, [])),
  };
}

function decodeOps(d: Dictionaries, raw: unknown): OpFlops[] {
  return arr<unknown>(raw).map((pair) => {
    const p = arr<number>(pair);
    return { op: d.strings[num(p[0])] ?? "?", flops: num(p[1]) };
  });
}

/**
 * Who the peak belongs to, in words: a module path (the root's title for ""), the backward of one,
 * or, outside every module call, the optimizer step or "outside any module".
 */
export function peakOwner(a: Analysis): string {
  const p = a.peak;
  const phase = a.memory.peakPhase;
  if (!p || p.call < 0) return phase === "optimizer" ? "the optimizer step" : "outside any module";
  return `${phase === "backward" ? "the backward of " : ""}${p.module || a.title}`;
}

/** Put a decoded call at its row and register it with its module (keeping start order). */
function placeCall(a: Analysis, call: CallInfo): void {
  const previous = a.calls[call.index];
  if (previous === undefined) a.callCount += 1;
  a.calls[call.index] = call;
  const m = a.modules[call.module];
  if (!m) return;
  if (previous !== undefined) {
    const old = a.modules[previous.module];
    if (old) old.calls = old.calls.filter((j) => j !== call.index);
  }
  // insert sorted: calls complete in post-order, so they do not arrive in start order
  let k = m.calls.length;
  while (k > 0 && (m.calls[k - 1] as number) > call.index) k -= 1;
  if (m.calls[k - 1] !== call.index) m.calls.splice(k, 0, call.index);
}

const ZERO_TOTALS: Totals = {
  params: 0,
  trainable_params: 0,
  flops: 0,
  param_bytes: 0,
  buffer_bytes: 0,
  input_bytes: 0,
  activation_bytes: 0,
  peak_bytes: 0,
};

/** Decode a payload (the `payload` trait or `start.payload`). `{}` or junk gives `null`. */
export function decodePayload(raw: unknown): Analysis | null {
  if (!isObj(raw) || !isObj(raw.modules)) return null;
  const dict: Dictionaries = {
    strings: arr<unknown>(raw.strings).map((s) => str(s)),
    shapes: arr<unknown>(raw.shapes).map((s) => arr<number>(s)),
    tensors: arr<WireTensor>(raw.tensors),
  };
  const m = raw.modules;
  const n = arr(m.parent).length || arr(m.type).length;
  const modules: ModuleInfo[] = [];
  for (let i = 0; i < n; i++) {
    const parent = num(col(m, "parent", i, -1), -1);
    const name = dict.strings[num(col(m, "name", i, 0))] ?? "";
    const p = parent >= 0 && parent < i ? modules[parent] : undefined;
    const mod: ModuleInfo = {
      index: i,
      name,
      path: p ? (p.path ? `${p.path}.${name}` : name) : "",
      type: dict.strings[num(col(m, "type", i, 0))] ?? "?",
      parent: p ? parent : -1,
      depth: p ? p.depth + 1 : 0,
      children: [],
      params: num(col(m, "params", i, 0)),
      paramBytes: num(col(m, "param_bytes", i, 0)),
      floatParams: num(col(m, "float_params", i, 0)),
      bufferBytes: num(col(m, "buffer_bytes", i, 0)),
      ownParams: resolveNamed(dict, col(m, "own_params", i, [])),
      calls: [],
    };
    if (p) p.children.push(i);
    modules.push(mod);
  }
  const status = str(raw.status, "done") as Status;
  const t = isObj(raw.totals) ? raw.totals : {};
  const totals = { ...ZERO_TOTALS };
  for (const key of Object.keys(ZERO_TOTALS) as (keyof Totals)[]) totals[key] = num(t[key]);
  const tl = isObj(raw.timeline) ? raw.timeline : {};
  const peak = isObj(raw.peak)
    ? {
        bytes: num(raw.peak.bytes),
        call: num(raw.peak.call, -1),
        module: str(raw.peak.module),
        op: str(raw.peak.op),
      }
    : null;
  const a: Analysis = {
    version: num(raw.version, VERSION),
    title: str(raw.title, modules[0]?.type ?? "model"),
    source: str(raw.source),
    mode: str(raw.mode, "inference"),
    optimizer: raw.optimizer === null ? null : str(raw.optimizer, "adamw"),
    device: str(raw.device, "cuda"),
    status: STATUSES.includes(status) ? status : "done",
    modules,
    calls: [],
    callCount: 0,
    timeline: {
      bytes: arr<unknown>(tl.bytes).map((b) => num(b)),
      call: arr<unknown>(tl.call).map((c) => num(c, -1)),
      op: arr<unknown>(tl.op).map((o) => dict.strings[num(o)] ?? "?"),
      phase: arr<unknown>(tl.phase).map((o) => dict.strings[num(o)] ?? "?"),
      categories: decodeSeries(tl.categories),
    },
    totals,
    peak,
    error: decodeError(raw.error),
    notes: arr<unknown>(raw.notes).map((s) => str(s)),
    assumptions: arr<unknown>(raw.assumptions).filter(isObj).map(decodeAssumption),
    memory: decodeMemory(raw.memory),
    checkpoint: decodeCheckpoint(raw.checkpoint),
    dict,
    comms: decodeComms(raw.comms),
  };
  const c = isObj(raw.calls) ? raw.calls : {};
  const nc = arr(c.module).length;
  for (let j = 0; j < nc; j++) placeCall(a, decodeCallRow(dict, c, j, j));
  sumBackward(a.calls);
  return a;
}

/**
 * Each call's `backwardFlops` from the wire's own-body `backward_ops`: its own plus its
 * sub-calls' (a sub-call starts after its parent, so children come later in the list).
 */
function sumBackward(calls: (CallInfo | undefined)[]): void {
  for (let i = calls.length - 1; i >= 0; i--) {
    const c = calls[i];
    if (!c) continue;
    for (const o of c.backwardOps) c.backwardFlops += o.flops;
    const parent = calls[c.parent];
    if (parent) parent.backwardFlops += c.backwardFlops;
  }
}

/** Decode one custom message from the kernel. Unknown or malformed messages give `null`. */
export function decodeMessage(raw: unknown): Message | null {
  if (!isObj(raw)) return null;
  switch (raw.type) {
    case "start":
      return {
        type: "start",
        expectedCalls: num(raw.expected_calls, 0),
        payload: decodePayload(raw.payload),
      };
    case "calls": {
      const calls = (isObj(raw.calls) ? raw.calls : {}) as unknown as WireCalls & { index?: number[] };
      return {
        type: "calls",
        strings: arr<unknown>(raw.strings).map((s) => str(s)),
        shapes: arr<unknown>(raw.shapes).map((s) => arr<number>(s)),
        tensors: arr<WireTensor>(raw.tensors),
        index: arr<unknown>(calls.index).map((i) => num(i, -1)),
        calls,
      };
    }
    case "phase":
      return typeof raw.phase === "string" ? { type: "phase", phase: raw.phase } : null;
    case "done":
      return { type: "done", elapsedS: num(raw.elapsed_s, 0) };
    case "error": {
      const error = decodeError(raw.error);
      return error ? { type: "error", error } : null;
    }
    case "ready":
      return { type: "ready" };
    default:
      return null;
  }
}

/**
 * The one decode function: a raw payload (an object with `modules`) decodes to an `Analysis`,
 * a raw message (an object with `type`) to a `Message`; anything else to `null`.
 */
export function decode(raw: unknown): Analysis | Message | null {
  if (isObj(raw) && typeof raw.type === "string") return decodeMessage(raw);
  return decodePayload(raw);
}

/**
 * Apply an incremental `calls` message: append its dictionaries to the ones received so far
 * (ids continue), then place each call at its `index` row. Mutates and returns `a`.
 */
export function applyCalls(a: Analysis, msg: CallsMessage): Analysis {
  a.dict.strings.push(...msg.strings);
  a.dict.shapes.push(...msg.shapes);
  a.dict.tensors.push(...msg.tensors);
  const c = msg.calls as unknown as Obj;
  for (let i = 0; i < msg.index.length; i++) {
    const index = msg.index[i] as number;
    if (index < 0) continue;
    placeCall(a, decodeCallRow(a.dict, c, i, index));
  }
  return a;
}

/** An empty analysis to stream into when `start` carried no payload. */
export function emptyAnalysis(title = "model"): Analysis {
  return decodePayload({ title, status: "running", modules: {} }) as Analysis;
}
