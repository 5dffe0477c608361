/**
 * The session: what the kernel's messages (`waiting`, `start`, `calls`, `phase`, `done`,
 * `error`), a new
 * payload from the synced trait, and the user's re-run requests do to the state the view shows.
 *
 * `reduce(session, event, now)` returns the next session. It touches no DOM, timer or clock
 * (the time comes in as `now`), so each transition is a unit test of its own, and the view
 * (`app.ts`) only renders what it is given and runs the side effects (timers, redraws).
 *
 * One thing is changed in place: the analysis a `calls` batch lands in, and its `status` and
 * `error` when the trace ends. A 25,000-module stream sends hundreds of batches, and copying the
 * payload for each would cost more than drawing it. Every event that brings a new analysis
 * (`start`, a payload) replaces the object, so "is it a new model?" is `prev.analysis !==
 * next.analysis`.
 */
import { type Analysis, type Message, type Mode, type RerunMessage, type WaitState } from "./protocol";
import { applyCalls, emptyAnalysis } from "./decode";

/** What the running analysis said it waits for (`waiting`), and since when. */
export interface Waiting {
  readonly state: WaitState;
  readonly text: string;
  /** When the state began (a `now`): its arrival less the seconds it had lasted then. */
  readonly since: number;
}

export interface Session {
  readonly analysis: Analysis | null;
  /** What the analysis waits for now; null when it said nothing or has ended. */
  readonly wait?: Waiting | null;
  /** Calls the running trace expects: an estimate sent with `start`, never exact. */
  readonly expectedCalls: number;
  /** What a running training step does after its forward pass (`backward`, `optimizer`). */
  readonly phase: string | null;
  /** When the running trace started (the `now` of its `start`). */
  readonly startedAt: number;
  /** Seconds the last trace took, from its `done`; null while none has finished. */
  readonly elapsedS: number | null;
  /** Seconds the whole analysis took (model built, traced, analyzed), from the same `done`. */
  readonly totalS?: number;
  /** The mode the switches show: the analyzed one, or the one a re-run was asked for. */
  readonly mode: Mode;
  /** A re-run was asked for, and neither its `done` nor an error has arrived. */
  readonly rerunning: boolean;
  /** When the last re-run was asked for (the `now` of its `rerun`). */
  readonly rerunAt: number;
  /** The analysis shown came from a re-run of the switches (it is `w.analysis` in Python). */
  readonly reran: boolean;
  /** Why the kernel refused the last re-run (`""`: it did not). */
  readonly rerunError: string;
  /**
   * The kernel-side widget has answered (`ready`, or any message it sent). A widget restored
   * from a saved notebook has none behind it: its `hello` is never answered, and the switches
   * stay off instead of waiting forever for a re-run nobody will do.
   */
  readonly kernelAlive: boolean;
}

/** A new payload arrived in the synced trait (null: none yet). */
export interface PayloadEvent {
  type: "payload";
  analysis: Analysis | null;
}

/** Everything that changes a session: kernel messages, payloads, the user's re-run request. */
export type SessionEvent = Message | PayloadEvent | RerunMessage;

export const initialSession: Session = {
  analysis: null,
  expectedCalls: 0,
  phase: null,
  startedAt: 0,
  elapsedS: null,
  mode: "inference",
  rerunning: false,
  rerunAt: 0,
  reran: false,
  rerunError: "",
  kernelAlive: false,
};

/** How long a re-run may go unanswered (no `start`, no error) before the view says so. */
export const RERUN_WAIT_MS = 5000;

/**
 * A re-run was asked for `RERUN_WAIT_MS` ago or more and the kernel has not started it: it is
 * busy with another cell, or gone (restarted, or the notebook was reopened without it).
 */
export function rerunUnanswered(s: Session, now: number): boolean {
  return s.rerunning && s.analysis?.status !== "running" && now - s.rerunAt >= RERUN_WAIT_MS;
}

/**
 * True when the session can ask for a re-run now: a kernel answered and nothing is running (no
 * trace, and no analysis waiting for its model or the warm-up).
 */
export function canRerun(s: Session, kernel: boolean): boolean {
  return kernel && s.kernelAlive && !s.rerunning && s.analysis?.status !== "running" && !s.wait;
}

/** The next session after `event`, at time `now` (milliseconds, any monotonic clock). */
export function reduce(s: Session, event: SessionEvent, now: number): Session {
  if (event.type !== "payload" && event.type !== "rerun" && !s.kernelAlive) {
    s = { ...s, kernelAlive: true }; // a message from the kernel: it is there
  }
  switch (event.type) {
    case "ready":
      return s;
    case "payload": {
      // a finished analysis in the trait (a structural one has no `done`): nothing to wait for
      const ended = event.analysis !== null && event.analysis.status !== "running";
      return withAnalysis(ended && s.wait ? { ...s, wait: null } : s, event.analysis);
    }
    case "waiting":
      return { ...s, wait: { state: event.state, text: event.text, since: now - event.elapsedS * 1000 } };
    case "rerun":
      return { ...s, mode: event.mode, rerunning: true, rerunAt: now, rerunError: "" };
    case "start": {
      const next = withAnalysis(s, event.payload ?? emptyAnalysis());
      (next.analysis as Analysis).status = "running";
      return { ...next, expectedCalls: event.expectedCalls, phase: null, startedAt: now, elapsedS: null, wait: null };
    }
    case "calls": {
      const analysis = s.analysis ?? emptyAnalysis();
      applyCalls(analysis, event);
      return analysis === s.analysis ? s : { ...s, analysis };
    }
    case "phase":
      return { ...s, phase: event.phase };
    case "done":
      if (s.analysis?.status === "running") s.analysis.status = "done";
      return {
        ...s,
        rerunning: false,
        reran: s.reran || s.rerunning,
        phase: null,
        elapsedS: event.elapsedS,
        totalS: event.totalS,
        wait: null,
      };
    case "error":
      s = s.wait ? { ...s, wait: null } : s;
      if (s.rerunning && s.analysis?.status !== "running") {
        // the kernel refused the re-run before starting it (no model in this kernel): the
        // analysis shown is still valid, so the view says why instead of marking it failed
        return {
          ...s,
          rerunning: false,
          rerunError: event.error.message || event.error.type,
          mode: s.analysis ? (s.analysis.mode === "training" ? "training" : "inference") : s.mode,
        };
      }
      if (s.analysis) {
        s.analysis.error = event.error;
        s.analysis.status = "error";
        return { ...s, rerunning: false };
      }
      // the analysis stopped before its module tree was sent (the model did not build): an
      // empty analysis carries the error, so the banner says why instead of a wait that never ends
      {
        const failed = emptyAnalysis();
        failed.status = "error";
        failed.error = event.error;
        return { ...withAnalysis(s, failed), rerunning: false };
      }
  }
}

/** A new analysis: the switches show its mode, unless a re-run of another mode is on its way. */
function withAnalysis(s: Session, analysis: Analysis | null): Session {
  const mode = analysis && !s.rerunning ? (analyzedMode(analysis) ?? s.mode) : s.mode;
  return { ...s, analysis, mode };
}

function analyzedMode(a: Analysis | null): Mode | null {
  return a && (a.mode === "inference" || a.mode === "training") ? a.mode : null;
}
