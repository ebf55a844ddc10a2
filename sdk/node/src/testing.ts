/**
 * Helpers for tests of workers built on `@handoff-dev/worker`: FakeClock, and
 * the fixture of `handoff conformance` (FixtureHooks and serveFixture in
 * the worker, runFixture and fixtureMain as the fixture command;
 * docs/protocol.md, "The fixture contract").
 * @module
 */
import type { Clock } from './clock.js';

interface FakeTimer {
  at: number;
  fn: () => void;
  seq: number;
  cleared: boolean;
}

/**
 * FakeClock is a Clock that moves only when told (`step`, `setTime`), for
 * tests of leadership terms and the age of work: the Go package worker's
 * tests use k8s.io/utils/clock/testing.FakeClock the same way. Its wall
 * clock and its monotonic clock are one value, in Unix milliseconds.
 */
export class FakeClock implements Clock {
  #t: number;
  #timers: FakeTimer[] = [];
  #seq = 0;

  /** @param start the time in Unix milliseconds; default `Date.now()`. */
  constructor(start: number = Date.now()) {
    this.#t = start;
  }

  now(): number {
    return this.#t;
  }

  monotonic(): number {
    return this.#t;
  }

  setTimeout(fn: () => void, ms: number): unknown {
    const t: FakeTimer = { at: this.#t + Math.max(0, ms), fn, seq: this.#seq++, cleared: false };
    this.#timers.push(t);
    if (ms <= 0) queueMicrotask(() => this.#fire()); // not within the caller's call
    return t;
  }

  clearTimeout(handle: unknown): void {
    const t = handle as FakeTimer | undefined;
    if (t) t.cleared = true;
    this.#timers = this.#timers.filter((x) => !x.cleared);
  }

  /** Moves the clock on by ms milliseconds and runs the timers due, in order of their time. */
  step(ms: number): void {
    this.setTime(this.#t + ms);
  }

  /** Sets the clock to t (Unix milliseconds) and runs the timers due. */
  setTime(t: number): void {
    this.#t = t;
    this.#fire();
  }

  /** The number of timers waiting. */
  get pending(): number {
    return this.#timers.filter((x) => !x.cleared).length;
  }

  #fire(): void {
    for (;;) {
      const due = this.#timers.filter((x) => !x.cleared && x.at <= this.#t).sort((a, b) => a.at - b.at || a.seq - b.seq);
      const t = due[0];
      if (!t) return;
      t.cleared = true;
      this.#timers = this.#timers.filter((x) => !x.cleared);
      t.fn();
    }
  }
}

export {
  FixtureHooks,
  fixtureHoldTimeoutMillis,
  fixtureMain,
  fixturePrefix,
  fixtureSocketEnv,
  runFixture,
  serveFixture,
  type FixtureIO,
  type FixtureOptions,
} from './fixture.js';
