// Signed calls (docs/protocol.md, "Signed calls"): every call between the
// sidecar, the hook and the worker carries Handoff-Timestamp, Handoff-Nonce
// and Authorization: HANDOFF-HMAC-SHA256 <sig>, the HMAC-SHA256, keyed with
// the pod's token, of the six lines
//
//	HANDOFF-HMAC-SHA256
//	<method>
//	<request target as sent: path and query>
//	<timestamp>
//	<nonce>
//	<lowercase hex SHA-256 of the body>
//
// joined by "\n" with no newline at the end.
import { createHash, createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';

/** The Authorization scheme of a signed call. */
export const authScheme = 'HANDOFF-HMAC-SHA256';
/** The header with the call's Unix time in milliseconds. */
export const timestampHeader = 'Handoff-Timestamp';
/** The header with the call's nonce. */
export const nonceHeader = 'Handoff-Nonce';
/** How far a call's timestamp may be from the receiver's clock, either way, in milliseconds. */
export const maxClockSkewMillis = 30_000;
/** How many nonces a receiver remembers at once; past that it answers 503 with Retry-After: 1. */
export const maxNonces = 65_536;
/** The shortest token accepted, in bytes. */
export const minTokenLength = 32;
/** The environment variable naming the pod's token file. */
export const tokenFileEnv = 'HANDOFF_TOKEN_FILE';
/** Where an injected pod keeps its token. */
export const tokenFile = '/handoff-bin/token';

const maxTimestampDigits = 15;
const nonceRe = /^[A-Za-z0-9_-]{16,64}$/;
const timestampRe = /^[0-9]{1,15}$/;

/** bodyDigest is the lowercase hex SHA-256 of body, the last line a signature covers. */
export function bodyDigest(body: Uint8Array | string = ''): string {
  return createHash('sha256').update(body).digest('hex');
}

/**
 * signature is the lowercase hex HMAC-SHA256 of a call, keyed with token:
 * target is the request target as sent (path and query), digest the body's
 * bodyDigest.
 */
export function signature(token: string, method: string, target: string, timestamp: string, nonce: string, digest: string): string {
  return createHmac('sha256', token)
    .update([authScheme, method, target, timestamp, nonce, digest].join('\n'))
    .digest('hex');
}

/** newNonce is 32 random hex digits. */
export function newNonce(): string {
  return randomBytes(16).toString('hex');
}

/**
 * signHeaders returns the three headers that make a call signed with token
 * at now (Unix milliseconds). Sign every send anew: a retry needs a new
 * nonce.
 */
export function signHeaders(
  token: string,
  method: string,
  target: string,
  body: Uint8Array | string = '',
  now: number = Date.now(),
): Record<string, string> {
  const ts = String(Math.floor(now));
  const nonce = newNonce();
  return {
    [timestampHeader]: ts,
    [nonceHeader]: nonce,
    Authorization: `${authScheme} ${signature(token, method, target, ts, nonce, bodyDigest(body))}`,
  };
}

/** checkToken throws unless tok can be a token: at least 32 printable ASCII characters, none a space. */
export function checkToken(tok: string): void {
  if (Buffer.byteLength(tok) < minTokenLength) {
    throw new Error(`no usable token: ${Buffer.byteLength(tok)} bytes; want at least ${minTokenLength} printable ASCII characters (handoff install writes 64 hex digits)`);
  }
  for (let i = 0; i < tok.length; i++) {
    const c = tok.charCodeAt(i);
    if (c <= 0x20 || c > 0x7e) {
      throw new Error(`no usable token: byte ${i} is not printable ASCII; want printable ASCII characters and no space`);
    }
  }
}

/** readTokenFile reads the pod's token from path: its content with surrounding white space removed, checked by checkToken. */
export function readTokenFile(path: string): string {
  let b: string;
  try {
    b = readFileSync(path, 'latin1');
  } catch (e) {
    throw new Error(`token file ${path}: ${(e as Error).message}`, { cause: e });
  }
  const tok = b.trim();
  try {
    checkToken(tok);
  } catch (e) {
    throw new Error(`token file ${path}: ${(e as Error).message}`);
  }
  return tok;
}

/** Why Verifier.verify refused a call. */
export type RefusalKind = 'unsigned' | 'bad-signature' | 'clock-skew' | 'before-start' | 'replayed' | 'busy';

/** A call Verifier.verify refused: answered 401, or 503 with Retry-After: 1 when busy. */
export class Refusal extends Error {
  constructor(
    readonly kind: RefusalKind,
    message: string,
  ) {
    super(message);
  }
  /** The HTTP status to answer: 503 when busy, else 401. */
  get status(): number {
    return this.kind === 'busy' ? 503 : 401;
  }
}

/** What Verifier.verify reads of a call. */
export interface SignedCall {
  method: string;
  /** The request target as sent: path and query. */
  target: string;
  /** The header value, or undefined when absent. */
  header(name: string): string | undefined;
  body: Uint8Array;
}

/**
 * Verifier checks signed calls for one receiver and remembers their nonces,
 * as the Go protocol.Verifier: the signature first, in constant time, then
 * the timestamp (30 s either way) and the nonce (never accepted before);
 * at most maxNonces remembered, each until its timestamp is 30 s old.
 *
 * The nonces live in memory only, so it also refuses every call signed
 * before it was made ('before-start'), to the millisecond: a call captured
 * before a restart cannot be replayed to the new process. Make it before the
 * receiver listens. The bound is the start itself, not the start less the
 * 30 s skew: the sender and the receiver read the node's one clock, so no
 * genuine call to this receiver bears an earlier timestamp; a sender whose
 * call was in flight across the restart signs anew and retries.
 */
export class Verifier {
  readonly #key: Buffer;
  readonly #now: () => number;
  /** The Unix ms when the Verifier was made, truncated as a timestamp is. */
  readonly startedMillis: number;
  readonly #max: number;
  /** Accepted nonces, each with the Unix ms until which its timestamp is accepted. */
  readonly #seen = new Map<string, number>();

  /**
   * @param token the pod's token (checkToken's form)
   * @param options now: the wall clock in Unix ms (default Date.now); maxNonces: for tests (default 65536)
   */
  constructor(token: string, options: { now?: () => number; maxNonces?: number } = {}) {
    this.#key = Buffer.from(token, 'latin1');
    this.#now = options.now ?? Date.now;
    this.startedMillis = Math.floor(this.#now());
    this.#max = options.maxNonces ?? maxNonces;
  }

  /** The number of nonces remembered. */
  get remembered(): number {
    return this.#seen.size;
  }

  /** verify throws a Refusal unless call is signed with the token, within 30 s of now and not before the Verifier was made, with a nonce not seen before; it then remembers the nonce. */
  verify(call: SignedCall): void {
    const authz = call.header('authorization') ?? '';
    const sp = authz.indexOf(' ');
    const scheme = sp < 0 ? authz : authz.slice(0, sp);
    const sig = sp < 0 ? '' : authz.slice(sp + 1);
    const ts = call.header(timestampHeader) ?? '';
    const nonce = call.header(nonceHeader) ?? '';
    const hint = `want "${authScheme} <signature>", ${timestampHeader} and ${nonceHeader} headers (docs/protocol.md, "Signed calls")`;
    if (authz === '') throw new Refusal('unsigned', `not a signed call: no Authorization header; ${hint}`);
    if (scheme.toUpperCase() !== authScheme) {
      throw new Refusal('unsigned', `not a signed call: Authorization scheme ${JSON.stringify(scheme.slice(0, 24))}; want ${authScheme} (a bearer token is not accepted: the token never crosses the wire)`);
    }
    if (sig.length !== 64) throw new Refusal('unsigned', `not a signed call: the signature has ${sig.length} characters; want 64 lowercase hex digits`);
    if (!timestampRe.test(ts)) {
      throw new Refusal('unsigned', `not a signed call: ${timestampHeader} ${JSON.stringify(ts.slice(0, 24))}; want the Unix time in milliseconds, a whole number of at most ${maxTimestampDigits} digits`);
    }
    if (!nonceRe.test(nonce)) {
      throw new Refusal('unsigned', `not a signed call: ${nonceHeader} ${JSON.stringify(nonce.slice(0, 72))}; want 16 to 64 characters of A-Z, a-z, 0-9, - and _`);
    }
    const want = createHmac('sha256', this.#key)
      .update([authScheme, call.method, call.target, ts, nonce, bodyDigest(call.body)].join('\n'))
      .digest('hex');
    // Header values are latin1 (one byte a character), so both are 64 bytes.
    const got = Buffer.from(sig.toLowerCase(), 'latin1');
    if (got.length !== 64 || !timingSafeEqual(got, Buffer.from(want, 'latin1'))) {
      throw new Refusal('bad-signature', 'bad signature: the signature is not the pod\'s token\'s over this method, target, timestamp, nonce and body');
    }
    const at = Number(ts);
    const now = this.#now();
    const d = now - at;
    if (d > maxClockSkewMillis || d < -maxClockSkewMillis) {
      throw new Refusal('clock-skew', `timestamp out of range: ${timestampHeader} is ${(d / 1000).toFixed(3)}s from this process's clock; want at most 30s either way`);
    }
    if (at < this.startedMillis) {
      throw new Refusal(
        'before-start',
        `signed before this receiver started: ${timestampHeader} ${ts} is ${((this.startedMillis - at) / 1000).toFixed(3)}s before this receiver started (${this.startedMillis}); a call made before a restart is not accepted after it: sign it anew and retry`,
      );
    }
    if (this.#seen.has(nonce)) {
      throw new Refusal('replayed', `replayed call: ${nonceHeader} ${nonce} was accepted before; want a new nonce for every call`);
    }
    if (this.#seen.size >= this.#max) {
      for (const [n, until] of this.#seen) {
        if (now > until) this.#seen.delete(n);
      }
      if (this.#seen.size >= this.#max) {
        throw new Refusal('busy', `too many calls to remember: ${this.#max} calls in the last 60s`);
      }
    }
    this.#seen.set(nonce, at + maxClockSkewMillis);
  }
}
