// The claims a worker holds and the receives it has pending: Receive and
// Claim, the app's handles, and the Ledger, the Agent's bookkeeping of them
// that the drain reads. The Agent's side of a claim is a ClaimCore, kept
// out of Claim's public type.
import type { Clock } from './clock.js';
import { CanceledError, ClaimDoneError, HandedBackError } from './errors.js';
import { link } from './signals.js';

/** Where a claim is: started (it drains), unstarted (held for later), handedBack (taken at stop-claiming to hand back), done. */
export type ClaimState = 'started' | 'unstarted' | 'handedBack' | 'done';

/** abortOnce aborts c with reason unless it has aborted already. */
export function abortOnce(c: AbortController, reason: unknown): void {
  if (!c.signal.aborted) c.abort(reason);
}

/** What the Ledger asks of the drain, which owns stop-claiming and the hand-backs. */
export interface LedgerHooks {
  /** Whether stop-claiming has come: a claim held unstarted from then on is taken at once. */
  stopping(): boolean;
  /** Takes unstarted claims to hand back through AgentOptions.handBack. */
  take(claims: ClaimCore[]): void;
  /** A claim ended, after the Ledger counted it: byAgent when the Agent ended it (handed back), not the app. */
  ended(byAgent: boolean): void;
}

/**
 * Ledger counts what the worker holds (claims, started or not) and what it
 * waits for (receives pending), and wakes waitDrained at each change.
 */
export class Ledger {
  /** The claims held: made and not yet done, started or not. */
  held = 0;
  /** The claims among held that are unstarted, or handed back and not yet ended. */
  unstarted = 0;
  /** The pending receives, by the controller of their signal. */
  readonly receives = new Set<AbortController>();
  /** The claims held, in the order they were made. */
  readonly claims = new Set<ClaimCore>();
  /** The clock of the age of work. */
  readonly clock: Clock;
  readonly #hooks: LedgerHooks;
  #drainWaiters = new Set<() => void>();
  #workCanceled = false;

  constructor(clock: Clock, hooks: LedgerHooks) {
    this.clock = clock;
    this.#hooks = hooks;
  }

  /** Whether stop-claiming has come. */
  get stopping(): boolean {
    return this.#hooks.stopping();
  }

  /** No claim held and no receive pending. */
  get drained(): boolean {
    return this.held === 0 && this.receives.size === 0;
  }

  /** Begins a receive whose claims end when parent aborts. */
  receive(parent: AbortSignal | undefined): Receive {
    const c = new AbortController();
    const r = newReceive(this, parent, c);
    this.receives.add(c);
    this.changed();
    return r;
  }

  /** A receive ended: c was its signal's controller. */
  receiveEnded(c: AbortController): void {
    this.receives.delete(c);
    this.changed();
  }

  /** Counts one more claim in state st, whose signal aborts when parent does (at once, after the cancel fallback). */
  hold(parent: AbortSignal | undefined, st: 'started' | 'unstarted', value: unknown): ClaimCore {
    const c = new ClaimCore(this, value, st);
    this.held++;
    if (st === 'unstarted') this.unstarted++;
    this.claims.add(c);
    c.link(parent);
    if (this.#workCanceled) c.abort(new CanceledError());
    this.changed();
    return c;
  }

  /** Takes unstarted claims to hand back (the drain's). */
  take(claims: ClaimCore[]): void {
    this.#hooks.take(claims);
  }

  /** A claim moved from unstarted to started. */
  started(): void {
    this.unstarted--;
    this.changed();
  }

  /** A claim ended; prev was its state before. */
  ended(c: ClaimCore, prev: ClaimState, byAgent: boolean): void {
    if (prev === 'unstarted' || prev === 'handedBack') this.unstarted--;
    this.claims.delete(c);
    this.held--;
    this.changed();
    this.#hooks.ended(byAgent);
  }

  /** The cancel fallback: aborts every claim's signal, now and held from now on, with CanceledError. */
  cancelWork(): void {
    if (this.#workCanceled) return;
    this.#workCanceled = true;
    const reason = new CanceledError();
    for (const c of [...this.claims]) c.abort(reason);
  }

  /** How long the oldest started claim has run, in whole ms on the clock's monotonic reading; 0 when none has. */
  runningMillis(): number {
    let oldest: number | undefined;
    for (const c of this.claims) {
      if (c.state === 'started' && (oldest === undefined || c.startedAt < oldest)) oldest = c.startedAt;
    }
    return oldest === undefined ? 0 : Math.max(Math.floor(this.clock.monotonic() - oldest), 0);
  }

  /** Waits until drained; rejects with signal's reason if signal aborts first. */
  waitDrained(signal?: AbortSignal): Promise<void> {
    if (this.drained) return Promise.resolve();
    if (signal?.aborted) return Promise.reject(signal.reason);
    return new Promise((resolve, reject) => {
      let unlink = (): void => {};
      const check = () => {
        if (this.drained) {
          this.#drainWaiters.delete(check);
          unlink();
          resolve();
        }
      };
      this.#drainWaiters.add(check);
      unlink = link(signal, (reason) => {
        this.#drainWaiters.delete(check);
        reject(reason);
      });
    });
  }

  /** Calls fn at each change (and at changed()) until the returned function is called. */
  watch(fn: () => void): () => void {
    this.#drainWaiters.add(fn);
    return () => {
      this.#drainWaiters.delete(fn);
    };
  }

  /** Wakes waitDrained. */
  changed(): void {
    for (const w of [...this.#drainWaiters]) w();
  }
}

/** ClaimCore is the Agent's side of one claim: its state, the controller of its signal, and the Claim the app holds. */
export class ClaimCore {
  state: ClaimState;
  /** Taken at stop-claiming to hand back: the Agent ends it, not the app. */
  taken = false;
  /** When it started, on the clock's monotonic reading. */
  startedAt = 0;
  /** The app's handle. */
  readonly claim: Claim;
  readonly #ledger: Ledger;
  readonly #c = new AbortController();
  #unlink: () => void = () => {};

  constructor(ledger: Ledger, value: unknown, state: 'started' | 'unstarted') {
    this.#ledger = ledger;
    this.state = state;
    if (state === 'started') this.startedAt = ledger.clock.monotonic();
    this.claim = newClaim(this, value);
  }

  get signal(): AbortSignal {
    return this.#c.signal;
  }

  link(parent: AbortSignal | undefined): void {
    this.#unlink = link(parent, (reason) => this.abort(reason));
  }

  abort(reason: unknown): void {
    abortOnce(this.#c, reason);
  }

  /** Claim.start. */
  start(): void {
    if (this.taken) throw new HandedBackError();
    if (this.state === 'done') throw new ClaimDoneError();
    if (this.state === 'unstarted') {
      this.state = 'started';
      this.startedAt = this.#ledger.clock.monotonic();
      this.#ledger.started();
    }
  }

  /** Ends the claim once: for the app (done), unless the Agent took it; for the Agent (byAgent), a claim it took. */
  end(byAgent: boolean): void {
    const prev = this.state;
    if (prev === 'done' || this.taken !== byAgent) return;
    this.state = 'done';
    this.#unlink();
    this.#ledger.ended(this, prev, byAgent);
    this.abort(new DOMException('claim done', 'AbortError'));
  }
}

/** The constructors of Receive and Claim, private to their classes, as this module calls them. */
let newReceive: (ledger: Ledger, parent: AbortSignal | undefined, c: AbortController) => Receive;
let newClaim: (core: ClaimCore, value: unknown) => Claim;

/**
 * Receive is one wait for messages, begun by Agent.receive and ended by
 * end. While it is pending the worker is not drained, but nothing is in
 * flight: the wait holds no claim. Stop-claiming aborts its signal, so a
 * pending receive ends quickly, and the drain waits only for that.
 */
export class Receive implements Disposable {
  readonly #ledger: Ledger;
  readonly #parent: AbortSignal | undefined;
  readonly #c: AbortController;
  readonly #unlink: () => void;
  #ended = false;

  private constructor(ledger: Ledger, parent: AbortSignal | undefined, c: AbortController) {
    this.#ledger = ledger;
    this.#parent = parent;
    this.#c = c;
    this.#unlink = link(parent, (reason) => abortOnce(c, reason));
  }

  static {
    newReceive = (ledger, parent, c) => new Receive(ledger, parent, c);
  }

  /**
   * The signal to wait for messages with. It aborts when the signal given
   * to receive does, at stop-claiming (reason StoppingError), and at end.
   *
   * Ending a wait must not lose a message: if your queue client cannot tell
   * whether an aborted call took one (a claim statement cut off may still
   * have committed), run that call with the signal given to receive and
   * wait only between calls with this one: the receive is pending while the
   * call runs, so what it gets in the race with stop-claiming is held.
   */
  get signal(): AbortSignal {
    return this.#c.signal;
  }

  /**
   * One message received: held and started, in flight from now until
   * Claim.done, and the drain waits for it or the fallback hands it back.
   * Call it for every message received, before end, even after
   * stop-claiming (a message received in the race with it): it never
   * refuses. A batch calls it once per message.
   */
  hold(): Claim {
    return this.#ledger.hold(this.#parent, 'started', undefined).claim;
  }

  /**
   * One message received and not started yet (the rest of a batch, a
   * prefetched or buffered message), with the app's handle v (Claim.value):
   * held, in flight and unstarted until Claim.start. At stop-claiming (or
   * when held after it) the Agent takes it and hands it back at once
   * through AgentOptions.handBack; Claim.start then throws HandedBackError.
   * Without handBack, it stays held like any other.
   */
  holdUnstarted<T>(value: T): Claim<T> {
    const l = this.#ledger;
    const c = l.hold(this.#parent, 'unstarted', value);
    if (l.stopping) l.take([c]);
    return c.claim as Claim<T>;
  }

  /** The wait is over: call it once the messages received are held, or when none came. Aborts signal. Idempotent. */
  end(): void {
    if (this.#ended) return;
    this.#ended = true;
    this.#unlink();
    this.#ledger.receiveEnded(this.#c);
    abortOnce(this.#c, new DOMException('receive ended', 'AbortError'));
  }

  /** end, for `using r = agent.receive()`. */
  [Symbol.dispose](): void {
    this.end();
  }
}

/**
 * Claim is one message the worker holds, from Receive.hold,
 * Receive.holdUnstarted or Agent.begin until done.
 */
export class Claim<T = unknown> implements Disposable {
  readonly #core: ClaimCore;
  /** The value given to holdUnstarted (undefined for hold and begin). */
  readonly value: T;

  private constructor(core: ClaimCore, value: T) {
    this.#core = core;
    this.value = value;
  }

  static {
    newClaim = (core, value) => new Claim(core, value);
  }

  /**
   * The signal to work on the claim with. It aborts when the signal given to
   * receive (or begin) does, when the sidecar's `cancel` fallback cancels
   * in-flight work at the drain deadline (reason CanceledError), and at
   * done. Stop-claiming does not abort it.
   */
  get signal(): AbortSignal {
    return this.#core.signal;
  }

  /** Whether the claim is over (done, or handed back and ended by the Agent). */
  get isDone(): boolean {
    return this.#core.state === 'done';
  }

  /**
   * Starts work on a claim held unstarted: from now on stop-claiming leaves
   * it to drain. Does nothing for a claim started already (hold, begin).
   * Throws HandedBackError if stop-claiming took the claim to hand it back
   * (drop the message: the Agent ends the claim), ClaimDoneError after done.
   */
  start(): void {
    this.#core.start();
  }

  /**
   * The claim is over: finished, or handed back to the queue. Call it once
   * the queue knows, not before. Idempotent; does nothing on a claim
   * stop-claiming took to hand back (the Agent ends it once handBack has).
   */
  done(): void {
    this.#core.end(false);
  }

  /** done, for `using c = r.hold()`. */
  [Symbol.dispose](): void {
    this.done();
  }
}
