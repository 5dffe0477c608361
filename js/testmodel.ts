/** Test helpers shared by the widget's test files. */
type Cb = (...args: unknown[]) => void;

/**
 * A model like anywidget's, for tests: records listeners, sent messages and saves, and lets a
 * test emit kernel messages and trait changes (`emit`). Like a live kernel-side widget it
 * answers the view's `hello` with `ready` (not recorded in `sent`); `alive: false` is a widget
 * restored from a saved notebook, which nothing answers.
 */
export function fakeModel(payload: unknown, { alive = true }: { alive?: boolean } = {}) {
  const traits: Record<string, unknown> = { payload };
  const listeners = new Map<string, Set<Cb>>();
  const model = {
    sent: [] as unknown[],
    hellos: 0,
    saves: 0,
    get: (k: string) => traits[k],
    set: (k: string, v: unknown) => {
      traits[k] = v;
    },
    save_changes: () => {
      model.saves += 1;
    },
    send: (c: unknown) => {
      if ((c as { type?: string }).type === "hello") {
        model.hellos += 1;
        if (alive) model.emit("msg:custom", { type: "ready" });
        return;
      }
      model.sent.push(c);
    },
    on: (e: string, cb: Cb) => {
      if (!listeners.has(e)) listeners.set(e, new Set());
      listeners.get(e)?.add(cb);
    },
    off: (e?: string | null, cb?: Cb | null) => {
      if (e && cb) listeners.get(e)?.delete(cb);
    },
    emit: (e: string, ...args: unknown[]) => {
      for (const cb of listeners.get(e) ?? []) cb(...args);
    },
    count: () => [...listeners.values()].reduce((n, s) => n + s.size, 0),
    traits,
  };
  return model;
}

