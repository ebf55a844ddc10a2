// The narrow interface between the app API's server and the Agent: what
// server.ts needs to answer the sidecar's calls. The Agent implements it
// privately (it is no member of the Agent's public type) and hands it to
// handler and listen, so server.ts does not import agent.ts.
import type { Verifier } from './auth.js';
import type { Clock } from './clock.js';
import type { Grant } from './leadership.js';
import type { Logger, ReturnResult } from './options.js';
import type { DrainStatus } from './protocol.gen.js';

export type { Grant };

/** What the server of the app API calls on the Agent. */
export interface Dispatcher {
  /** Verifies each call's signature; undefined serves unsigned calls (insecureNoToken with no token configured). */
  readonly verifier: Verifier | undefined;
  /** The Agent's logger. */
  readonly log: Logger;
  /** The clock a grant's receipt is read on (monotonic and wall). */
  readonly clock: Clock;
  /** The longest grant accepted, in ms (the lease duration). */
  readonly maxTerm: number;
  /** Stops claiming (Agent.stopClaiming); the drain status at the moment claiming stopped (the first call's), or now (a later call's). */
  stopClaiming(): DrainStatus;
  /** The drain status now. */
  drainStatus(): DrainStatus;
  /** Waits until drained; rejects with signal's reason if signal aborts first. */
  waitDrained(signal: AbortSignal): Promise<void>;
  /** The drain deadline's fallback (Agent.return); never rejects. */
  return(options: { cancel?: boolean; cancelWaitMillis?: number; signal?: AbortSignal }): Promise<ReturnResult>;
  /**
   * Applies one leadership message about lease with sequence seq if it is
   * the latest (grant set: a grant; undefined: a revoke), all at once.
   * stale: not applied. waitLeaderWork waits, until signal aborts
   * (rejecting with its reason), for the leader work of the terms a revoke
   * ended to be done; it resolves at once for a grant or a stale message.
   */
  setLeadership(lease: string, seq: bigint, grant: Grant | undefined): { stale: boolean; waitLeaderWork(signal: AbortSignal): Promise<void> };
}
