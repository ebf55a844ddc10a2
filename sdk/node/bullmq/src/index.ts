/**
 * `@handoff-dev/bullmq`: BullMQ workers as handoff workers (issue 23). Each job
 * a BullMQ Worker fetches is a claim of a `@handoff-dev/worker` Agent, so the
 * sidecar's drain sees BullMQ's jobs, and at the drain deadline the jobs
 * still running go back to waiting at once, for another worker to take in
 * milliseconds instead of after their lock runs out and a stalled check
 * finds them.
 *
 * ```ts
 * import { BullMQAdapter } from '@handoff-dev/bullmq';
 *
 * const adapter = new BullMQAdapter();        // the Agent: $HANDOFF_TOKEN_FILE
 * adapter.worker('emails', async (job, _token, signal) => {
 *   await send(job.data, signal);              // aborted at the cancel fallback and at the hand-back
 * }, { connection, concurrency: 8 });
 * await adapter.listen();                      // $HANDOFF_APP_URL
 * ```
 *
 * BullMQ fetches jobs itself (its Worker's main loop, and the next job
 * fetched in the same call that completes one), so the adapter does not
 * loop: `HandoffWorker` is BullMQ's `Worker` with its fetch and its
 * processing seen by the Agent.
 *
 * - A fetch (`Worker.moveToActive`, and a completion that fetches the next
 *   job) is a pending receive (`Agent.receive`); each job it moves to active
 *   is held unstarted (`Receive.holdUnstarted`) until BullMQ calls the
 *   processor, so a job fetched in the race with stop-claiming is counted.
 * - Stop-claiming: from then on a fetch returns no job without asking Redis,
 *   a completion fetches none, the worker is paused (`Worker.pause(true)`:
 *   active jobs go on), and its blocking connection is cut, so the
 *   `BZPOPMIN` it may be waiting in neither takes a job nor eats the queue's
 *   marker that would wake another worker.
 * - Jobs fetched and not started are handed back at once (`handBack`): moved
 *   back to waiting with their lock token (`Job.moveToWait(token)`).
 * - A claim is done once BullMQ has written the job's result (its
 *   `processJob` returned: completed, failed, or moved on by the processor),
 *   not when the processor returns.
 * - At the drain deadline (`returnClaims`) each job whose processor has not
 *   returned is moved back to waiting with its token, at the tail BullMQ
 *   fetches from next, and the queue's marker wakes a blocked worker; the
 *   processor's signal aborts (a `HandedBackError`). The lock is gone with
 *   the move, so BullMQ refuses the result the processor may still return
 *   (`Missing lock` or `Lock mismatch`: the job is neither completed nor
 *   failed by this worker). Jobs whose processor has returned are waited
 *   for: their result is being written.
 * - The cancel fallback aborts every processor's signal (a `CanceledError`);
 *   a processor that then throws has its job moved back to waiting, not
 *   failed (no attempt counted), and `returned` counts it.
 *
 * Completion in BullMQ is fenced by the lock token, but the processor's
 * effect is not: work that outlives its hand-back may apply its effect
 * while another worker runs the job. Make the effect idempotent (a key per
 * job id set with `SET NX` in the same step as the effect, as
 * `examples/bullmq-worker.mjs` does).
 * @module
 */
import { EventEmitter } from 'node:events';
import type { URL } from 'node:url';
import { ErrorCode, Worker, type Job, type Processor, type WorkerOptions } from 'bullmq';
import {
  Agent,
  CanceledError,
  ClaimDoneError,
  HandedBackError,
  StoppingError,
  type AgentOptions,
  type AppServer,
  type Claim,
  type Logger,
  type Receive,
  type ReturnClaimsError,
} from '@handoff-dev/worker';

/** Options of a BullMQAdapter: those of its Agent, but the hand-backs, which are the adapter's. */
export type BullMQAdapterOptions = Omit<AgentOptions, 'returnClaims' | 'handBack'>;

/**
 * Why a job went back to waiting: `unstarted`, fetched and not started at
 * stop-claiming; `deadline`, still running at the drain deadline;
 * `canceled`, its processor ended by the cancel fallback.
 */
export type HandBackReason = 'unstarted' | 'deadline' | 'canceled';

/**
 * The processor of a HandoffWorker: BullMQ's `Processor`, whose signal is
 * always given (it aborts at the cancel fallback, at the hand-back, and at
 * BullMQ's `cancelJob`). A BullMQ `Processor` is one.
 */
export type HandoffProcessor<DataType = any, ResultType = any, NameType extends string = string> = (
  job: Job<DataType, ResultType, NameType>,
  token: string,
  signal: AbortSignal,
) => Promise<ResultType>;

/** The events of a BullMQAdapter. */
export interface BullMQAdapterEvents {
  /** A job this worker held was moved back to waiting, for another worker to take. */
  handedBack: [job: Job, reason: HandBackReason];
}

/** The error codes of BullMQ's scripts that say the job is no longer this worker's: gone, its lock gone, or another's. */
const notOurs = new Set<number>([ErrorCode.JobNotExist, ErrorCode.JobLockNotExist, ErrorCode.JobLockMismatch]);

const nopLogger: Logger = { info() {}, error() {} };

type State = 'fetched' | 'started' | 'worked' | 'back' | 'done';

/** One job fetched by a HandoffWorker: its claim until BullMQ has written its result, or until it is handed back. */
interface Entry {
  worker: HandoffWorker<any, any, any>;
  job: Job;
  token: string;
  claim: Claim<Entry>;
  state: State;
  /** Aborts the processor's signal; set while the processor runs. */
  work?: AbortController;
  finished: Promise<void>;
  resolveFinished: () => void;
}

/**
 * BullMQAdapter is the handoff side of a process's BullMQ workers: it owns
 * the Agent (`agent`, for `listen`, the drain counts and leader work) and
 * makes the workers (`worker`), whose jobs are the Agent's claims. Make one
 * per process, and every BullMQ Worker of the process through it.
 *
 * Events: `'handedBack'` (job, reason), for each job moved back to waiting.
 */
export class BullMQAdapter extends EventEmitter<BullMQAdapterEvents> {
  /** The Agent whose claims the jobs are: serve it to the sidecar (`listen`); its leader API (`beginLeading`) is there for leader work. */
  readonly agent: Agent;
  readonly #log: Logger;
  readonly #workers = new Set<HandoffWorker<any, any, any>>();
  /** @internal the jobs held: fetched, and not yet written or handed back. */
  readonly _entries = new Set<Entry>();
  /** Jobs handed back because the cancel fallback ended their work, since the last returnClaims: `returned` counts them. */
  #canceledBack = 0;

  /**
   * Makes the Agent (options as `new Agent`'s, but returnClaims and
   * handBack, which are the adapter's). Throws the Agent's ConfigError
   * without the pod's token ($HANDOFF_TOKEN_FILE) unless insecureNoToken.
   */
  constructor(options: BullMQAdapterOptions = {}) {
    super();
    const opts = options as AgentOptions;
    if (opts.returnClaims !== undefined || opts.handBack !== undefined) {
      throw new TypeError('@handoff-dev/bullmq: options.returnClaims and options.handBack are the adapter\'s own: leave them unset');
    }
    this.#log = options.logger ?? nopLogger;
    this.agent = new Agent({
      ...options,
      returnClaims: (signal) => this.#returnClaims(signal),
      handBack: (claims, signal) => this.#handBackUnstarted(claims as Claim<Entry>[], signal),
    });
    this.agent.on('stopping', () => {
      for (const w of this.#workers) w._stopClaiming();
    });
  }

  /**
   * Makes a BullMQ Worker of queue `name` whose jobs are claims of the
   * Agent: BullMQ's `new Worker(name, processor, opts)`, the same
   * arguments. It starts (unless `opts.autorun` is false: then call `run`)
   * and works until stop-claiming. After stop-claiming it is made paused.
   */
  worker<DataType = any, ResultType = any, NameType extends string = string>(
    name: string,
    processor: HandoffProcessor<DataType, ResultType, NameType> | string | URL | null | undefined,
    opts: WorkerOptions,
  ): HandoffWorker<DataType, ResultType, NameType> {
    return new HandoffWorker<DataType, ResultType, NameType>(this, name, processor, opts);
  }

  /** The workers made through this adapter and not closed. */
  get workers(): HandoffWorker<any, any, any>[] {
    return [...this.#workers];
  }

  /** Serves the Agent to the sidecar: `agent.listen(options)` (on `$HANDOFF_APP_URL` by default). */
  listen(options: { url?: string; signal?: AbortSignal } = {}): Promise<AppServer> {
    return this.agent.listen(options);
  }

  /**
   * Closes every worker (BullMQ's `Worker.close(force)`: without force it
   * waits for the jobs its processors still run, so bound the wait with
   * `timeout` in ms) and resolves once they are closed or the timeout has
   * passed; false then. Call it when the process leaves (SIGTERM), after
   * the sidecar's sequence.
   */
  async close(options: { force?: boolean; timeout?: number } = {}): Promise<boolean> {
    const closing = Promise.allSettled(this.workers.map((w) => w.close(options.force)));
    if (options.timeout === undefined) {
      await closing;
      return true;
    }
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<false>((resolve) => {
      timer = setTimeout(() => resolve(false), options.timeout);
    });
    const res = await Promise.race([closing.then(() => true as const), timedOut]);
    clearTimeout(timer);
    return res;
  }

  /** @internal */
  _add(w: HandoffWorker<any, any, any>): void {
    this.#workers.add(w);
    w.once('closed', () => this.#workers.delete(w));
  }

  /** @internal */
  _logError(msg: string, fields: Record<string, unknown>): void {
    this.#log.error(msg, fields);
  }

  /** AgentOptions.handBack: the jobs fetched and not started go back to waiting. */
  async #handBackUnstarted(claims: Claim<Entry>[], signal: AbortSignal): Promise<void> {
    const { errors } = await this._handBack(
      claims.map((c) => c.value),
      'unstarted',
      signal,
    );
    if (errors.length > 0) throw new AggregateError(errors, `@handoff-dev/bullmq: ${errors.length} unstarted jobs not moved back to waiting`);
  }

  /**
   * AgentOptions.returnClaims: every job whose processor has not returned
   * goes back to waiting; the jobs whose result BullMQ is writing are
   * waited for. Resolves to how many jobs were moved back, with those the
   * cancel fallback ended since the last call.
   */
  async #returnClaims(signal: AbortSignal): Promise<number> {
    const running: Entry[] = [];
    const writing: Entry[] = [];
    for (const e of this._entries) {
      if (e.state === 'fetched' || e.state === 'started') running.push(e);
      else if (e.state === 'worked') writing.push(e);
    }
    const { returned, errors } = await this._handBack(running, 'deadline', signal);
    let n = returned;
    if (writing.length > 0) {
      try {
        await raceSignal(Promise.all(writing.map((e) => e.finished)), signal);
      } catch (err) {
        errors.push(new Error(`@handoff-dev/bullmq: the results of ${writing.length} jobs whose processor returned not written by BullMQ: ${String(err)}`, { cause: err }));
      }
    }
    n += this.#canceledBack;
    this.#canceledBack = 0;
    if (errors.length > 0) {
      const err: ReturnClaimsError = new AggregateError(errors, `@handoff-dev/bullmq: ${errors.length} jobs not handed back`);
      err.returned = n;
      throw err;
    }
    return n;
  }

  /**
   * @internal moves the jobs of entries back to waiting with their lock
   * tokens (`Job.moveToWait(token)`), those not handed back already, and
   * aborts their processors' signals. A job whose lock is gone or is
   * another's (BullMQ's codes -1, -2, -6) is no longer this worker's: not
   * counted, not an error. On any other error the entry stays as it was,
   * for a later call.
   */
  async _handBack(entries: Entry[], reason: HandBackReason, signal?: AbortSignal): Promise<{ returned: number; errors: unknown[] }> {
    const mine: Array<{ e: Entry; prev: State }> = [];
    for (const e of entries) {
      if (e.state === 'back' || e.state === 'done') continue;
      if (reason === 'deadline' && e.state === 'worked') continue;
      mine.push({ e, prev: e.state });
      e.state = 'back'; // before any await: no other call moves it too
    }
    const abortReason =
      reason === 'deadline'
        ? new HandedBackError('handoff: job handed back at the drain deadline (moved back to waiting)')
        : new HandedBackError('handoff: job handed back (moved back to waiting)');
    let returned = 0;
    const errors: unknown[] = [];
    const moves = mine.map(async ({ e, prev }) => {
      if (reason === 'deadline') e.work?.abort(abortReason);
      try {
        await e.job.moveToWait(e.token);
      } catch (err) {
        const code = (err as { code?: unknown } | undefined)?.code;
        if (typeof code === 'number' && notOurs.has(code)) {
          this.#log.info('job not handed back: no longer this worker\'s', { jobId: e.job.id, queue: e.job.queueName, reason, error: String(err) });
          e.worker._untrack(e);
          if (prev === 'fetched') this._drop(e);
          return;
        }
        e.state = prev;
        errors.push(err);
        return;
      }
      returned++;
      e.worker._untrack(e);
      if (prev === 'fetched') this._drop(e);
      this.#log.info('job handed back', { jobId: e.job.id, queue: e.job.queueName, reason });
      try {
        this.emit('handedBack', e.job, reason);
      } catch (err) {
        this.#log.error("a 'handedBack' listener threw", { error: err });
      }
    });
    if (signal) {
      try {
        await raceSignal(Promise.all(moves), signal);
      } catch (err) {
        errors.push(err);
      }
    } else {
      await Promise.all(moves);
    }
    return { returned, errors };
  }

  /** @internal a job the cancel fallback ended was moved back to waiting: the next returnClaims counts it. */
  _canceledBack(): void {
    this.#canceledBack++;
  }

  /** @internal forgets an entry: its claim is over. */
  _drop(e: Entry): void {
    this._entries.delete(e);
    e.resolveFinished();
  }
}

/**
 * HandoffWorker is BullMQ's Worker with its jobs as claims of a
 * BullMQAdapter's Agent (see the module's documentation). Make it with
 * `adapter.worker(name, processor, opts)` or `new HandoffWorker(adapter,
 * name, processor, opts)`. The processor gets BullMQ's arguments `(job,
 * token, signal)`: the signal aborts at the cancel fallback (reason
 * CanceledError), when the job is handed back at the drain deadline (reason
 * HandedBackError), and at BullMQ's `cancelJob` (if the processor declares
 * it). Process jobs through the processor: jobs fetched by hand
 * (`getNextJob`) are claims the adapter hands back at stop-claiming.
 */
export class HandoffWorker<DataType = any, ResultType = any, NameType extends string = string> extends Worker<DataType, ResultType, NameType> {
  /** The adapter whose Agent holds this worker's jobs. */
  readonly adapter: BullMQAdapter;
  readonly #entries = new WeakMap<Job, Entry>();

  constructor(
    adapter: BullMQAdapter,
    name: string,
    processor: HandoffProcessor<DataType, ResultType, NameType> | string | URL | null | undefined,
    opts: WorkerOptions,
  ) {
    // BullMQ's constructor would start the main loop before this one has
    // set its fields: it is started below instead. The processor gets a
    // signal always (callProcessJob).
    super(name, processor as Processor<DataType, ResultType, NameType> | string | URL | null | undefined, { ...opts, autorun: false });
    this.opts.autorun = opts.autorun ?? true;
    this.adapter = adapter;
    adapter._add(this);
    if (adapter.agent.isStopping) {
      this._stopClaiming();
    } else if (processor && this.opts.autorun) {
      this.run().catch((err: unknown) => this.emit('error', err as Error));
    }
  }

  /**
   * BullMQ's fetch, as a receive of the Agent: after stop-claiming it asks
   * Redis for nothing and returns no job; a job it moves to active is held
   * unstarted until its processor starts.
   */
  protected override async moveToActive(token: string, name?: string): Promise<Job<DataType, ResultType, NameType>> {
    let r: Receive;
    try {
      r = this.adapter.agent.receive();
    } catch (err) {
      if (err instanceof StoppingError) return undefined as unknown as Job<DataType, ResultType, NameType>;
      throw err;
    }
    try {
      const job = await super.moveToActive(token, name);
      if (job) this.#hold(r, job, token);
      return job;
    } finally {
      r.end();
    }
  }

  /**
   * BullMQ's processing of one job, as the job's claim: started here (a job
   * handed back at stop-claiming is dropped, its processor not called) and
   * done once BullMQ has written the result. A completion that fetches the
   * next job does it as a receive of the Agent, none after stop-claiming;
   * the job it fetches is held unstarted before this resolves.
   */
  override async processJob(
    job: Job<DataType, ResultType, NameType>,
    token: string,
    fetchNextCallback: () => boolean = () => true,
  ): Promise<void | Job<DataType, ResultType, NameType>> {
    const e = this.#entries.get(job);
    if (!e || e.state === 'done') return super.processJob(job, token, fetchNextCallback);
    try {
      e.claim.start();
    } catch (err) {
      if (err instanceof HandedBackError || err instanceof ClaimDoneError) return undefined;
      throw err;
    }
    if (e.state === 'fetched') e.state = 'started';
    const receives: Receive[] = [];
    const fetchNext = (): boolean => {
      if (!fetchNextCallback() || this.isPaused() || this.closing) return false;
      try {
        receives.push(this.adapter.agent.receive());
        return true;
      } catch (err) {
        if (err instanceof StoppingError) return false;
        throw err;
      }
    };
    let next: void | Job<DataType, ResultType, NameType> = undefined;
    try {
      next = await super.processJob(job, token, fetchNext);
      return next;
    } finally {
      if (next && !this.#entries.has(next)) {
        const r = receives[receives.length - 1];
        if (r) this.#hold(r, next, next.token ?? token);
        else this.adapter._logError('a job fetched without a receive: BullMQ fetched it with no fetch-next asked', { jobId: next.id });
      }
      for (const r of receives) r.end();
      if ((e.state as State) !== 'done') {
        e.state = 'done';
        this.adapter._drop(e);
        e.claim.done();
      }
    }
  }

  /**
   * Calls the processor with a signal that also aborts at the cancel
   * fallback and at the hand-back. Work the cancel fallback ended that
   * throws has its job moved back to waiting before BullMQ sees the error,
   * so BullMQ neither fails nor retries it (its lock is gone).
   */
  protected override async callProcessJob(job: Job<DataType, ResultType, NameType>, token: string, signal?: AbortSignal): Promise<ResultType> {
    const e = this.#entries.get(job);
    if (!e) return super.callProcessJob(job, token, signal);
    if (e.state === 'back') throw new HandedBackError('handoff: job handed back at the drain deadline before its processor started');
    const work = new AbortController();
    e.work = work;
    const abort = (reason: unknown) => {
      if (!work.signal.aborted) work.abort(reason);
    };
    const onBullMQ = () => abort(signal?.reason);
    const onClaim = () => {
      // The claim's signal aborts at the cancel fallback (CanceledError),
      // and at done, which is after this returns.
      abort(e.claim.signal.reason);
    };
    signal?.addEventListener('abort', onBullMQ, { once: true });
    e.claim.signal.addEventListener('abort', onClaim, { once: true });
    if (signal?.aborted) onBullMQ();
    if (e.claim.signal.aborted) onClaim();
    try {
      return await super.callProcessJob(job, token, work.signal);
    } catch (err) {
      if (work.signal.reason instanceof CanceledError && e.state === 'started') {
        const { returned } = await this.adapter._handBack([e], 'canceled');
        if (returned > 0) this.adapter._canceledBack();
      }
      throw err;
    } finally {
      signal?.removeEventListener('abort', onBullMQ);
      e.claim.signal.removeEventListener('abort', onClaim);
      e.work = undefined;
      if (e.state === 'started') e.state = 'worked';
    }
  }

  /**
   * BullMQ's resume, but after stop-claiming: the worker then stays paused
   * (it may fetch nothing more, and its fetches would return no job).
   */
  override async resume(): Promise<void> {
    if (this.adapter.agent.isStopping) {
      this.adapter._logError('resume after stop-claiming ignored: the worker stays paused', { queue: this.name });
      return;
    }
    return super.resume();
  }

  /** @internal at stop-claiming: paused (active jobs go on), and the blocking wait for a job cut off. */
  _stopClaiming(): void {
    void (async () => {
      try {
        await this.pause(true);
        // A BZPOPMIN under way would take the queue's marker, which wakes
        // the other workers when a job is moved back to waiting.
        await this.backend.disconnectBlocking(false);
      } catch (err) {
        this.adapter._logError('pausing the BullMQ worker at stop-claiming failed', { queue: this.name, error: err });
      }
    })();
  }

  /** @internal stops BullMQ's lock renewal of a job handed back: its lock is gone, renewing would fail. */
  _untrack(e: Entry): void {
    this.lockManager.untrackJob(e.job.id as string);
  }

  /** Holds job unstarted, as one received by r. */
  #hold(r: Receive, job: Job, token: string): void {
    let resolveFinished!: () => void;
    const finished = new Promise<void>((resolve) => {
      resolveFinished = resolve;
    });
    // The claim is set below: holdUnstarted takes the entry as its value.
    const e = { worker: this, job, token, state: 'fetched', finished, resolveFinished } as Omit<Entry, 'claim'> as Entry;
    this.#entries.set(job, e);
    this.adapter._entries.add(e);
    // Held after stop-claiming (a completion's fetch in the race), the
    // Agent takes it at once and hands it back.
    e.claim = r.holdUnstarted(e);
  }
}

/** Resolves as p does, or rejects with signal's reason once it aborts. */
function raceSignal<T>(p: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener('abort', onAbort);
        resolve(v);
      },
      (err: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(err);
      },
    );
  });
}
