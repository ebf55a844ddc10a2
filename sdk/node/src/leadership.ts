// Leadership of Leases, as the sidecar grants and revokes it: the Agent's
// terms, timed on its own clock, and the leader work begun in each.
import type { Clock } from './clock.js';
import { NotLeaderError } from './errors.js';
import type { Logger } from './options.js';
import { link } from './signals.js';

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

/** A grant as Leases.apply takes it. */
export interface Grant {
  fencingToken: bigint;
  /** The end of the term on the clock's monotonic reading. */
  end: number;
  /** The same end on the wall clock, Unix ms. */
  until: number;
}

/** The outcome of a leadership message: stale when not applied; for a revoke, the terms whose leader work its answer waits for. */
export interface Applied {
  stale: boolean;
  ended?: Term[];
}

/**
 * Leases is the Agent's record of the Leases it leads: a term per Lease,
 * the last sequence applied, the terms replaced while their leader work
 * ran, and who waits for the next change.
 */
export class Leases {
  readonly #clock: Clock;
  readonly #log: Logger;
  readonly #onChange: () => void;
  #leases = new Map<string, Term>();
  /** Terms a grant with a new fencing token replaced while their leader work ran, by Lease: a revoke waits for them too. */
  #replaced = new Map<string, Set<Term>>();
  #sequences = new Map<string, bigint>();
  #leadershipWaiters: Array<() => void> = [];

  /** onChange is called at each change of the Leases led (after the waiters of changed are woken): a term begun or ended. */
  constructor(clock: Clock, log: Logger, onChange: () => void) {
    this.#clock = clock;
    this.#log = log;
    this.#onChange = onChange;
  }

  #live(t: Term | undefined): t is Term {
    return t !== undefined && !t.controller.signal.aborted && this.#clock.monotonic() < t.end;
  }

  /** Agent.leader: the live term of lease, if any. */
  leader(lease: string): Leadership | undefined {
    const t = this.#leases.get(lease);
    return this.#live(t) ? t.lead : undefined;
  }

  /** Agent.leading: the live terms among names (all, sorted, when none), in the order of names. */
  leading(...names: string[]): Leadership[] {
    if (names.length === 0) names = [...this.#leases.keys()].sort();
    const out: Leadership[] = [];
    for (const n of names) {
      const t = this.#leases.get(n);
      if (this.#live(t)) out.push(t.lead);
    }
    return out;
  }

  /** Agent.leadershipChanged: resolves at the next term begun or ended. */
  leadershipChanged(): Promise<void> {
    return new Promise((resolve) => this.#leadershipWaiters.push(resolve));
  }

  #leadershipChanged(): void {
    const ws = this.#leadershipWaiters;
    this.#leadershipWaiters = [];
    for (const w of ws) w();
    this.#onChange();
  }

  /** Agent.beginLeading: leader work in the live term of lease; throws NotLeaderError without one. */
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
   * Applies one message about lease if it is the latest: checks and
   * records seq, then starts or extends the term (grant set) or ends it.
   * Returns stale for a message not applied, and for a revoke the terms
   * whose leader work the ack waits for: the one it ended, and those a new
   * fencing token replaced while their work ran.
   */
  apply(lease: string, seq: bigint, grant: Grant | undefined): Applied {
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
      this.#clock.clearTimeout(t.timer);
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
    const left = g.end - this.#clock.monotonic();
    const lead: Leadership = { lease, fencingToken: g.fencingToken, until: new Date(g.until) };
    if (!t) {
      const nt: Term = { lead, end: g.end, controller: new AbortController(), timer: undefined, timerPending: true, work: 0, waiters: new Set() };
      this.#leases.set(lease, nt);
      nt.timer = this.#clock.setTimeout(() => this.#runOut(nt), left);
      this.#log.info('leading', { lease, fencingToken: g.fencingToken, until: lead.until });
    } else {
      this.#clock.clearTimeout(t.timer);
      t.lead = lead;
      t.end = g.end;
      t.timerPending = true;
      const tt = t;
      t.timer = this.#clock.setTimeout(() => this.#runOut(tt), left);
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
    this.#clock.clearTimeout(t.timer);
    t.timerPending = false;
    if (!t.controller.signal.aborted) t.controller.abort(new NotLeaderError(`handoff: the term of Lease ${lease} was revoked`));
    if (pending) this.#leadershipChanged(); // else the timer's end told it
    return t;
  }

  /** Waits, until signal aborts (rejecting with its reason), for the leader work of the ended terms to be done. */
  async waitLeaderWork(lease: string, terms: Term[] | undefined, signal?: AbortSignal): Promise<void> {
    if (!terms || terms.length === 0) return;
    for (const t of terms) await this.#waitTerm(t, signal);
    this.#log.info('leadership revoked', { lease });
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
