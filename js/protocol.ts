/**
 * The Python <-> JS contract, typed. The wire format is documented in
 * `meta_widget/views/protocol.py` (its docstring is the contract); this file mirrors it.
 *
 * Types and fixed name sets only: the decoders that make these objects from raw payloads and
 * messages are in `decode.ts` (decode at the boundary: views only ever see the types here).
 */

import type { Serving } from "./serving";
import type { Comm } from "./comms";
import type { Stages } from "./stages";
import type { StepTime } from "./timing";

export const VERSION = 1;

// ---------------------------------------------------------------------------------------------
// Wire types (what Python sends, before decoding)
// ---------------------------------------------------------------------------------------------

/** `[shape_id, dtype_sid, stride_id, requires_grad 0/1]` */
export type WireTensor = [number, number, number, number];
/** `[name_sid, tensor_id]` */
export type WireNamedTensor = [number, number];

/**
 * A `calls` column set (a payload's `calls`, or a `calls` message's), decoded: every column an
 * array, empty where the wire left it out (`OPTIONAL_COLUMNS` in protocol.py: all zero); a
 * message's also has `index`, the rows the calls go to.
 */
export interface CallColumns {
  index: number[];
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
  /** 1 where the call took an assumption or holds results from one. */
  assumed: number[];
  /**
   * Training: `[[op_sid, flops], ...]` of the backward of what the call's own body computed; a
   * call's whole backward (sub-calls included) is summed from these (`sumBackward`).
   */
  backward_ops: [number, number][][];
  /** Generate: the model's calls this record also stands for (decode steps summed); 0 elsewhere. */
  more_calls: number[];
}

/** The `modules` columns of a payload, decoded like `CallColumns`. */
export interface ModuleColumns {
  name: number[];
  type: number[];
  parent: number[];
  params: number[];
  param_bytes: number[];
  float_params: number[];
  buffer_bytes: number[];
  own_params: WireNamedTensor[][];
  /** Optional: `Module.extra_repr()` string ids (absent when no module has settings). */
  extra_repr?: number[];
}

// ---------------------------------------------------------------------------------------------
// Decoded types (what the views use)
// ---------------------------------------------------------------------------------------------

/** Where the analysis stands (`choices.Status`). */
export const STATUSES = ["structural", "running", "done", "error"] as const;
export type Status = (typeof STATUSES)[number];

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
  /** The constructor's settings (`Module.extra_repr()`: "in_features=64, out_features=10"). */
  extraRepr?: string;
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
  /** How many calls of the model this record stands for: 1, or a stretch of decode steps'
   * summed record (`mode="generate"`, `CallRecord.repeats`). */
  repeats: number;
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
  /** Each point's event number (points are a thinned subset of the events); empty when not sent. */
  event?: number[];
  bytes: number[];
  call: number[];
  op: string[];
  /** Phase of each event ("forward", "backward", "optimizer"); empty when not sent. */
  phase: string[];
  /** Memory category -> its live bytes at each event (they add up to `bytes`); empty when not sent. */
  categories: Record<string, number[]>;
}

/** The seven memory categories, in the order the views stack them (`choices.MemoryCategory`). */
export const MEMORY_CATEGORIES = [
  "parameters",
  "buffers",
  "inputs",
  "gradients",
  "optimizer state",
  "activations",
  "temporaries",
] as const;
export type MemoryCategory = (typeof MEMORY_CATEGORIES)[number];

export interface Memory {
  /** Bytes live at the peak by category; they add up to the peak. Empty when not sent. */
  categories: Record<string, number>;
  /** Phase name -> index of its first timeline event. */
  phases: Record<string, number>;
  peakPhase: string | null;
  /** Training: the step the peak is in (2: the steady state, the optimizer state live
   * throughout; 1: the first step); null for one pass. */
  peakStep: number | null;
  /** The first training step's peak alone (the peak itself for one pass). */
  firstStepPeakBytes: number;
  /** PyTorch's caching allocator's reserved peak, replayed over the trace (0: not sent). */
  reservedBytes: number;
  /** What the GPU would hold at the peak, as `nvidia-smi` shows it: the reserve, the CUDA
   * context, NCCL's buffers under `parallel=` (0: not sent). */
  deviceBytes: number;
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
 * `meta_widget.memory.modules`), so that the memory chart's bars add up to the totals.
 */
export interface ModuleMemory {
  /**
   * Row -> the parameters its subtree reaches that a module outside it owns (GPT-2's `lm_head`:
   * its weight is `transformer.wte`'s), bytes and floating-point elements on one device. Rows
   * absent own all of theirs.
   */
  tied: Map<number, { bytes: number; floatParams: number }>;
  /**
   * One rank of several (FSDP, tensor parallelism), where the tree's `paramBytes` count the whole
   * model: the parameter bytes and floating-point elements each row's subtree owns on the rank.
   * Empty when not sent: a row then owns its `paramBytes` less its `tied` part.
   */
  paramBytes: number[];
  floatParams: number[];
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
  /** Settings that change the numbers besides the mode, as badges: `[label, tooltip]`. */
  settings: [string, string][];
  assumptions: Assumption[];
  memory: Memory;
  checkpoint: CheckpointDiff | null;
  dict: Dictionaries;
  /** A parallel trace's collectives (`analyze(..., parallel=...)`, see comms.ts). */
  comms?: Comm[];
  /** A pipeline's ranks (`parallel=mw.Parallel(pp=P)`, see stages.ts): the Stages tab. */
  stages?: Stages;
  /** The step time on a GPU (`analyze(..., gpu=...)`, see timing.ts); absent without one. */
  time?: StepTime;
  /** The graph of module rows at depth 1, 2, ... unfolded (graph.ts); absent untraced. */
  graph?: GraphLevel[];
  /** `mode="generate"`: the serving view's numbers (serving.ts); absent in other modes. */
  serving?: Serving;
}

/** One edge of `payload.graph`: a tensor module `src` made and module `dst` read (graph.ts). */
export interface GraphEdgeInfo {
  src: number;
  dst: number;
  shape: number[];
  dtype: string;
  requiresGrad: boolean;
  /** The functional ops between the two modules ("add", "cat"). */
  ops: string[];
  count: number;
  /** `dst` holds a parameter `src` owns (tied weights). */
  tied: boolean;
  /** "data", "tied", "residual" (the stream into a residual add: the spine) or "cache" (an
   * entry of the KV cache the model returns). */
  kind: string;
}

/** A node of the graph that is no module: an op of module `row`'s body (graph_ops.py). */
export interface GraphOpNode {
  row: number;
  /** "attention" or "residual". */
  kind: string;
  /** Its name under the module's path: "<attention>", "<residual 2>". */
  name: string;
  /** The attention's kernel; the residual's branch ("+ self_attn"). */
  detail: string;
  flops: number;
}

/** The graph of module rows at one depth (-1: the model's inputs, -2: its outputs, -3: the KV
 * cache it returns, -4, -5, ...: `ops[0]`, `ops[1]`, ...). */
export interface GraphLevel {
  depth: number;
  nodes: number[];
  calls: number[];
  edges: GraphEdgeInfo[];
  ops: GraphOpNode[];
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
  /** The calls, their ids into the dictionaries so far; `calls.index`: the rows they go to. */
  calls: CallColumns;
}
/** A training step's forward pass is over; this phase runs now (it records no new calls). */
export interface PhaseMessage {
  type: "phase";
  phase: string;
}
export interface DoneMessage {
  type: "done";
  /** Seconds from the trace's start to its end. */
  elapsedS: number;
  /** Seconds from the cell's (or the re-run's) start: building the model, tracing, analyzing. */
  totalS?: number;
}
export interface ErrorMessage {
  type: "error";
  error: ErrorInfo;
}
/** The kernel-side widget answers the view's `hello`: it is alive and can re-run. */
export interface ReadyMessage {
  type: "ready";
}
/**
 * What a running analysis waits for now (`meta_widget/views/waiting.py`): `text` in words, the
 * state entered `elapsedS` seconds before it was sent (the warm-up: since the warm-up started).
 * The view counts the seconds on itself; the kernel sends a state once, when it enters it.
 */
export interface WaitingMessage {
  type: "waiting";
  state: WaitState;
  text: string;
  elapsedS: number;
}
/** Kernel -> front end (`choices.KernelMessage`; `decodeMessage` decodes each). */
export type Message = StartMessage | CallsMessage | PhaseMessage | DoneMessage | ErrorMessage | ReadyMessage | WaitingMessage;

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
/** The precision switch besides "recorded" (`choices.Precision`; the `what_if` keys). */
export const PRECISIONS = ["fp32", "bf16", "fp16", "int8", "int4"] as const;
export type PrecisionName = (typeof PRECISIONS)[number];
/** Message types of each direction (`choices.KernelMessage`, `choices.ViewMessage`). */
export const KERNEL_MESSAGE_TYPES = ["start", "calls", "phase", "done", "error", "ready", "waiting"] as const;
/** What a running analysis can wait for, in the order it goes through them (`choices.WaitState`). */
export const WAIT_STATES = ["warm-up", "build", "trace", "analyze"] as const;
export type WaitState = (typeof WAIT_STATES)[number];
export const VIEW_MESSAGE_TYPES = ["hello", "select", "rerun"] as const;
/** The exploration widget's views (`choices.ExploreKind`; `explore.ts`). */
export const EXPLORE_KINDS = ["fit", "compare", "plan"] as const;
export type ExploreKind = (typeof EXPLORE_KINDS)[number];
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

/** Front end -> kernel (`choices.ViewMessage`; `widget.MESSAGE_HANDLERS` has one handler each). */
export type ViewMessage = HelloMessage | SelectMessage | RerunMessage;

// ---------------------------------------------------------------------------------------------
// The exploration views' payloads (`meta_widget/explore/view.py`: `fit_payload`,
// `comparison_payload`), decoded by `decodeFit` / `decodeCompare`
// ---------------------------------------------------------------------------------------------

/** The "what fits" panel of `mw.max_fit`. */
export interface FitPayload {
  title: string;
  vary: string;
  size: number;
  peakBytes: number;
  nextPeakBytes: number | null;
  budget: number;
  devices: number | null;
  strategy: string | null;
  mode: string;
  peakOwner: string | null;
  categories: Record<string, number>;
  history: [number, number][];
}

/** The numbers each comparison row has for both sides (`comparison.NUMBERS`). */
export const COMPARE_NUMBERS = ["params", "flops", "activation_bytes"] as const;
export type CompareNumber = (typeof COMPARE_NUMBERS)[number];

/** One row of `mw.compare(a, b)`: a module (repeated layers folded), both sides' numbers. */
export type CompareRow = {
  module: string;
  depth: number;
  type: string;
  count: number;
  changed: boolean;
  onlyIn: "a" | "b" | null;
} & Record<CompareNumber, [number, number]>;

export interface ComparePayload {
  a: string;
  b: string;
  totals: Record<string, [number, number]>;
  rows: CompareRow[];
}


/** One candidate of `mw.plan` (`plan_view.plan_payload`); numbers null when not traced. */
export interface PlanCandidate {
  /** Its place in `plan.candidates`: what `{type: "open", index}` asks for. */
  index: number;
  replicate: number;
  fsdp: number;
  tp: number;
  /** Pipeline, context-parallel and expert-parallel ranks (1 or absent: none). */
  pp?: number;
  cp?: number;
  ep?: number;
  /** The pipeline's schedule and stages per rank (null or absent without a pipeline). */
  schedule?: string | null;
  virtualStages?: number;
  /** Sequence parallelism over the tensor-parallel ranks (absent: none). */
  sequenceParallel?: boolean;
  /** Activation checkpointing: none, every block whole, every block saving the ops of a
   * policy (`"selective"`), or the modules `checkpointedModules` names, each whole. */
  checkpointing: "none" | "full" | "selective" | "modules";
  /** With `checkpointing` "modules": their paths or class names (else empty). */
  checkpointedModules: string[];
  precision: string;
  microBatches: number;
  /** Rank 0's traced peak (the steady step's in training): what its tensors hold. */
  peakBytes: number | null;
  /** What rank 0's GPU holds at that peak (`nvidia-smi`): the caching allocator's reserve, the
   * CUDA context, NCCL's buffers; what `fits` holds against the budget. Null from an older
   * kernel (then the peak stands for it). */
  deviceBytes: number | null;
  fits: boolean;
  stepS: number | null;
  mfu: number | null;
  tokensPerS: number | null;
  samplesPerS: number | null;
  /** Why it was not traced, or how its trace failed. */
  error: string | null;
  /** The kernel has an analysis to open for it. */
  openable: boolean;
  /** The depths traced when its numbers came from the per-layer rule (`[2, 3, 4]`): opening it
   * traces the full depth first. Empty (or absent) when traced at full depth. */
  tracedLayers?: number[];
  /** On the Pareto front (no fitting candidate is both faster and smaller on the GPU), as the
   * kernel says it (`plan.pareto`); absent from an older kernel: the chart works it out. */
  pareto?: boolean;
  /** The GPU-hours (all devices) the plan's `tokens` tokens take on it, as the kernel says it
   * (`Plan.for_tokens`); null unpriced, absent from an older kernel. */
  gpuHours?: number | null;
}

/** The plan view of `mw.plan`. */
export interface PlanPayload {
  title: string;
  gpu: string;
  devices: number;
  mode: string;
  /** Bytes per device. */
  budget: number;
  /** Index of the fastest candidate that fits; null when none fits. */
  best: number | null;
  /** The tokens the candidates' `gpuHours` price (`Plan.for_tokens`); null: not priced. */
  tokens: number | null;
  /** What the traces said of the model as given (`Plan.notes`): shown under the verdict. */
  notes: string[];
  candidates: PlanCandidate[];
}

/** Front end -> kernel, from the plan view: show candidate `index`'s analysis (`view.OPEN`). */
export interface OpenMessage {
  type: "open";
  index: number;
}
