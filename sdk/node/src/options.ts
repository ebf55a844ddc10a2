// The Agent's options and what it reads from the environment: the pod's
// token, the lease duration that bounds grants, the shard set.
import { checkToken, readTokenFile, tokenFile, tokenFileEnv } from './auth.js';
import type { Clock } from './clock.js';
import { ConfigError } from './errors.js';
import type { Claim } from './claims.js';

/** The environment variable with the sidecar's lease duration (a Go duration, like `15s`), which bounds the grants the app accepts. */
export const leaseDurationEnv = 'HANDOFF_LEASE_DURATION';
/** The environment variable with the pod's shard set (Lease names, comma-separated). */
export const shardsEnv = 'HANDOFF_SHARDS';
/** The longest lease duration the sidecar accepts, in milliseconds (1h): the bound on grants without HANDOFF_LEASE_DURATION. */
export const maxLeaseDurationMillis = 3_600_000;

/** What the Agent logs: info and error lines with fields. The default discards them. */
export interface Logger {
  info(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
}

/** The default Logger: it discards every line. */
export const nopLogger: Logger = { info() {}, error() {} };

/**
 * An error returnClaims throws may carry how many claims it handed back
 * before it failed: `returned` is then answered with it, as the Go
 * ReturnClaims's count beside its error.
 */
export interface ReturnClaimsError extends Error {
  returned?: number;
}

/** The result of Agent.return: how many claims returnClaims handed back, and its error if it failed. */
export interface ReturnResult {
  returned: number;
  error?: unknown;
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
   * (`@handoff-dev/worker/testing`). Signatures are always checked on the real
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

/** agentToken is the pod's token from the options or the environment ("" with insecureNoToken and none configured); it throws a ConfigError. */
export function agentToken(o: AgentOptions, env: Record<string, string | undefined>): string {
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

/** agentMaxTerm is the longest grant accepted, in ms: options.leaseDuration, else $HANDOFF_LEASE_DURATION, else 1h; it throws a ConfigError. */
export function agentMaxTerm(o: AgentOptions, env: Record<string, string | undefined>): number {
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
