/**
 * A clock: the time leadership terms are measured with, and the timers that
 * end them. The Agent takes one in `AgentOptions.clock` (tests pass a
 * `FakeClock` from `@handoff-dev/worker/testing`); the default is `realClock`.
 */
export interface Clock {
  /** The wall-clock time, in Unix milliseconds (fractions allowed): what the sidecar's `until` and `sequence` are compared with. */
  now(): number;
  /** A monotonic reading in milliseconds from an arbitrary origin: what terms and the age of work are measured on. */
  monotonic(): number;
  /** Calls fn after ms milliseconds of the monotonic clock (at once, soon, for ms ≤ 0); returns a handle for clearTimeout. */
  setTimeout(fn: () => void, ms: number): unknown;
  /** Cancels a timer of setTimeout; a timer that has fired or been cleared is left alone. */
  clearTimeout(handle: unknown): void;
}

/** Node's setTimeout holds at most this many milliseconds (about 24.8 days). */
const maxTimer = 2 ** 31 - 1;

interface RealTimer {
  t: ReturnType<typeof setTimeout> | undefined;
}

/**
 * The real clock: `Date.now()` for the wall clock, `performance.now()` for
 * the monotonic one, Node's timers (unref'd, so that a pending term does not
 * keep the process alive), chained beyond 24.8 days.
 */
export const realClock: Clock = {
  now: () => Date.now(),
  monotonic: () => performance.now(),
  setTimeout(fn: () => void, ms: number): unknown {
    const h: RealTimer = { t: undefined };
    const end = performance.now() + Math.max(0, ms);
    const arm = (left: number) => {
      h.t = setTimeout(() => {
        const rest = end - performance.now();
        if (rest > 1) arm(rest);
        else fn();
      }, Math.min(Math.max(0, left), maxTimer));
      h.t.unref?.();
    };
    arm(ms);
    return h;
  },
  clearTimeout(handle: unknown): void {
    const h = handle as RealTimer | undefined;
    if (h?.t !== undefined) clearTimeout(h.t);
  },
};
