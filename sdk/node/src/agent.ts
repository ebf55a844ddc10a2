// The Agent, the worker's end of the handoff protocol: its public API,
// over the claims' Ledger and the Drain (claims.ts, drain.ts), the Leases
// it leads (leadership.ts), and the server of the app API (server.ts),
// which reaches it through a Dispatcher the Agent makes and keeps private.
import { randomBytes } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { Verifier } from './auth.js';
import type { Claim, Ledger, Receive } from './claims.js';
import { realClock, type Clock } from './clock.js';
import type { Dispatcher } from './dispatcher.js';
import { Drain } from './drain.js';
import { StoppingError } from './errors.js';
import { Leases, type Leadership, type LeaderWork } from './leadership.js';
import { agentMaxTerm, agentToken, nopLogger, type AgentOptions, type Logger, type ReturnResult } from './options.js';
import type { DrainStatus } from './protocol.gen.js';
import { handler, listen, type AppHandler, type AppServer } from './server.js';

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
  /** The longest grant accepted, in ms: the lease duration (AgentOptions.leaseDuration, $HANDOFF_LEASE_DURATION, else 1h). */
  readonly maxTerm: number;
  /** The clock of terms and of the age of work (AgentOptions.clock). */
  readonly clock: Clock;
  readonly #log: Logger;
  readonly #stop = new AbortController();
  #resolveStopping!: () => void;
  readonly #drain: Drain;
  readonly #ledger: Ledger;
  readonly #leases: Leases;
  /** What the server of the app API calls: the Agent's internals, outside its public type. */
  readonly #dispatcher: Dispatcher;

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
    const env = options.env ?? process.env;
    const token = agentToken(options, env);
    this.maxTerm = agentMaxTerm(options, env);
    const verifier = token === '' ? undefined : new Verifier(token);
    this.clock = options.clock ?? realClock;
    const log = options.logger ?? nopLogger;
    this.#log = log;
    this.stoppingSignal = this.#stop.signal;
    this.stopping = new Promise((resolve) => {
      this.#resolveStopping = resolve;
    });
    const drain = new Drain(options, this.clock, log, this.instance, (reason) => {
      this.#resolveStopping();
      this.#stop.abort(reason);
      this.#emit('stopping');
    });
    const leases = new Leases(this.clock, log, () => this.#emit('leadershipChanged'));
    this.#drain = drain;
    this.#ledger = drain.ledger;
    this.#leases = leases;
    this.#dispatcher = {
      verifier,
      log,
      clock: this.clock,
      maxTerm: this.maxTerm,
      stopClaiming: () => drain.stopClaiming(),
      drainStatus: () => drain.status(),
      waitDrained: (signal) => drain.ledger.waitDrained(signal),
      return: (opts) => this.return(opts),
      setLeadership: (lease, seq, grant) => {
        const { stale, ended } = leases.apply(lease, seq, grant);
        return { stale, waitLeaderWork: (signal) => leases.waitLeaderWork(lease, ended, signal) };
      },
    };
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
    return listen(this.#dispatcher, options);
  }

  /** The app API as a request listener, for a server of your own: `http.createServer(agent.handler())`. */
  handler(): AppHandler {
    return handler(this.#dispatcher);
  }

  /** Whether stop-claiming has come. */
  get isStopping(): boolean {
    return this.#drain.stopped;
  }

  /** The claims held: made by hold, holdUnstarted (or begin) and not yet done, started or not. Pending receives are not counted. */
  get inFlight(): number {
    return this.#ledger.held;
  }

  /** The claims among inFlight held unstarted and not yet started, or handed back and ended. */
  get unstarted(): number {
    return this.#ledger.unstarted;
  }

  /** The receives begun and not ended. */
  get receiving(): number {
    return this.#ledger.receives.size;
  }

  /**
   * Begins a wait for messages: wait with the Receive's signal (a long poll,
   * a subscription, the pause between polls), call hold for each message
   * received, then end. Throws StoppingError once the worker must stop
   * claiming, and signal's reason if signal has aborted. The signal given
   * is the parent of the claims held: they end when it aborts.
   */
  receive(signal?: AbortSignal): Receive {
    if (this.#drain.stopped) throw new StoppingError();
    if (signal?.aborted) throw signal.reason;
    return this.#ledger.receive(signal);
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
    if (this.#drain.stopped) throw new StoppingError();
    return this.#ledger.hold(signal, 'started', undefined).claim;
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
    this.#drain.stopClaiming();
  }

  /**
   * Waits until the worker is drained and every claim it ended since the
   * return fallback began has been handed back, and resolves: a worker may
   * exit once it resolves, and leaves nothing claimed. Drained is no claim
   * held and no receive pending, as the sidecar sees it; from the return
   * fallback on (return) it also waits for return to settle and for each
   * call of returnClaims asked for since (one after each claim ended) to
   * settle. Before stop-claiming an idle worker usually has a receive
   * pending, so it is not drained.
   *
   * Rejects with signal's reason if signal aborts first. It waits for a
   * call of returnClaims under way only until that call's signal aborts
   * (its bound: 10 s for the Agent's own calls, the signal given to return
   * for that call's, which the server aborts when the sidecar gives up on
   * its `return` call; without one, no bound but signal's): then, with
   * nothing held, it rejects with a ReturnOverdueError, and what the call
   * has not handed back waits for its visibility timeout.
   */
  waitDrained(signal?: AbortSignal): Promise<void> {
    return this.#drain.waitDrained(signal);
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
  return(options: { cancel?: boolean; cancelWaitMillis?: number; signal?: AbortSignal } = {}): Promise<ReturnResult> {
    return this.#drain.return(options);
  }

  /** The drain status, as the sidecar reads it. */
  drainStatus(): DrainStatus {
    return this.#drain.status();
  }

  // Leadership.

  /** The current term for lease; undefined when this worker does not lead it or the term has run out on the Agent's clock. */
  leader(lease: string): Leadership | undefined {
    return this.#leases.leader(lease);
  }

  /**
   * The terms this worker leads now among the Leases names, in the order of
   * names; with no names, every Lease it leads, sorted by name. For a shard
   * set pass the shard names (shardsFromEnv).
   */
  leading(...names: string[]): Leadership[] {
    return this.#leases.leading(...names);
  }

  /**
   * Resolves at the next change of the Leases this worker leads: a term
   * begun (a grant with a new fencing token) or ended (revoked, replaced,
   * or run out on the Agent's clock). Renewals do not count. The Agent also
   * emits `'leadershipChanged'` then.
   */
  leadershipChanged(): Promise<void> {
    return this.#leases.leadershipChanged();
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
    return this.#leases.beginLeading(lease, signal);
  }

  /** Emits an event; a listener's error is logged, not thrown into the call that caused it (a sidecar's call must be answered). */
  #emit(event: 'stopping' | 'leadershipChanged'): void {
    try {
      this.emit(event);
    } catch (err) {
      this.#log.error(`a '${event}' listener threw`, { error: err });
    }
  }
}
