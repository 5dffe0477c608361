/** The session reducer, one transition at a time: no DOM, no clock. */
import { describe, expect, it } from "vitest";
import { type Analysis, type Message } from "./protocol";
import { decodeMessage, decodePayload } from "./decode";
import { canRerun, initialSession, reduce, type Session } from "./session";
import { tiny } from "./testdata";

const payload = (mode = "inference"): Analysis =>
  decodePayload({ ...structuredClone(tiny().payload), mode }) as Analysis;
const msg = (m: Record<string, unknown>): Message => decodeMessage(m) as Message;
const run = (s: Session, ...events: Message[]): Session =>
  events.reduce((acc, e, i) => reduce(acc, e, 1000 * (i + 1)), s);

describe("session", () => {
  it("streams a trace: start, calls, phases, done", () => {
    const { messages } = tiny();
    const [start, ...rest] = messages.map(msg);
    let s = reduce(initialSession, start as Message, 500);
    expect(s.analysis?.status).toBe("running");
    expect(s.startedAt).toBe(500);
    expect(s.elapsedS).toBeNull();
    const calls = rest.filter((m) => m.type === "calls");
    const analysis = s.analysis;
    for (const c of calls) s = reduce(s, c, 600);
    expect(s.analysis).toBe(analysis); // calls land in place: no copy per batch
    expect(s.analysis?.callCount).toBe(payload().callCount);
    s = reduce(s, msg({ type: "phase", phase: "backward" }), 700);
    expect(s.phase).toBe("backward");
    s = reduce(s, msg({ type: "done", elapsed_s: 1.25 }), 800);
    expect(s.analysis?.status).toBe("done");
    expect(s.phase).toBeNull();
    expect(s.elapsedS).toBe(1.25);
  });

  it("takes the analyzed mode from a payload, except while a re-run of another mode is on its way", () => {
    let s = reduce(initialSession, { type: "payload", analysis: payload("training") }, 0);
    s = reduce(s, msg({ type: "ready" }), 0);
    expect(s.mode).toBe("training");
    s = reduce(s, { type: "rerun", mode: "inference", optimizer: null, device: "cuda" }, 0);
    expect(s).toMatchObject({ mode: "inference", rerunning: true, rerunError: "" });
    expect(canRerun(s, true)).toBe(false);
    s = reduce(s, { type: "payload", analysis: payload("training") }, 0);
    expect(s.mode).toBe("inference"); // the old payload's echo does not flip the switch back
  });

  it("a refused re-run keeps the analysis and says why", () => {
    let s = reduce(initialSession, { type: "payload", analysis: payload("inference") }, 0);
    s = reduce(s, msg({ type: "ready" }), 0);
    s = reduce(s, { type: "rerun", mode: "training", optimizer: "adamw", device: "cuda" }, 0);
    s = run(s, msg({ type: "error", error: { type: "RuntimeError", message: "no model in this kernel" } }));
    expect(s.rerunning).toBe(false);
    expect(s.rerunError).toBe("no model in this kernel");
    expect(s.mode).toBe("inference");
    expect(s.analysis?.status).not.toBe("error");
    expect(canRerun(s, true)).toBe(true);
    expect(canRerun(s, false)).toBe(false);
  });

  it("an error while tracing marks the analysis failed", () => {
    const [start] = tiny().messages.map(msg);
    let s = run(initialSession, start as Message);
    s = run(s, msg({ type: "error", error: { type: "RuntimeError", message: "shape mismatch" } }));
    expect(s.analysis?.status).toBe("error");
    expect(s.analysis?.error?.message).toBe("shape mismatch");
    expect(s.rerunError).toBe("");
  });

  it("a re-run that starts replaces the analysis and ends the wait on done", () => {
    let s = reduce(initialSession, { type: "payload", analysis: payload("inference") }, 0);
    const before = s.analysis;
    s = reduce(s, { type: "rerun", mode: "training", optimizer: "adamw", device: "cuda" }, 0);
    const [start, ...rest] = tiny().messages.map(msg);
    s = run(s, start as Message, ...rest);
    expect(s.analysis).not.toBe(before);
    expect(s.rerunning).toBe(false);
    expect(s.mode).toBe("training"); // asked for, and not reset by the start's payload
  });

  it("can re-run only once the kernel has answered", () => {
    let s = reduce(initialSession, { type: "payload", analysis: payload("inference") }, 0);
    expect(s.kernelAlive).toBe(false);
    expect(canRerun(s, true)).toBe(false); // restored from a saved notebook: nobody answers
    s = reduce(s, msg({ type: "ready" }), 0);
    expect(s.kernelAlive).toBe(true);
    expect(canRerun(s, true)).toBe(true);
    const streamed = run(initialSession, ...tiny().messages.map(msg)); // a stream proves it too
    expect(streamed.kernelAlive).toBe(true);
  });

  it("calls without a start stream into an empty analysis", () => {
    const calls = tiny().messages.map(msg).filter((m) => m.type === "calls");
    const s = run(initialSession, ...calls);
    expect(s.analysis?.status).toBe("running");
    expect(s.analysis?.callCount).toBe(payload().callCount);
  });
});
