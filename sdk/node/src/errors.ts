/**
 * The errors of package `@handoff-dev/worker`, as classes (check with
 * `instanceof`) with a stable `code`. They mirror the Go package worker's
 * sentinel errors: `ErrStopping`, `ErrCanceled`, `ErrHandedBack`,
 * `ErrClaimDone`, `ErrNotLeader`.
 */

/** The base class of this package's errors. */
export class HandoffError extends Error {
  /** A stable code, such as `HANDOFF_STOPPING`. */
  readonly code: string;
  constructor(code: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
    this.name = new.target.name;
  }
}

/**
 * Thrown by `Agent.receive` and `Agent.begin` once the worker must stop
 * claiming, and the reason of a `Receive.signal` aborted by stop-claiming
 * (Go: `worker.ErrStopping`).
 */
export class StoppingError extends HandoffError {
  constructor(message = 'handoff: claiming has stopped') {
    super('HANDOFF_STOPPING', message);
  }
}

/**
 * The reason of a `Claim.signal` aborted by the sidecar's `cancel` fallback
 * at the drain deadline (Go: `worker.ErrCanceled`).
 */
export class CanceledError extends HandoffError {
  constructor(message = 'handoff: in-flight work canceled at the drain deadline') {
    super('HANDOFF_CANCELED', message);
  }
}

/**
 * Thrown by `Claim.start` for a claim held unstarted (`Receive.holdUnstarted`)
 * that stop-claiming took to hand back (`AgentOptions.handBack`): the message
 * is the queue's again, maybe another worker's already; drop it (Go:
 * `worker.ErrHandedBack`).
 */
export class HandedBackError extends HandoffError {
  constructor(message = 'handoff: unstarted claim handed back at stop-claiming') {
    super('HANDOFF_HANDED_BACK', message);
  }
}

/** Thrown by `Claim.start` after `Claim.done` (Go: `worker.ErrClaimDone`). */
export class ClaimDoneError extends HandoffError {
  constructor(message = 'handoff: claim is done') {
    super('HANDOFF_CLAIM_DONE', message);
  }
}

/**
 * Thrown by `Agent.beginLeading` when this worker does not lead the Lease,
 * and the reason of a `LeaderWork.signal` aborted because its term ended
 * (revoked, replaced by a new term, or run out) (Go: `worker.ErrNotLeader`).
 */
export class NotLeaderError extends HandoffError {
  constructor(message = 'handoff: not the leader of this Lease') {
    super('HANDOFF_NOT_LEADER', message);
  }
}

/**
 * The rejection of `Agent.waitDrained` when nothing is held but a call of
 * `returnClaims` made after the return fallback began has not settled by
 * the time its signal aborted (its bound: 10 s for the Agent's own calls,
 * the signal given to `Agent.return` for that call's, which the server
 * aborts when the sidecar gives up on its `return` call). The worker may
 * exit; what that call has not handed back waits for its visibility
 * timeout (Go: `worker.ErrReturnOverdue`).
 */
export class ReturnOverdueError extends HandoffError {
  constructor(message = 'handoff: a hand-back after the return fallback did not return within its bound', options?: { cause?: unknown }) {
    super('HANDOFF_RETURN_OVERDUE', message, options);
  }
}

/**
 * Thrown by the `Agent` constructor and `Agent.listen` for a configuration
 * that cannot work: no token, a bad token file, a bad
 * `HANDOFF_LEASE_DURATION`, a bad address.
 */
export class ConfigError extends HandoffError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('HANDOFF_CONFIG', message, options);
  }
}
