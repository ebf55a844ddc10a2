// The drain, the Agent's half of the shutdown sequence: stop-claiming, the
// hand-back of unstarted claims (AgentOptions.handBack), the drain status,
// and the drain deadline's return (AgentOptions.returnClaims) with the
// calls of it after the deadline.
import { abortOnce, type ClaimCore, Ledger } from './claims.js';
import type { Clock } from './clock.js';
import { ReturnOverdueError, StoppingError } from './errors.js';
import type { AgentOptions, Logger, ReturnClaimsError, ReturnResult } from './options.js';
import type { DrainStatus } from './protocol.gen.js';
import { link } from './signals.js';

/** handBackTimeout bounds one call of AgentOptions.handBack, and returnAgainTimeout one later call of returnClaims, in ms. */
const handBackTimeout = 10_000;
const returnAgainTimeout = 10_000;

/** A one-at-a-time turn (Go: a channel of capacity 1), for calls of returnClaims. */
export class Turn {
  #held = false;
  #waiters: Array<() => void> = [];

  tryTake(): boolean {
    if (this.#held) return false;
    this.#held = true;
    return true;
  }

  /** take resolves true once the turn is the caller's, false if signal aborts first (a turn free at once is taken even then). */
  take(signal?: AbortSignal): Promise<boolean> {
    if (this.tryTake()) return Promise.resolve(true);
    return new Promise((resolve) => {
      let unlink = (): void => {};
      const w = () => {
        unlink();
        resolve(true);
      };
      this.#waiters.push(w);
      unlink = link(signal, () => {
        const i = this.#waiters.indexOf(w);
        if (i >= 0) {
          this.#waiters.splice(i, 1);
          resolve(false);
        }
      });
    });
  }

  give(): void {
    const next = this.#waiters.shift();
    if (next) next();
    else this.#held = false;
  }
}

/**
 * Drain runs the shutdown sequence on the Agent's claims (its Ledger):
 * stop-claiming, the hand-backs, the drain status and the return. onStop
 * is called once, at stop-claiming, after the claims and receives are
 * dealt with: the Agent resolves `stopping` and emits its event there.
 */
export class Drain {
  readonly ledger: Ledger;
  readonly #opts: AgentOptions;
  readonly #log: Logger;
  readonly #instance: string;
  readonly #onStop: (reason: StoppingError) => void;
  #stopped = false;
  #toHandBack: ClaimCore[] = [];
  #handingBack = false;
  #failed: ClaimCore[] = [];
  #returned = false;
  #returnAgain = false;
  #returningAgain = false;
  #turn = new Turn();
  /** The return calls under way, and the signal of the returnClaims call under way (none when none runs): waitDrained waits for both, the call until its signal aborts. */
  #returning = 0;
  #callSignal: AbortSignal | undefined;

  constructor(opts: AgentOptions, clock: Clock, log: Logger, instance: string, onStop: (reason: StoppingError) => void) {
    this.#opts = opts;
    this.#log = log;
    this.#instance = instance;
    this.#onStop = onStop;
    this.ledger = new Ledger(clock, {
      stopping: () => this.#stopped,
      take: (claims) => this.#take(claims),
      ended: (byAgent) => {
        if (this.#returned && !byAgent && this.#opts.returnClaims) {
          // Past the drain deadline's hand-back: the queue may still have this
          // message claimed (received after it, given up unfinished).
          this.#askReturnAgain();
        }
      },
    });
  }

  /** Whether stop-claiming has come. */
  get stopped(): boolean {
    return this.#stopped;
  }

  /** Agent.stopClaiming, returning the drain status at the moment claiming stopped (the first call's), or now (a later call's). */
  stopClaiming(): DrainStatus {
    if (this.#stopped) return this.status();
    this.#stopped = true;
    const st = this.status();
    const l = this.ledger;
    this.#log.info('stop claiming', { inFlight: l.held, unstarted: l.unstarted, receiving: l.receives.size });
    this.#take([...l.claims].filter((c) => c.state === 'unstarted'));
    // Listeners run within these calls: the Agent's state is settled first.
    const reason = new StoppingError();
    for (const r of [...l.receives]) abortOnce(r, reason);
    this.#onStop(reason);
    return st;
  }

  /** Takes unstarted claims to hand back through handBack, and starts the hand-back loop. Without handBack it does nothing. */
  #take(claims: ClaimCore[]): void {
    if (!this.#opts.handBack || claims.length === 0) return;
    for (const c of claims) {
      c.state = 'handedBack';
      c.taken = true;
    }
    this.#toHandBack.push(...claims);
    if (!this.#handingBack) {
      this.#handingBack = true;
      // After the current call (stop-claiming answers first).
      setImmediate(() => void this.#handBackLoop());
    }
  }

  async #handBackLoop(): Promise<void> {
    const handBack = this.#opts.handBack!;
    for (;;) {
      const claims = this.#toHandBack;
      this.#toHandBack = [];
      if (claims.length === 0) {
        this.#handingBack = false;
        return;
      }
      try {
        await handBack(
          claims.map((c) => c.claim),
          AbortSignal.timeout(handBackTimeout),
        );
      } catch (err) {
        this.#log.error("hand back unstarted claims failed; left to the drain deadline's fallback", { claims: claims.length, error: err });
        this.#failed.push(...claims);
        if (this.#returned) this.#askReturnAgain(); // the fallback has run: returnClaims again, then end them
        continue;
      }
      this.#log.info('unstarted claims handed back', { count: claims.length });
      for (const c of claims) c.end(true);
    }
  }

  /** Agent.return: stop-claiming, the cancel fallback, then returnClaims in its turn. Never rejects. */
  async return(options: { cancel?: boolean; cancelWaitMillis?: number; signal?: AbortSignal } = {}): Promise<ReturnResult> {
    this.#returning++;
    try {
      return await this.#return(options);
    } finally {
      this.#returning--;
      this.ledger.changed();
    }
  }

  async #return(options: { cancel?: boolean; cancelWaitMillis?: number; signal?: AbortSignal }): Promise<ReturnResult> {
    const { cancel = false, cancelWaitMillis = 0, signal } = options;
    this.stopClaiming();
    if (cancel) {
      this.ledger.cancelWork();
      await this.#waitDrainedFor(cancelWaitMillis, signal);
    }
    if (!(await this.#turn.take(signal))) {
      // Another call runs (this return is a repeat) and outlived signal:
      // one more call after it stands in for this one.
      this.#askReturnAgain();
      const cause = signal?.reason instanceof Error ? signal.reason.message : String(signal?.reason);
      return { returned: 0, error: new Error(`return: waiting for the hand-back under way: ${cause}`) };
    }
    const res = await this.#returnClaims(signal ?? new AbortController().signal);
    if (this.#opts.returnClaims) this.#log.info('claims returned', { returned: res.returned, cancel, error: res.error });
    return res;
  }

  /**
   * Agent.waitDrained: resolves once drained and every claim ended since
   * the return fallback began has been handed back (no return call under
   * way, no returnClaims call asked for or running); rejects with signal's
   * reason if signal aborts first, and, with nothing held, with a
   * ReturnOverdueError once the signal of the returnClaims call under way
   * has aborted (its bound) while the call has not settled.
   */
  waitDrained(signal?: AbortSignal): Promise<void> {
    return new Promise((resolve, reject) => {
      let unwatch = (): void => {};
      let unlink = (): void => {};
      let unbound = (): void => {};
      let bound: AbortSignal | undefined;
      let over = false;
      const finish = (settle: () => void): void => {
        if (over) return;
        over = true;
        unwatch();
        unlink();
        unbound();
        settle();
      };
      const check = (): void => {
        if (over) return;
        const drained = this.ledger.drained;
        if (drained && this.#returning === 0 && !this.#returningAgain) return finish(resolve);
        const call = this.#callSignal;
        if (!drained || !call) return;
        if (call.aborted) {
          const err = new ReturnOverdueError(
            `handoff: wait drained: returnClaims, called after the return fallback began, has not settled since its signal aborted (${String(call.reason)}); what it has not handed back waits for its visibility timeout`,
            { cause: call.reason },
          );
          return finish(() => reject(err));
        }
        if (call !== bound) {
          unbound();
          bound = call;
          unbound = link(call, () => check());
        }
      };
      check();
      if (over) return;
      unwatch = this.ledger.watch(check);
      unlink = link(signal, (reason) => finish(() => reject(reason)));
    });
  }

  /** Waits for drained, at most ms (no bound above 2^31-1 ms) and until signal aborts. */
  #waitDrainedFor(ms: number, signal?: AbortSignal): Promise<void> {
    if (ms <= 0) return Promise.resolve();
    const c = new AbortController();
    const unlink = link(signal, (r) => c.abort(r));
    const t = ms < 2 ** 31 - 1 ? setTimeout(() => c.abort(), ms) : undefined;
    return this.ledger
      .waitDrained(c.signal)
      .catch(() => {})
      .finally(() => {
        clearTimeout(t);
        unlink();
      });
  }

  /**
   * Calls returnClaims (if set) with signal, then ends the unstarted claims
   * handBack failed on. The caller holds the turn, which this gives back.
   * Claims the app ends from now on ask for one more call.
   */
  async #returnClaims(signal: AbortSignal): Promise<ReturnResult> {
    this.#returned = true;
    this.#returnAgain = false; // this call covers what ended before
    const failed = this.#failed;
    this.#failed = [];
    const res: ReturnResult = { returned: 0 };
    const fn = this.#opts.returnClaims;
    this.#callSignal = signal;
    this.ledger.changed();
    if (fn) {
      try {
        const n = await fn(signal);
        if (typeof n !== 'number' || !Number.isSafeInteger(n) || n < 0) {
          res.error = new Error(`returnClaims resolved to ${String(n)}; want how many claims it handed back, a whole number 0 or more`);
        } else {
          res.returned = n;
        }
      } catch (err) {
        res.error = err ?? new Error('returnClaims failed');
        const n = (err as ReturnClaimsError | undefined)?.returned;
        if (typeof n === 'number' && Number.isSafeInteger(n) && n >= 0) res.returned = n;
      }
    }
    this.#callSignal = undefined;
    this.ledger.changed();
    this.#turn.give();
    for (const c of failed) c.end(true);
    return res;
  }

  /** Asks for one more call of returnClaims, after the one under way if any, and starts the loop that makes it. */
  #askReturnAgain(): void {
    this.#returnAgain = true;
    if (!this.#returningAgain) {
      this.#returningAgain = true;
      void this.#returnAgainLoop();
    }
  }

  /** Calls returnClaims while calls are asked for, one at a time: the requests made while it waits for its turn or a call runs are covered by the next. */
  async #returnAgainLoop(): Promise<void> {
    for (;;) {
      await this.#turn.take();
      if (!this.#returnAgain) {
        this.#returningAgain = false;
        this.ledger.changed();
        this.#turn.give();
        return;
      }
      const res = await this.#returnClaims(AbortSignal.timeout(returnAgainTimeout));
      if (!this.#opts.returnClaims) continue;
      if (res.error !== undefined) {
        this.#log.error('returning claims again after the drain deadline failed; what is still claimed is left to its visibility timeout', {
          returned: res.returned,
          error: res.error,
        });
      } else {
        this.#log.info('claims returned again after the drain deadline', { returned: res.returned });
      }
    }
  }

  /** The drain status, as the sidecar reads it. */
  status(): DrainStatus {
    const l = this.ledger;
    const running = l.runningMillis();
    return {
      stopping: this.#stopped,
      inFlight: l.held,
      unstarted: l.unstarted === 0 ? undefined : l.unstarted,
      receiving: l.receives.size,
      runningMillis: running === 0 ? undefined : BigInt(running),
      drained: l.drained,
      instance: this.#instance,
    };
  }
}
