/**
 * Decode at the boundary: the one place where raw payloads and raw custom messages (`unknown`)
 * become the typed objects of `protocol.ts`. Views only ever see `Analysis`, `Message` and the
 * exploration payloads. `applyCalls()` applies an incremental `calls` message to an `Analysis`
 * in place.
 *
 * Decoding is defensive: a missing column reads as zeros / empty lists, an unknown id as "?" /
 * `[]`, so that a partial or newer payload still renders what it can.
 */
import { decodeComms } from "./comms";
import { decodeStages } from "./stages";
import { decodeGraph } from "./graph";
import { decodeServing } from "./serving";
import { decodeTime } from "./timing";
import {
  STATUSES,
  VERSION,
  WAIT_STATES,
  type Analysis,
  type Assumption,
  type CallColumns,
  type CallInfo,
  type CallsMessage,
  type CheckpointDiff,
  type ComparePayload,
  type Dictionaries,
  type ErrorInfo,
  type FitPayload,
  type Memory,
  type Message,
  type ModuleColumns,
  type ModuleInfo,
  type ModuleMemory,
  type OpFlops,
  type Status,
  type TensorInfo,
  type Totals,
  type WaitState,
  type WireNamedTensor,
  type WireTensor,
} from "./protocol";

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
/** A column of numbers (a junk entry reads as `dflt`). */
function nums(v: unknown, dflt = 0): number[] {
  return arr<unknown>(v).map((x) => num(x, dflt));
}
/** A column of `[[a, b], ...]` lists per row (`[name_sid, tensor_id]`, `[op_sid, flops]`). */
function pairLists(v: unknown, dfltSecond: number): [number, number][][] {
  return arr<unknown>(v).map((row) =>
    arr<unknown>(row).map((p): [number, number] => {
      const q = arr<unknown>(p);
      return [num(q[0]), num(q[1], dfltSecond)];
    }),
  );
}

/** The `calls` columns of a payload or a `calls` message, each an array (see `CallColumns`). */
export function decodeCallColumns(raw: unknown): CallColumns {
  const c = isObj(raw) ? raw : {};
  return {
    index: nums(c.index, -1),
    module: nums(c.module, -1),
    parent: nums(c.parent, -1),
    flops: nums(c.flops),
    self_flops: nums(c.self_flops),
    activation_bytes: nums(c.activation_bytes),
    inputs: pairLists(c.inputs, -1),
    outputs: pairLists(c.outputs, -1),
    ops: pairLists(c.ops, 0),
    duration_us: nums(c.duration_us),
    error: nums(c.error),
    assumed: nums(c.assumed),
    backward_ops: pairLists(c.backward_ops, 0),
    more_calls: nums(c.more_calls),
  };
}

function decodeModuleColumns(m: Obj): ModuleColumns {
  return {
    name: nums(m.name),
    type: nums(m.type),
    parent: nums(m.parent, -1),
    params: nums(m.params),
    param_bytes: nums(m.param_bytes),
    float_params: nums(m.float_params),
    buffer_bytes: nums(m.buffer_bytes),
    own_params: pairLists(m.own_params, -1),
    extra_repr: nums(m.extra_repr),
  };
}


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

function resolveNamed(d: Dictionaries, list: readonly WireNamedTensor[] | undefined): TensorInfo[] {
  return (list ?? []).map(([name, tid]) => resolveTensor(d, d.strings[name] ?? "?", tid));
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

/** `[[shape, dtype, stride, requires_grad], ...]`: the dictionary's tensors. */
function decodeTensors(raw: unknown): WireTensor[] {
  return arr<unknown>(raw).map((t): WireTensor => {
    const [shape, dtype, stride, rg] = nums(arr<unknown>(t), -1);
    return [shape ?? -1, dtype ?? -1, stride ?? -1, rg === 1 ? 1 : 0];
  });
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
  const byName = (v: unknown): Record<string, number> => {
    const out: Record<string, number> = {};
    if (isObj(v)) for (const [k, x] of Object.entries(v)) if (typeof x === "number") out[k] = x;
    return out;
  };
  return {
    categories: byName(m.categories),
    phases: byName(m.phases),
    peakPhase: typeof m.peak_phase === "string" ? m.peak_phase : null,
    peakStep: typeof m.peak_step === "number" ? m.peak_step : null,
    firstStepPeakBytes: num(m.first_step_peak_bytes),
    reservedBytes: num(m.reserved_bytes),
    deviceBytes: num(m.device_bytes),
    gradientBytes: num(m.gradient_bytes),
    optimizerStateBytes: num(m.optimizer_state_bytes),
    optimizerHostBytes: num(m.optimizer_host_bytes),
    whatIf: isObj(m.what_if)
      ? Object.fromEntries(Object.entries(m.what_if).filter(([, v]) => isObj(v)).map(([k, v]) => [k, byName(v)]))
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
  return {
    tied,
    paramBytes: column(m.param_bytes),
    floatParams: column(m.float_params),
    gradientBytes: column(m.gradient_bytes),
    optimizerStateBytes: column(m.optimizer_state_bytes),
  };
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

function decodeCallRow(d: Dictionaries, c: CallColumns, i: number, index: number): CallInfo {
  return {
    index,
    module: c.module[i] ?? -1,
    parent: c.parent[i] ?? -1,
    flops: c.flops[i] ?? 0,
    selfFlops: c.self_flops[i] ?? 0,
    activationBytes: c.activation_bytes[i] ?? 0,
    inputs: resolveNamed(d, c.inputs[i]),
    outputs: resolveNamed(d, c.outputs[i]),
    ops: decodeOps(d, c.ops[i]),
    durationUs: c.duration_us[i] ?? 0,
    error: c.error[i] === 1,
    assumed: c.assumed[i] === 1,
    backwardFlops: 0, // summed over the tree once every call is in (sumBackward)
    backwardOps: decodeOps(d, c.backward_ops[i]),
    repeats: 1 + (c.more_calls[i] ?? 0),
  };
}

function decodeOps(d: Dictionaries, list: readonly [number, number][] | undefined): OpFlops[] {
  return (list ?? []).map(([op, flops]) => ({ op: d.strings[op] ?? "?", flops }));
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
    shapes: arr<unknown>(raw.shapes).map((s) => nums(s)),
    tensors: decodeTensors(raw.tensors),
  };
  const m = decodeModuleColumns(raw.modules);
  const n = m.parent.length || m.type.length;
  const modules: ModuleInfo[] = [];
  for (let i = 0; i < n; i++) {
    const parent = m.parent[i] ?? -1;
    const name = dict.strings[m.name[i] ?? 0] ?? "";
    const p = parent >= 0 && parent < i ? modules[parent] : undefined;
    const mod: ModuleInfo = {
      index: i,
      name,
      path: p ? (p.path ? `${p.path}.${name}` : name) : "",
      type: dict.strings[m.type[i] ?? 0] ?? "?",
      parent: p ? parent : -1,
      depth: p ? p.depth + 1 : 0,
      children: [],
      params: m.params[i] ?? 0,
      paramBytes: m.param_bytes[i] ?? 0,
      floatParams: m.float_params[i] ?? 0,
      bufferBytes: m.buffer_bytes[i] ?? 0,
      ownParams: resolveNamed(dict, m.own_params[i]),
      calls: [],
    };
    const extra = m.extra_repr?.[i];
    if (extra !== undefined && dict.strings[extra]) mod.extraRepr = dict.strings[extra];
    if (p) p.children.push(i);
    modules.push(mod);
  }
  const status = str(raw.status, "done");
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
    status: (STATUSES as readonly string[]).includes(status) ? (status as Status) : "done",
    modules,
    calls: [],
    callCount: 0,
    timeline: {
      event: arr<unknown>(tl.event).map((e) => num(e)),
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
    settings: arr<unknown>(raw.settings)
      .filter((x): x is unknown[] => Array.isArray(x))
      .map((x) => [str(x[0]), str(x[1])] as [string, string]),
    assumptions: arr<unknown>(raw.assumptions).filter(isObj).map(decodeAssumption),
    memory: decodeMemory(raw.memory),
    checkpoint: decodeCheckpoint(raw.checkpoint),
    dict,
    comms: decodeComms(raw.comms),
    graph: decodeGraph(raw.graph, dict),
  };
  const time = decodeTime(raw.time);
  if (time) a.time = time;
  const serving = decodeServing(raw.serving);
  if (serving) a.serving = serving;
  const stages = decodeStages(raw.stages);
  if (stages) a.stages = stages;
  const c = decodeCallColumns(raw.calls);
  for (let j = 0; j < c.module.length; j++) placeCall(a, decodeCallRow(dict, c, j, j));
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
    case "calls":
      return {
        type: "calls",
        strings: arr<unknown>(raw.strings).map((s) => str(s)),
        shapes: arr<unknown>(raw.shapes).map((s) => nums(s)),
        tensors: decodeTensors(raw.tensors),
        calls: decodeCallColumns(raw.calls),
      };
    case "phase":
      return typeof raw.phase === "string" ? { type: "phase", phase: raw.phase } : null;
    case "done":
      return { type: "done", elapsedS: num(raw.elapsed_s, 0), totalS: num(raw.total_s, 0) || undefined };
    case "error": {
      const error = decodeError(raw.error);
      return error ? { type: "error", error } : null;
    }
    case "ready":
      return { type: "ready" };
    case "waiting": {
      const state = str(raw.state);
      if (!(WAIT_STATES as readonly string[]).includes(state)) return null;
      return { type: "waiting", state: state as WaitState, text: str(raw.text), elapsedS: num(raw.elapsed_s, 0) };
    }
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
  const c = msg.calls;
  c.index.forEach((index, i) => {
    if (index >= 0) placeCall(a, decodeCallRow(a.dict, c, i, index));
  });
  return a;
}

/** An empty analysis to stream into when `start` carried no payload. */
export function emptyAnalysis(title = "model"): Analysis {
  return decodePayload({ title, status: "running", modules: {} }) as Analysis;
}

// ---------------------------------------------------------------------------------------------
// The exploration views' payloads
// ---------------------------------------------------------------------------------------------

/** The payload as sent by `meta_widget.explore.view.fit_payload`, or null when it is not one. */
export function decodeFit(raw: unknown): FitPayload | null {
  if (!isObj(raw) || typeof raw.size !== "number" || typeof raw.budget !== "number") return null;
  if (!Array.isArray(raw.history)) return null;
  const orNull = (v: unknown): number | null => (typeof v === "number" ? v : null);
  const categories: Record<string, number> = {};
  if (isObj(raw.categories)) for (const [k, v] of Object.entries(raw.categories)) categories[k] = num(v);
  return {
    title: str(raw.title, "model"),
    vary: str(raw.vary),
    size: raw.size,
    peakBytes: num(raw.peakBytes),
    nextPeakBytes: orNull(raw.nextPeakBytes),
    budget: raw.budget,
    devices: orNull(raw.devices),
    strategy: typeof raw.strategy === "string" ? raw.strategy : null,
    mode: str(raw.mode, "inference"),
    peakOwner: typeof raw.peakOwner === "string" ? raw.peakOwner : null,
    categories,
    history: raw.history.map((p): [number, number] => {
      const [size, bytes] = nums(p);
      return [size ?? 0, bytes ?? 0];
    }),
  };
}

/** Both sides' values of one number: `[a, b]`. */
function sides(v: unknown): [number, number] {
  const [a, b] = nums(v);
  return [a ?? 0, b ?? 0];
}

/** The payload as sent by `meta_widget.explore.view.comparison_payload`, or null. */
export function decodeCompare(raw: unknown): ComparePayload | null {
  if (!isObj(raw) || !Array.isArray(raw.rows) || !isObj(raw.totals)) return null;
  const totals: Record<string, [number, number]> = {};
  for (const [k, v] of Object.entries(raw.totals)) totals[k] = sides(v);
  return {
    a: str(raw.a, "a"),
    b: str(raw.b, "b"),
    totals,
    rows: raw.rows.filter(isObj).map((r) => ({
      module: str(r.module),
      depth: num(r.depth),
      type: str(r.type),
      count: num(r.count, 1),
      changed: r.changed === true,
      onlyIn: r.onlyIn === "a" || r.onlyIn === "b" ? r.onlyIn : null,
      params: sides(r.params),
      flops: sides(r.flops),
      activation_bytes: sides(r.activation_bytes),
    })),
  };
}
