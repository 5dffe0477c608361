/**
 * Hand-written fixtures for the unit tests, encoded exactly as `meta_widget/views/protocol.py`
 * describes (dictionary ids, columnar modules and calls). The numbers are written by hand
 * from the model below, so tests can compare against them.
 *
 *   TinyNet (root)                      params
 *   ├─ embed   Embedding(100, 8)           800
 *   ├─ layers  ModuleList                  216
 *   │  ├─ 0    Block  ─ fc Linear(8, 8)     72 ; act ReLU
 *   │  ├─ 1    Block  ─ fc Linear(8, 8)     72 ; act ReLU
 *   │  └─ 2    Block  ─ fc Linear(8, 8)     72 ; act ReLU
 *   └─ head    Linear(8, 10)                90
 *   total                                 1106 (fp32: 4424 bytes)
 *
 * Forward on a [1, 4] int64 input: fc = 2·4·8·8 = 512 FLOPs each, head = 2·4·8·10 = 640,
 * total 3·512 + 640 = 2176. `layers` (a ModuleList) is never called; head is called twice
 * in `twice` mode (a shared module), which doubles its FLOPs.
 */

/** Mirrors `protocol.Dictionary`: interns strings, shapes, tensors; `takeNew()` for deltas. */
export class Dict {
  strings: string[] = [];
  shapes: number[][] = [];
  tensors: [number, number, number, number][] = [];
  private s = new Map<string, number>();
  private h = new Map<string, number>();
  private t = new Map<string, number>();
  private sent = [0, 0, 0];

  string(v: string): number {
    let id = this.s.get(v);
    if (id === undefined) {
      id = this.strings.length;
      this.s.set(v, id);
      this.strings.push(v);
    }
    return id;
  }
  shape(v: number[]): number {
    const k = v.join(",");
    let id = this.h.get(k);
    if (id === undefined) {
      id = this.shapes.length;
      this.h.set(k, id);
      this.shapes.push(v.slice());
    }
    return id;
  }
  tensor(shape: number[], dtype: string, stride: number[], rg: boolean): number {
    const key: [number, number, number, number] = [
      this.shape(shape),
      this.string(dtype),
      this.shape(stride),
      rg ? 1 : 0,
    ];
    const k = key.join(",");
    let id = this.t.get(k);
    if (id === undefined) {
      id = this.tensors.length;
      this.t.set(k, id);
      this.tensors.push(key);
    }
    return id;
  }
  takeNew(): { strings: string[]; shapes: number[][]; tensors: number[][] } {
    const [a, b, c] = this.sent as [number, number, number];
    const out = {
      strings: this.strings.slice(a),
      shapes: this.shapes.slice(b),
      tensors: this.tensors.slice(c),
    };
    this.sent = [this.strings.length, this.shapes.length, this.tensors.length];
    return out;
  }
}

function contiguous(shape: number[]): number[] {
  const stride = new Array<number>(shape.length).fill(1);
  for (let i = shape.length - 2; i >= 0; i--)
    stride[i] = (stride[i + 1] as number) * (shape[i + 1] as number);
  return stride;
}

interface ModSpec {
  name: string;
  type: string;
  parent: number;
  params: number;
  own: [string, number[]][];
}

interface CallSpec {
  module: number;
  parent: number;
  flops: number;
  self: number;
  act: number;
  inputs: [string, number[], string][];
  outputs: [string, number[], string][];
  ops: [string, number][];
  us: number;
  error?: boolean;
  assumed?: boolean;
}

export interface TinyOptions {
  /** Class name of the root (e.g. an XSS attempt). */
  rootType?: string;
  /** The second Block's fc raises (call 6). */
  error?: boolean;
  /** head is called twice. */
  twice?: boolean;
  /** layers.1.fc (call 6) took an assumption: `if mask.all():` taken as True. */
  assume?: boolean;
}

export function tinyModules(rootType = "TinyNet"): ModSpec[] {
  const F = "torch.float32";
  void F;
  const lin = (i: number, o: number): [string, number[]][] => [
    ["weight", [o, i]],
    ["bias", [o]],
  ];
  return [
    { name: "", type: rootType, parent: -1, params: 1106, own: [] },
    { name: "embed", type: "Embedding", parent: 0, params: 800, own: [["weight", [100, 8]]] },
    { name: "layers", type: "ModuleList", parent: 0, params: 216, own: [] },
    { name: "0", type: "Block", parent: 2, params: 72, own: [] },
    { name: "fc", type: "Linear", parent: 3, params: 72, own: lin(8, 8) },
    { name: "act", type: "ReLU", parent: 3, params: 0, own: [] },
    { name: "1", type: "Block", parent: 2, params: 72, own: [] },
    { name: "fc", type: "Linear", parent: 6, params: 72, own: lin(8, 8) },
    { name: "act", type: "ReLU", parent: 6, params: 0, own: [] },
    { name: "2", type: "Block", parent: 2, params: 72, own: [] },
    { name: "fc", type: "Linear", parent: 9, params: 72, own: lin(8, 8) },
    { name: "act", type: "ReLU", parent: 9, params: 0, own: [] },
    { name: "head", type: "Linear", parent: 0, params: 90, own: lin(8, 10) },
  ];
}

export function tinyCalls(opts: TinyOptions = {}): CallSpec[] {
  const F = "torch.float32";
  const x: [string, number[], string] = ["args[0]", [1, 4, 8], F];
  const out: [string, number[], string] = ["[0]", [1, 4, 8], F];
  const block = (m: number, parent: number): CallSpec[] => {
    const me = parent + 0; // placeholder to keep the shape of the table readable
    void me;
    return [
      { module: m, parent: 0, flops: 512, self: 0, act: 128, inputs: [x], outputs: [out], ops: [], us: 30 },
      {
        module: m + 1,
        parent: -2, // fixed below
        flops: 512,
        self: 512,
        act: 128,
        inputs: [x],
        outputs: [out],
        ops: [["aten.addmm", 512]],
        us: 12,
      },
      { module: m + 2, parent: -2, flops: 0, self: 0, act: 128, inputs: [x], outputs: [out], ops: [], us: 5 },
    ];
  };
  const calls: CallSpec[] = [
    {
      module: 0,
      parent: -1,
      flops: opts.twice ? 2816 : 2176,
      self: 0,
      act: 160,
      inputs: [["args[0]", [1, 4], "torch.int64"]],
      outputs: [["logits", [1, 4, 10], F]],
      ops: [],
      us: 100,
    },
    {
      module: 1,
      parent: 0,
      flops: 0,
      self: 0,
      act: 128,
      inputs: [["input", [1, 4], "torch.int64"]],
      outputs: [out],
      ops: [],
      us: 8,
    },
  ];
  for (const m of [3, 6, 9]) {
    const b = block(m, 0);
    const blockRow = calls.length;
    (b[1] as CallSpec).parent = blockRow;
    (b[2] as CallSpec).parent = blockRow;
    calls.push(...b);
  }
  const head: CallSpec = {
    module: 12,
    parent: 0,
    flops: 640,
    self: 640,
    act: 160,
    inputs: [x],
    outputs: [["[0]", [1, 4, 10], F]],
    ops: [["aten.addmm", 640]],
    us: 9,
  };
  calls.push(head);
  if (opts.twice) calls.push({ ...head });
  if (opts.assume) (calls[6] as CallSpec).assumed = true;
  if (opts.error) {
    // layers.1.fc raised: it is call 6 (0 root, 1 embed, 2-4 layers.0, 5 layers.1, 6 its fc)
    (calls[6] as CallSpec).error = true;
    (calls[5] as CallSpec).error = true;
    (calls[0] as CallSpec).error = true;
  }
  return calls;
}

function encodeCalls(d: Dict, calls: CallSpec[]): Record<string, unknown[]> {
  const named = (list: [string, number[], string][]): number[][] =>
    list.map(([n, shape, dtype]) => [d.string(n), d.tensor(shape, dtype, contiguous(shape), false)]);
  return {
    module: calls.map((c) => c.module),
    parent: calls.map((c) => c.parent),
    flops: calls.map((c) => c.flops),
    self_flops: calls.map((c) => c.self),
    activation_bytes: calls.map((c) => c.act),
    inputs: calls.map((c) => named(c.inputs)),
    outputs: calls.map((c) => named(c.outputs)),
    ops: calls.map((c) => c.ops.map(([op, f]) => [d.string(op), f])),
    duration_us: calls.map((c) => c.us),
    error: calls.map((c) => (c.error ? 1 : 0)),
    assumed: calls.map((c) => (c.assumed ? 1 : 0)),
  };
}

export interface TinyFixture {
  payload: Record<string, unknown>;
  /** The same trace as streamed messages: start (no calls), calls batches in post-order, done. */
  messages: Record<string, unknown>[];
}

export function tiny(opts: TinyOptions = {}): TinyFixture {
  const d = new Dict();
  const mods = tinyModules(opts.rootType);
  const modules = {
    name: mods.map((m) => d.string(m.name)),
    type: mods.map((m) => d.string(m.type)),
    parent: mods.map((m) => m.parent),
    params: mods.map((m) => m.params),
    param_bytes: mods.map((m) => m.params * 4),
    float_params: mods.map((m) => m.params),
    buffer_bytes: mods.map(() => 0),
    own_params: mods.map((m) =>
      m.own.map(([n, shape]) => [
        d.string(n),
        d.tensor(shape, "torch.float32", contiguous(shape), true),
      ]),
    ),
  };
  const calls = tinyCalls(opts);
  const error = opts.error
    ? {
        type: "RuntimeError",
        message: "mat1 and mat2 shapes cannot be multiplied (4x8 and 9x8)",
        module: "layers.1.fc",
        call: 6,
        file: "model.py",
        line: 42,
        code: "return self.fc(x)",
        explanation: "Linear expected 9 input features but got 8.",
        fix: "Make in_features match the previous layer's output.",
      }
    : null;
  const base = {
    version: 1,
    title: opts.rootType ?? "TinyNet",
    source: "module",
    mode: "inference",
    totals: {
      params: 1106,
      trainable_params: 1106,
      flops: opts.twice ? 2816 : 2176,
      param_bytes: 4424,
      buffer_bytes: 0,
      input_bytes: 32,
      activation_bytes: 1440,
      peak_bytes: 5000,
    },
    notes: ["Dropout is a no-op in inference mode."],
    assumptions: opts.assume
      ? [
          {
            kind: "truth",
            op: "aten.is_nonzero",
            value: "True",
            module: "layers.1.fc",
            call: 6,
            file: "model.py",
            line: 17,
            code: "if mask.all():",
            count: 1,
            site: "model.py:17",
          },
        ]
      : [],
  };
  // start message: modules only; dictionaries sent so far go with it
  const startDict = {
    strings: d.strings.slice(),
    shapes: d.shapes.slice(),
    tensors: d.tensors.slice(),
  };
  d.takeNew();
  const empty = encodeCalls(new Dict(), []);
  const startPayload = {
    ...base,
    status: "running",
    ...startDict,
    modules,
    calls: empty,
    timeline: { bytes: [], call: [], op: [] },
    peak: null,
    error: null,
  };
  // post-order: a call completes after its children
  const order: number[] = [];
  const visit = (j: number): void => {
    calls.forEach((c, k) => {
      if (c.parent === j) visit(k);
    });
    order.push(j);
  };
  calls.forEach((c, k) => {
    if (c.parent === -1) visit(k);
  });
  const batches = [order.slice(0, 5), order.slice(5)];
  const messages: Record<string, unknown>[] = [
    { type: "start", expected_calls: calls.length, payload: startPayload },
  ];
  for (const b of batches) {
    const cols = encodeCalls(
      d,
      b.map((j) => calls[j] as CallSpec),
    );
    messages.push({ type: "calls", ...d.takeNew(), calls: { index: b, ...cols } });
  }
  if (error) messages.push({ type: "error", error });
  messages.push({ type: "done", elapsed_s: 0.25 });

  // the final payload, encoded in one go (ids differ from the streamed ones: that's fine)
  const d2 = new Dict();
  const modules2 = {
    ...modules,
    name: mods.map((m) => d2.string(m.name)),
    type: mods.map((m) => d2.string(m.type)),
    own_params: mods.map((m) =>
      m.own.map(([n, shape]) => [
        d2.string(n),
        d2.tensor(shape, "torch.float32", contiguous(shape), true),
      ]),
    ),
  };
  const callCols = encodeCalls(d2, calls);
  const bytes = [4424 + 32, 4424 + 160, 4424 + 288, 5000, 4424 + 160];
  const payload = {
    ...base,
    status: error ? "error" : "done",
    modules: modules2,
    calls: callCols,
    timeline: {
      bytes,
      call: [1, 3, 4, 11, -1],
      op: [d2.string("aten.embedding"), d2.string("aten.addmm"), d2.string("aten.addmm"), d2.string("aten.addmm"), d2.string("free")],
    },
    peak: { bytes: 5000, call: 11, module: "head", op: "aten.addmm" },
    error,
    strings: d2.strings,
    shapes: d2.shapes,
    tensors: d2.tensors,
  };
  return { payload, messages };
}
