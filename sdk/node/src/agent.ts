import { randomBytes } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { checkToken, readTokenFile, tokenFile, tokenFileEnv, Verifier } from './auth.js';
import { realClock, type Clock } from './clock.js';
import { CanceledError, ClaimDoneError, ConfigError, HandedBackError, NotLeaderError, StoppingError } from './errors.js';
import type { DrainStatus } from './protocol.gen.js';
import { handler, listen, type AppHandler, type AppServer } from './server.js';
import { link } from './signals.js';

/** The environment variable with the sidecar's lease duration (a Go duration, like `15s`), which bounds the grants the app accepts. */
export const leaseDurationEnv = 'HANDOFF_LEASE_DURATION';
/** The environment variable with the pod's shard set (Lease names, comma-separated). */
export const shardsEnv = 'HANDOFF_SHARDS';
/** The longest lease duration the sidecar accepts, in milliseconds (1h): the bound on grants without HANDOFF_LEASE_DURATION. */
export const maxLeaseDurationMillis = 3_600_000;

/** handBackTimeout bounds one call of AgentOptions.handBack, and returnAgainTimeout one later call of returnClaims, in ms. */
const handBackTimeout = 10_000;
const returnAgainTimeout = 10_000;

/** What the Agent logs: info and error lines with fields. The default discards them. */
export interface Logger {
  info(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
}

const nopLogger: Logger = { info() {}, error() {} };

/**
 * An error returnClaims throws may carry how many claims it handed back
 * before it failed: `returned` is then answered with it, as the Go
 * ReturnClaims's count beside its error.
 */
export interface ReturnClaimsError extends Error {
  returned?: number;
}

/** Options of an Agent. Every field is optional. */
export interface AgentOptions {
  /**
   * Hands back every claim the worker holds and has not finished (for a
   * queue with a visibility timeout: make them visible now), and resolves to
   * how many it handed back; it may throw (an error's numeric `returned`
   * is the count then). Called at the drain deadline (`Agent.return`), after
   * in-flight work was canceled when the sidecar's fallback is `cancel`, and
   * again after each claim the app ends (`Claim.done`) from then on,
   * whether it was held at the deadline or after it. Those later calls run
   * on the Agent's own, each bounded by 10 s (`signal`); claims ending while
   * one runs are covered by one more call after it. Calls never overlap. It
   * must be safe to call more than once. Unset: nothing is handed back and
   * the claims wait for their visibility timeout.
   */
  returnClaims?: (signal: AbortSignal) => number | Promise<number>;
  /**
   * Hands back claims held unstarted (`Receive.holdUnstarted`): the rest of
   * a batch, prefetched or buffered messages. Called at stop-claiming, after
   * it has answered, with every claim then unstarted (`Claim.value` tells
   * which messages), and again for each claim held unstarted after it; one
   * call at a time, each bounded by 10 s (`signal`). Resolving means every
   * one is handed back: the Agent then ends the claims (`Claim.done` is not
   * the app's to call). Throwing leaves them held, unstarted, until the
   * drain deadline's `return`, which ends them after returnClaims. Claims
   * started (`Claim.start`, `hold`, `begin`) are not passed: they drain.
   * Unset: unstarted claims stay held until started or done.
   */
  handBack?: (unstarted: Claim[], signal: AbortSignal) => void | Promise<void>;
  /** Receives the Agent's logs. Default: none. */
  logger?: Logger;
  /**
   * Times leadership terms (the end of a term, the timer that aborts its
   * signal, the receipt a grant's validForMillis counts from) and the age
   * of work (runningMillis). Default: realClock. Tests pass a FakeClock
   * (`@handoff/worker/testing`). Signatures are always checked on the real
   * wall clock, which the sidecar signs with.
   */
  clock?: Clock;
  /** The pod's token. Default: read from tokenFile. */
  token?: string;
  /** The file the token is read from, once. Default: the file named by $HANDOFF_TOKEN_FILE. */
  tokenFile?: string;
  /**
   * Serve without a token when none is configured (token, tokenFile and
   * $HANDOFF_TOKEN_FILE all unset): any process that reaches the address
   * can then stop claiming and grant or revoke leadership. For local
   * development and tests without a sidecar only; a configured token is
   * required even with this set.
   */
  insecureNoToken?: boolean;
  /**
   * The lease duration in milliseconds, which bounds the grants accepted (a
   * longer one is answered 422). Default: $HANDOFF_LEASE_DURATION, else 1h.
   */
  leaseDuration?: number;
  /** The environment read for HANDOFF_TOKEN_FILE and HANDOFF_LEASE_DURATION. Default: process.env. */
  env?: Record<string, string | undefined>;
}

/** One term as leader of a Lease, as the sidecar told it. */
export interface Leadership {
  readonly lease: string;
  /** Grows with each new holder of the Lease: pass it to the systems leader work writes to, so they refuse an older holder. */
  readonly fencingToken: bigint;
  /** When this term ends unless renewed, on the wall clock (measured on the Agent's monotonic clock from the grant's receipt). */
  readonly until: Date;
}

/** Leader work begun with Agent.beginLeading: its term, a signal that aborts when the term ends, and done. */
export interface LeaderWork extends Leadership, Disposable {
  /** Aborts when the term ends (revoked, replaced, run out; reason NotLeaderError), when the signal given to beginLeading aborts, and at done. */
  readonly signal: AbortSignal;
  /** The leader work is over: the sidecar frees the Lease only after every done of its term. Idempotent. */
  done(): void;
}

/** The result of Agent.return: how many claims returnClaims handed back, and its error if it failed. */
export interface ReturnResult {
  returned: number;
  error?: unknown;
}

/** Go's time.ParseDuration, for HANDOFF_LEASE_DURATION: a sequence of decimal numbers with units, in milliseconds. */
export function parseGoDuration(s: string): number | undefined {
  const units: Record<string, number> = { ns: 1e-6, us: 1e-3, 'µs': 1e-3, 'μs': 1e-3, ms: 1, s: 1000, m: 60_000, h: 3_600_000 };
  let rest = s;
  let sign = 1;
  if (rest.startsWith('-') || rest.startsWith('+')) {
    sign = rest[0] === '-' ? -1 : 1;
    rest = rest.slice(1);
  }
  if (rest === '0') return 0;
  if (rest === '') return undefined;
  let total = 0;
  const re = /^([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)/;
  while (rest !== '') {
    const m = re.exec(rest);
    if (!m || m[1] === '' || m[1] === '.') return undefined;
    total += Number(m[1]) * units[m[2]!]!;
    rest = rest.slice(m[0].length);
  }
  return sign * total;
}

/** shardsFromEnv is the pod's shard set, the Lease names in $HANDOFF_SHARDS (comma-separated); none when unset. */
export function shardsFromEnv(env: Record<string, string | undefined> = process.env): string[] {
  return (env[shardsEnv] ?? '')
    .split(',')
    .map((n) => n.trim())
    .filter((n) => n !== '');
}

type ClaimState = 'started' | 'unstarted' | 'handedBack' | 'done';

/** A term: the Agent's record of leadership of one Lease. */
interface Term {
  lead: Leadership;
  /** The end of the term on the clock's monotonic reading. */
  end: number;
  controller: AbortController;
  timer: unknown;
  timerPending: boolean;
  /** Leader work begun and not done. */
  work: number;
  waiters: Set<() => void>;
}

/** A grant as applyLeadership takes it. */
interface Grant {
  fencingToken: bigint;
  /** The end of the term on the clock's monotonic reading. */
  end: number;
  /** The same end on the wall clock, Unix ms. */
  until: number;
}

/** A one-at-a-time turn (Go: a channel of capacity 1), for calls of returnClaims. */
class Turn {
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
 * Agent is the worker's end of the handoff protocol, the Node counterpart
 * of the Go package worker's Agent: it serves the endpoints the sidecar
 * calls (`listen`, or `handler` on a server of your own) and gives the
 * worker what it needs to hand over cleanly:
 *
 * - `receive()` before waiting for a message, `Receive.hold()` for each
 *   message it got, `Receive.end()` when the wait is over, and
 *   `Claim.done()` when a held message is finished or handed back.
 *   Stop-claiming aborts every `Receive.signal`, so a long poll neither
 *   delays the drain nor claims a message afterwards.
 * - `stopping` (a promise), `stoppingSignal` and the `'stopping'` event, at
 *   stop-claiming; `receive` and `begin` throw StoppingError from then on.
 * - `Receive.holdUnstarted(v)` and `Claim.start()` for messages received
 *   before they are worked on: at stop-claiming those not started are
 *   handed back at once through `AgentOptions.handBack`.
 * - `AgentOptions.returnClaims`, called at the drain deadline, and again
 *   after each claim that ends after it.
 * - `leader(lease)`, `beginLeading(lease)` for leader-only work, with the
 *   fencing token; a term ends on the Agent's own clock even if the
 *   sidecar is gone.
 *
 * Events: `'stopping'` (at stop-claiming), `'leadershipChanged'` (a term
 * began or ended).
 */
export class Agent extends EventEmitter {
  /** Names this process in the drain status: 16 random hex digits, new for each Agent. */
  readonly instance: string = randomBytes(8).toString('hex');
  /** Resolves at stop-claiming. */
  readonly stopping: Promise<void>;
  /** Aborts at stop-claiming, with a StoppingError. */
  readonly stoppingSignal: AbortSignal;
  /** @internal The Verifier of the pod's token; undefined only with insecureNoToken and no token. */
  readonly verifier: Verifier | undefined;
  /** The longest grant accepted, in ms: the lease duration (AgentOptions.leaseDuration, $HANDOFF_LEASE_DURATION, else 1h). */
  readonly maxTerm: number;
  /** The clock of terms and of the age of work (AgentOptions.clock). */
  readonly clock: Clock;
  /** @internal */
  readonly log: Logger;
  readonly #opts: AgentOptions;

  #stopped = false;
  #stop: AbortController = new AbortController();
  #resolveStopping!: () => void;
  #held = 0;
  #unstarted = 0;
  #toHandBack: Claim[] = [];
  #handingBack = false;
  #failed: Claim[] = [];
  #returned = false;
  #returnAgain = false;
  #returningAgain = false;
  #turn = new Turn();
  /** @internal */ readonly _receives = new Set<Receive>();
  /** @internal */ readonly _claims = new Set<Claim>();
  #drainWaiters = new Set<() => void>();
  #workCanceled = false;
  #leases = new Map<string, Term>();
  /** Terms a grant with a new fencing token replaced while their leader work ran, by Lease: a revoke waits for them too. */
  #replaced = new Map<string, Set<Term>>();
  #sequences = new Map<string, bigint>();
  #leadershipWaiters: Array<() => void> = [];

  /**
   * Makes an Agent that has not been asked to stop. It reads the pod's token
   * (options.token, else the file options.tokenFile, else the file named by
   * $HANDOFF_TOKEN_FILE) and the bound of a leadership term
   * (options.leaseDuration, else $HANDOFF_LEASE_DURATION, else 1h). It
   * throws a ConfigError naming the option and the variable when no token
   * is configured and insecureNoToken is not set, when the token file
   * cannot be read or holds no token, and when HANDOFF_LEASE_DURATION is
   * not a duration from 1ms to 1h.
   */
  constructor(options: AgentOptions = {}) {
    super();
    this.#opts = options;
    const env = options.env ?? process.env;
    const token = agentToken(options, env);
    this.maxTerm = agentMaxTerm(options, env);
    this.verifier = token === '' ? undefined : new Verifier(token);
    this.clock = options.clock ?? realClock;
    this.log = options.logger ?? nopLogger;
    this.stoppingSignal = this.#stop.signal;
    this.stopping = new Promise((resolve) => {
      this.#resolveStopping = resolve;
    });
  }

  /**
   * Serves the app API on url (`unix:///handoff-run/app.sock`, or by
   * opt-in a loopback address like `http://127.0.0.1:7452`; unset:
   * $HANDOFF_APP_URL, which the injector sets) until the returned server is
   * closed, or signal aborts. A socket is made at the path itself with mode
   * 0666 (a stale one replaced; a path that is anything else, or that
   * another process serves, refused) and removed when the server closes.
   */
  listen(options: { url?: string; signal?: AbortSignal } = {}): Promise<AppServer> {
    return listen(this, options);
  }

  /** The app API as a request listener, for a server of your own: `http.createServer(agent.handler())`. */
  handler(): AppHandler {
    return handler(this);
  }

  /** Whether stop-claiming has come. */
  get isStopping(): boolean {
    return this.#stopped;
  }

  /** The claims held: made by hold, holdUnstarted (or begin) and not yet done, started or not. Pending receives are not counted. */
  get inFlight(): number {
    return this.#held;
  }

  /** The claims among inFlight held unstarted and not yet started, or handed back and ended. */
  get unstarted(): number {
    return this.#unstarted;
  }

  /** The receives begun and not ended. */
  get receiving(): number {
    return this._receives.size;
  }

  /**
   * Begins a wait for messages: wait with the Receive's signal (a long poll,
   * a subscription, the pause between polls), call hold for each message
   * received, then end. Throws StoppingError once the worker must stop
   * claiming, and signal's reason if signal has aborted. The signal given
   * is the parent of the claims held: they end when it aborts.
   */
  receive(signal?: AbortSignal): Receive {
    if (this.#stopped) throw new StoppingError();
    if (signal?.aborted) throw signal.reason;
    const r = new Receive(this, signal);
    this._receives.add(r);
    this._changed();
    return r;
  }

  /**
   * Holds one claim at once, for work claimed the moment it begins (no
   * wait for a message): its signal and done are the claim's. A wait for a
   * message inside it counts as in flight and is not ended by
   * stop-claiming: use receive for that. A message such a wait claims after
   * the drain deadline's hand-back and gives up is handed back once done is
   * called (returnClaims runs again). Throws StoppingError once the worker
   * must stop claiming, and so after return.
   */
  begin(signal?: AbortSignal): Claim {
    if (this.#stopped) throw new StoppingError();
    return this._hold(signal, 'started', undefined);
  }

  /**
   * Stops claiming: resolves `stopping`, aborts `stoppingSignal` and every
   * pending receive's signal (reason StoppingError) and emits `'stopping'`,
   * all before it returns; receive and begin throw from then on. Claims
   * started go on. Claims held unstarted are taken (Claim.start throws
   * HandedBackError) and handed back through handBack, on the Agent's own,
   * so stopClaiming does not wait for the queue. Idempotent.
   */
  stopClaiming(): void {
    this._stopClaiming();
  }

  /** @internal stopClaiming, returning the drain status at the moment claiming stopped (the first call's), or now (a later call's). */
  _stopClaiming(): DrainStatus {
    if (this.#stopped) return this.drainStatus();
    this.#stopped = true;
    const st = this.drainStatus();
    this.log.info('stop claiming', { inFlight: this.#held, unstarted: this.#unstarted, receiving: this._receives.size });
    this._take([...this._claims].filter((c) => c._state === 'unstarted'));
    // Listeners run within these calls: the Agent's state is settled first.
    const reason = new StoppingError();
    for (const r of [...this._receives]) r._abort(reason);
    this.#resolveStopping();
    this.#stop.abort(reason);
    this.#emit('stopping');
    return st;
  }

  /** @internal takes unstarted claims to hand back through handBack, and starts the hand-back loop. Without handBack it does nothing. */
  _take(claims: Claim[]): void {
    if (!this.#opts.handBack || claims.length === 0) return;
    for (const c of claims) {
      c._state = 'handedBack';
      c._taken = true;
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
        await handBack(claims, AbortSignal.timeout(handBackTimeout));
      } catch (err) {
        this.log.error("hand back unstarted claims failed; left to the drain deadline's fallback", { claims: claims.length, error: err });
        this.#failed.push(...claims);
        if (this.#returned) this._returnAgain(); // the fallback has run: returnClaims again, then end them
        continue;
      }
      this.log.info('unstarted claims handed back', { count: claims.length });
      for (const c of claims) c._end(true);
    }
  }

  /**
   * Waits until the worker is drained (no claim held and no receive
   * pending); rejects with signal's reason if signal aborts first. Before
   * stop-claiming an idle worker usually has a receive pending, so it is
   * not drained.
   */
  waitDrained(signal?: AbortSignal): Promise<void> {
    if (this.#held === 0 && this._receives.size === 0) return Promise.resolve();
    if (signal?.aborted) return Promise.reject(signal.reason);
    return new Promise((resolve, reject) => {
      let unlink = (): void => {};
      const check = () => {
        if (this.#held === 0 && this._receives.size === 0) {
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

  /** @internal wakes waitDrained. */
  _changed(): void {
    for (const w of [...this.#drainWaiters]) w();
  }

  /**
   * Hands back unfinished claims through returnClaims (the sidecar's
   * `return` call; Go: Agent.Return). It first stops claiming, should
   * stop-claiming never have reached the app. With cancel it then aborts
   * the signal of every held claim (reason CanceledError) and waits up to
   * cancelWaitMillis (and until signal aborts) for the worker to be
   * drained. returnClaims runs even if claims are still held, once any call
   * of it under way has returned (should signal abort first, the result is
   * an error and the Agent makes one more call after that one). From then
   * on each claim the app ends makes the Agent call returnClaims again. The
   * count is this call's alone; the later calls' are logged. Never rejects.
   */
  async return(options: { cancel?: boolean; cancelWaitMillis?: number; signal?: AbortSignal } = {}): Promise<ReturnResult> {
    const { cancel = false, cancelWaitMillis = 0, signal } = options;
    this._stopClaiming();
    if (cancel) {
      this.#cancelWork();
      await this.#waitDrainedFor(cancelWaitMillis, signal);
    }
    if (!(await this.#turn.take(signal))) {
      // Another call runs (this return is a repeat) and outlived signal:
      // one more call after it stands in for this one.
      this._returnAgain();
      const cause = signal?.reason instanceof Error ? signal.reason.message : String(signal?.reason);
      return { returned: 0, error: new Error(`return: waiting for the hand-back under way: ${cause}`) };
    }
    const res = await this.#returnClaims(signal ?? new AbortController().signal);
    if (this.#opts.returnClaims) this.log.info('claims returned', { returned: res.returned, cancel, error: res.error });
    return res;
  }

  /** Waits for drained, at most ms (no bound above 2^31-1 ms) and until signal aborts. */
  #waitDrainedFor(ms: number, signal?: AbortSignal): Promise<void> {
    if (ms <= 0) return Promise.resolve();
    const c = new AbortController();
    const unlink = link(signal, (r) => c.abort(r));
    const t = ms < 2 ** 31 - 1 ? setTimeout(() => c.abort(), ms) : undefined;
    return this.waitDrained(c.signal)
      .catch(() => {})
      .finally(() => {
        clearTimeout(t);
        unlink();
      });
  }

  /** The cancel fallback: aborts every claim's signal, now and held from now on, with CanceledError. */
  #cancelWork(): void {
    if (this.#workCanceled) return;
    this.#workCanceled = true;
    const reason = new CanceledError();
    for (const c of [...this._claims]) c._abort(reason);
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
    this.#turn.give();
    for (const c of failed) c._end(true);
    return res;
  }

  /** @internal asks for one more call of returnClaims, after the one under way if any, and starts the loop that makes it. */
  _returnAgain(): void {
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
        this.#turn.give();
        return;
      }
      const res = await this.#returnClaims(AbortSignal.timeout(returnAgainTimeout));
      if (!this.#opts.returnClaims) continue;
      if (res.error !== undefined) {
        this.log.error('returning claims again after the drain deadline failed; what is still claimed is left to its visibility timeout', {
          returned: res.returned,
          error: res.error,
        });
      } else {
        this.log.info('claims returned again after the drain deadline', { returned: res.returned });
      }
    }
  }

  /** The drain status, as the sidecar reads it. */
  drainStatus(): DrainStatus {
    let oldest: number | undefined;
    for (const c of this._claims) {
      if (c._state === 'started' && (oldest === undefined || c._startedAt < oldest)) oldest = c._startedAt;
    }
    const running = oldest === undefined ? 0 : Math.max(Math.floor(this.clock.monotonic() - oldest), 0);
    return {
      stopping: this.#stopped,
      inFlight: this.#held,
      unstarted: this.#unstarted === 0 ? undefined : this.#unstarted,
      receiving: this._receives.size,
      runningMillis: running === 0 ? undefined : BigInt(running),
      drained: this.#held === 0 && this._receives.size === 0,
      instance: this.instance,
    };
  }

  /** @internal counts one more claim in state st. */
  _hold(parent: AbortSignal | undefined, st: 'started' | 'unstarted', value: unknown): Claim {
    const c = new Claim(this, value, st);
    this.#held++;
    if (st === 'unstarted') this.#unstarted++;
    this._claims.add(c);
    c._link(parent);
    if (this.#workCanceled) c._abort(new CanceledError());
    this._changed();
    return c;
  }

  /** @internal a claim moved from unstarted to started. */
  _started(): void {
    this.#unstarted--;
    this._changed();
  }

  /** @internal a claim ended; prev was its state before. */
  _ended(c: Claim, prev: ClaimState, byAgent: boolean): void {
    if (prev === 'unstarted' || prev === 'handedBack') this.#unstarted--;
    this._claims.delete(c);
    this.#held--;
    this._changed();
    if (this.#returned && !byAgent && this.#opts.returnClaims) {
      // Past the drain deadline's hand-back: the queue may still have this
      // message claimed (received after it, given up unfinished).
      this._returnAgain();
    }
  }

  // Leadership.

  #live(t: Term | undefined): t is Term {
    return t !== undefined && !t.controller.signal.aborted && this.clock.monotonic() < t.end;
  }

  /** The current term for lease; undefined when this worker does not lead it or the term has run out on the Agent's clock. */
  leader(lease: string): Leadership | undefined {
    const t = this.#leases.get(lease);
    return this.#live(t) ? t.lead : undefined;
  }

  /**
   * The terms this worker leads now among the Leases names, in the order of
   * names; with no names, every Lease it leads, sorted by name. For a shard
   * set pass the shard names (shardsFromEnv).
   */
  leading(...names: string[]): Leadership[] {
    if (names.length === 0) names = [...this.#leases.keys()].sort();
    const out: Leadership[] = [];
    for (const n of names) {
      const t = this.#leases.get(n);
      if (this.#live(t)) out.push(t.lead);
    }
    return out;
  }

  /**
   * Resolves at the next change of the Leases this worker leads: a term
   * begun (a grant with a new fencing token) or ended (revoked, replaced,
   * or run out on the Agent's clock). Renewals do not count. The Agent also
   * emits `'leadershipChanged'` then.
   */
  leadershipChanged(): Promise<void> {
    return new Promise((resolve) => this.#leadershipWaiters.push(resolve));
  }

  #leadershipChanged(): void {
    const ws = this.#leadershipWaiters;
    this.#leadershipWaiters = [];
    for (const w of ws) w();
    this.#emit('leadershipChanged');
  }

  /** Emits an event; a listener's error is logged, not thrown into the call that caused it (a sidecar's call must be answered). */
  #emit(event: 'stopping' | 'leadershipChanged'): void {
    try {
      this.emit(event);
    } catch (err) {
      this.log.error(`a '${event}' listener threw`, { error: err });
    }
  }

  /**
   * Starts leader work for lease. Its signal aborts when the term ends
   * (revoked, lost, or run out on the Agent's clock; reason
   * NotLeaderError), when signal aborts, and at done; call done when the
   * work is over (or `using w = agent.beginLeading(lease)`): the sidecar
   * frees the Lease only after every such done. Throws NotLeaderError when
   * this worker does not lead; once a revoke has been acknowledged, until
   * the next grant.
   */
  beginLeading(lease: string, signal?: AbortSignal): LeaderWork {
    const t = this.#leases.get(lease);
    if (!this.#live(t)) throw new NotLeaderError(`handoff: not the leader of Lease ${lease}`);
    t.work++;
    const c = new AbortController();
    const abort = (reason: unknown) => {
      if (!c.signal.aborted) c.abort(reason);
    };
    const unlinkParent = link(signal, abort);
    const unlinkTerm = link(t.controller.signal, abort);
    let finished = false;
    const done = () => {
      if (finished) return;
      finished = true;
      unlinkParent();
      unlinkTerm();
      t.work--;
      if (t.work === 0) this.#replaced.get(lease)?.delete(t);
      abort(new DOMException('leader work done', 'AbortError'));
      for (const w of [...t.waiters]) w();
    };
    const l = t.lead;
    return {
      lease: l.lease,
      fencingToken: l.fencingToken,
      until: l.until,
      signal: c.signal,
      done,
      [Symbol.dispose]: done,
    };
  }

  /**
   * @internal applies one message about lease if it is the latest: checks
   * and records seq, then starts or extends the term (grant set) or ends it.
   * Returns stale for a message not applied, and for a revoke the terms
   * whose leader work the ack waits for: the one it ended, and those a new
   * fencing token replaced while their work ran.
   */
  _applyLeadership(lease: string, seq: bigint, grant: Grant | undefined): { stale: boolean; ended?: Term[] } {
    const last = this.#sequences.get(lease);
    if (last !== undefined && seq <= last) return { stale: true };
    this.#sequences.set(lease, seq);
    if (grant) {
      this.#grant(lease, grant);
      return { stale: false };
    }
    const ended = this.#endTerm(lease);
    return { stale: false, ended: [...(this.#replaced.get(lease) ?? []), ...(ended ? [ended] : [])] };
  }

  /** Starts or extends a term. A new fencing token ends the old term. */
  #grant(lease: string, g: Grant): void {
    let t = this.#leases.get(lease);
    const ends: Term[] = [];
    if (t && (t.lead.fencingToken !== g.fencingToken || t.controller.signal.aborted)) {
      this.clock.clearTimeout(t.timer);
      t.timerPending = false;
      ends.push(t);
      if (t.work > 0) {
        const set = this.#replaced.get(lease) ?? new Set<Term>();
        set.add(t);
        this.#replaced.set(lease, set);
      }
      t = undefined;
    }
    const fresh = t === undefined;
    const left = g.end - this.clock.monotonic();
    const lead: Leadership = { lease, fencingToken: g.fencingToken, until: new Date(g.until) };
    if (!t) {
      const nt: Term = { lead, end: g.end, controller: new AbortController(), timer: undefined, timerPending: true, work: 0, waiters: new Set() };
      this.#leases.set(lease, nt);
      nt.timer = this.clock.setTimeout(() => this.#runOut(nt), left);
      this.log.info('leading', { lease, fencingToken: g.fencingToken, until: lead.until });
    } else {
      this.clock.clearTimeout(t.timer);
      t.lead = lead;
      t.end = g.end;
      t.timerPending = true;
      const tt = t;
      t.timer = this.clock.setTimeout(() => this.#runOut(tt), left);
    }
    // The old term's leader work is told last, with the state settled.
    for (const old of ends) old.controller.abort(new NotLeaderError(`handoff: the term of Lease ${lease} was replaced by a new one`));
    if (fresh) this.#leadershipChanged();
  }

  /** A term's timer: it ran out. */
  #runOut(t: Term): void {
    if (!t.timerPending) return;
    t.timerPending = false;
    if (!t.controller.signal.aborted) t.controller.abort(new NotLeaderError(`handoff: the term of Lease ${t.lead.lease} ran out`));
    this.#leadershipChanged();
  }

  /** Ends the term for lease and returns it (undefined if there is none): no leader work begins from now on. */
  #endTerm(lease: string): Term | undefined {
    const t = this.#leases.get(lease);
    if (!t) return undefined;
    const pending = t.timerPending;
    this.clock.clearTimeout(t.timer);
    t.timerPending = false;
    if (!t.controller.signal.aborted) t.controller.abort(new NotLeaderError(`handoff: the term of Lease ${lease} was revoked`));
    if (pending) this.#leadershipChanged(); // else the timer's end told it
    return t;
  }

  /** @internal waits, until signal aborts (rejecting with its reason), for the leader work of the ended terms to be done. */
  async _waitLeaderWork(lease: string, terms: Term[] | undefined, signal?: AbortSignal): Promise<void> {
    if (!terms || terms.length === 0) return;
    for (const t of terms) await this.#waitTerm(t, signal);
    this.log.info('leadership revoked', { lease });
  }

  async #waitTerm(t: Term, signal?: AbortSignal): Promise<void> {
    if (t.work > 0) {
      await new Promise<void>((resolve, reject) => {
        let unlink = (): void => {};
        const check = () => {
          if (t.work === 0) {
            t.waiters.delete(check);
            unlink();
            resolve();
          }
        };
        t.waiters.add(check);
        unlink = link(signal, (reason) => {
          t.waiters.delete(check);
          reject(reason);
        });
      });
    }
  }
}

/**
 * Receive is one wait for messages, begun by Agent.receive and ended by
 * end. While it is pending the worker is not drained, but nothing is in
 * flight: the wait holds no claim. Stop-claiming aborts its signal, so a
 * pending receive ends quickly, and the drain waits only for that.
 */
export class Receive implements Disposable {
  readonly #agent: Agent;
  readonly #parent: AbortSignal | undefined;
  readonly #c = new AbortController();
  readonly #unlink: () => void;
  #ended = false;

  /** @internal */
  constructor(agent: Agent, parent: AbortSignal | undefined) {
    this.#agent = agent;
    this.#parent = parent;
    this.#unlink = link(parent, (reason) => this._abort(reason));
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

  /** @internal */
  _abort(reason: unknown): void {
    if (!this.#c.signal.aborted) this.#c.abort(reason);
  }

  /**
   * One message received: held and started, in flight from now until
   * Claim.done, and the drain waits for it or the fallback hands it back.
   * Call it for every message received, before end, even after
   * stop-claiming (a message received in the race with it): it never
   * refuses. A batch calls it once per message.
   */
  hold(): Claim {
    return this.#agent._hold(this.#parent, 'started', undefined);
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
    const a = this.#agent;
    const c = a._hold(this.#parent, 'unstarted', value) as Claim<T>;
    if (a.isStopping) a._take([c]);
    return c;
  }

  /** The wait is over: call it once the messages received are held, or when none came. Aborts signal. Idempotent. */
  end(): void {
    if (this.#ended) return;
    this.#ended = true;
    this.#unlink();
    this.#agent._receives.delete(this);
    this.#agent._changed();
    this._abort(new DOMException('receive ended', 'AbortError'));
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
  readonly #agent: Agent;
  readonly #c = new AbortController();
  #unlink: () => void = () => {};
  /** The value given to holdUnstarted (undefined for hold and begin). */
  readonly value: T;
  /** @internal */ _state: ClaimState;
  /** @internal taken at stop-claiming to hand back */ _taken = false;
  /** @internal when it started, on the Agent's monotonic clock */ _startedAt = 0;

  /** @internal */
  constructor(agent: Agent, value: T, state: 'started' | 'unstarted') {
    this.#agent = agent;
    this.value = value;
    this._state = state;
    if (state === 'started') this._startedAt = agent.clock.monotonic();
  }

  /** @internal */
  _link(parent: AbortSignal | undefined): void {
    this.#unlink = link(parent, (reason) => this._abort(reason));
  }

  /** @internal */
  _abort(reason: unknown): void {
    if (!this.#c.signal.aborted) this.#c.abort(reason);
  }

  /**
   * The signal to work on the claim with. It aborts when the signal given to
   * receive (or begin) does, when the sidecar's `cancel` fallback cancels
   * in-flight work at the drain deadline (reason CanceledError), and at
   * done. Stop-claiming does not abort it.
   */
  get signal(): AbortSignal {
    return this.#c.signal;
  }

  /** Whether the claim is over (done, or handed back and ended by the Agent). */
  get isDone(): boolean {
    return this._state === 'done';
  }

  /**
   * Starts work on a claim held unstarted: from now on stop-claiming leaves
   * it to drain. Does nothing for a claim started already (hold, begin).
   * Throws HandedBackError if stop-claiming took the claim to hand it back
   * (drop the message: the Agent ends the claim), ClaimDoneError after done.
   */
  start(): void {
    if (this._taken) throw new HandedBackError();
    if (this._state === 'done') throw new ClaimDoneError();
    if (this._state === 'unstarted') {
      this._state = 'started';
      this._startedAt = this.#agent.clock.monotonic();
      this.#agent._started();
    }
  }

  /**
   * The claim is over: finished, or handed back to the queue. Call it once
   * the queue knows, not before. Idempotent; does nothing on a claim
   * stop-claiming took to hand back (the Agent ends it once handBack has).
   */
  done(): void {
    this._end(false);
  }

  /** done, for `using c = r.hold()`. */
  [Symbol.dispose](): void {
    this.done();
  }

  /** @internal ends the claim once: for the app (done), unless the Agent took it; for the Agent (byAgent), a claim it took. */
  _end(byAgent: boolean): void {
    const prev = this._state;
    if (prev === 'done' || this._taken !== byAgent) return;
    this._state = 'done';
    this.#unlink();
    this.#agent._ended(this, prev, byAgent);
    this._abort(new DOMException('claim done', 'AbortError'));
  }
}

function agentToken(o: AgentOptions, env: Record<string, string | undefined>): string {
  if (o.token) {
    try {
      checkToken(o.token);
    } catch (e) {
      throw new ConfigError(`handoff: options.token: ${(e as Error).message}`);
    }
    return o.token;
  }
  const file = o.tokenFile || env[tokenFileEnv];
  if (file) {
    try {
      return readTokenFile(file);
    } catch (e) {
      throw new ConfigError(`handoff: the pod's token (options.tokenFile or ${tokenFileEnv}): ${(e as Error).message}`, { cause: e });
    }
  }
  if (o.insecureNoToken) return '';
  throw new ConfigError(
    `handoff: no token configured: set the environment variable ${tokenFileEnv} to the pod's token file (the handoff injector sets it to ${tokenFile}), or options.tokenFile or options.token; options.insecureNoToken serves without one, for local development only`,
  );
}

function agentMaxTerm(o: AgentOptions, env: Record<string, string | undefined>): number {
  if (o.leaseDuration !== undefined) {
    if (!(o.leaseDuration > 0)) throw new ConfigError(`handoff: options.leaseDuration ${o.leaseDuration}: want milliseconds above 0, or unset for ${leaseDurationEnv}`);
    return o.leaseDuration;
  }
  const v = env[leaseDurationEnv];
  if (v === undefined || v === '') return maxLeaseDurationMillis;
  const d = parseGoDuration(v);
  if (d === undefined || !(d > 0) || d > maxLeaseDurationMillis) {
    throw new ConfigError(`handoff: environment variable ${leaseDurationEnv} ${JSON.stringify(v)}: want the sidecar's lease duration, a duration above 0 and at most 1h0m0s, like 15s`);
  }
  return d;
}
