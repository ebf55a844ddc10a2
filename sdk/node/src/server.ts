// The app API (docs/protocol.md, "What the app serves"), served for an
// Agent on Node's http server. It reaches the Agent only through a
// Dispatcher (dispatcher.ts), which the Agent makes.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { authScheme, Refusal, tokenFileEnv } from './auth.js';
import { appSocket, appURLEnv, endpointString, listenOn, parseEndpoint, type Endpoint } from './endpoint.js';
import type { Dispatcher, Grant } from './dispatcher.js';
import { ConfigError } from './errors.js';
import { BodyError, decode, encode } from './json.js';
import { operations, type Leadership as WireLeadership, type ReturnRequest } from './protocol.gen.js';

/** A request body of the app API is at most this many bytes (64 KiB); a larger one is answered 413. */
export const maxBodyBytes = 65_536;
/** One drain long poll waits at most this long, in ms. */
export const maxDrainWaitMillis = 30_000;
/** A refused body over maxBodyBytes is read on, and dropped, up to this many bytes, so the answer is not lost to a reset; then the connection is closed. */
const maxDiscardBytes = 1 << 20;

const appPrefix = '/handoff/v1/';
/** How far a Leadership sequence may be ahead of the app's clock, in nanoseconds (1 s). */
export const maxSequenceAheadNanos = 1_000_000_000n;
const leasePrefix = operations.setLeadership.path.slice(0, operations.setLeadership.path.indexOf('{'));

/** A handler of the app API, for a server of your own: `createServer(agent.handler())`. */
export type AppHandler = (req: IncomingMessage, res: ServerResponse) => void;

/**
 * writeJSON answers v with code in one write: the body is encoded first and
 * ended with its Content-Length, so Node writes the status line, headers and
 * body to the connection together (docs/protocol.md: an answer in two
 * writes can wait ~40 ms for Nagle and delayed ACK).
 */
function writeJSON(res: ServerResponse, code: number, v: unknown, headers: Record<string, string> = {}): void {
  if (res.writableEnded || res.destroyed) return;
  const body = encode(v) + '\n';
  res.writeHead(code, {
    ...headers,
    'Content-Type': 'application/json',
    'Content-Length': String(Buffer.byteLength(body)),
  });
  res.end(body);
}

function writeError(res: ServerResponse, code: number, msg: string, headers?: Record<string, string>): void {
  writeJSON(res, code, { error: msg }, headers);
}

/** Reads the whole body, at most maxBodyBytes; undefined when it is larger (the rest read and dropped up to maxDiscardBytes). */
function readBody(req: IncomingMessage): Promise<{ body: Buffer; tooLarge: boolean; error?: Error }> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let n = 0;
    let settled = false;
    const settle = (v: { body: Buffer; tooLarge: boolean; error?: Error }) => {
      if (settled) return;
      settled = true;
      resolve(v);
    };
    req.on('data', (chunk: Buffer) => {
      n += chunk.length;
      if (n <= maxBodyBytes) chunks.push(chunk);
      else if (n > maxDiscardBytes) {
        req.pause();
        settle({ body: Buffer.alloc(0), tooLarge: true });
      }
    });
    req.on('end', () => settle({ body: Buffer.concat(chunks), tooLarge: n > maxBodyBytes }));
    req.on('error', (error) => settle({ body: Buffer.alloc(0), tooLarge: false, error }));
    req.on('aborted', () => settle({ body: Buffer.alloc(0), tooLarge: false, error: new Error('the request was aborted') }));
  });
}

/** A signal that aborts when the caller goes away before its answer. */
function callerGone(res: ServerResponse): AbortSignal {
  const c = new AbortController();
  res.once('close', () => {
    if (!res.writableFinished) c.abort(new Error('the caller went away'));
  });
  return c.signal;
}

/** waitMillis reads the drain long poll's waitMillis as the Go worker does: a number of ms, or a string error. */
export function parseWaitMillis(target: string): number | string {
  const q = target.indexOf('?');
  const values: string[] = [];
  if (q >= 0) {
    for (const pair of target.slice(q + 1).split('&')) {
      if (pair === '') continue;
      const eq = pair.indexOf('=');
      const rawKey = eq < 0 ? pair : pair.slice(0, eq);
      const rawValue = eq < 0 ? '' : pair.slice(eq + 1);
      if (rawKey.includes(';')) continue; // Go's url.ParseQuery drops such a pair
      let key: string;
      let value: string;
      try {
        key = decodeURIComponent(rawKey.replaceAll('+', ' '));
        value = decodeURIComponent(rawValue.replaceAll('+', ' '));
      } catch {
        continue; // a bad escape: dropped, as Go drops it
      }
      if (key === 'waitMillis') values.push(value);
    }
  }
  if (values.length > 1) return `waitMillis given ${values.length} times; want it once`;
  const v = (values[0] ?? '').trim();
  if (v === '') return 0;
  const m = /^([+-]?)([0-9]+)$/.exec(v);
  if (!m) return `waitMillis ${JSON.stringify(values[0])}: want a whole number of milliseconds, 0 or more`;
  const n = BigInt(m[2]!);
  if (m[1] === '-' && n !== 0n) {
    return `waitMillis ${JSON.stringify(values[0])}: want a whole number of milliseconds, 0 or more`;
  }
  // Beyond int64 Go reads a range error, which is above the bound too.
  return n >= BigInt(maxDrainWaitMillis) ? maxDrainWaitMillis : Number(n);
}

/** The path of a request target, decoded segment by segment, or undefined when it cannot be. */
function pathOf(target: string): string[] | undefined {
  let p = target;
  const q = p.indexOf('?');
  if (q >= 0) p = p.slice(0, q);
  if (/^https?:\/\//i.test(p)) p = p.replace(/^https?:\/\/[^/]*/i, '') || '/';
  try {
    return p.split('/').map((s) => decodeURIComponent(s));
  } catch {
    return undefined;
  }
}

/** The route of a call: its operation, or a 404 or 405. */
type Route =
  | { op: 'stopClaiming' | 'drain' | 'returnClaims' }
  | { op: 'setLeadership'; lease: string }
  | { status: 404 }
  | { status: 405; allow: string };

function route(method: string, target: string): Route {
  const segs = pathOf(target);
  if (!segs) return { status: 404 };
  const path = segs.join('/');
  const one = (op: 'stopClaiming' | 'drain' | 'returnClaims'): Route => {
    const want: string = operations[op].method;
    if (method === want || (want === 'GET' && method === 'HEAD')) return { op };
    return { status: 405, allow: want === 'GET' ? 'GET, HEAD' : want };
  };
  if (path === operations.stopClaiming.path) return one('stopClaiming');
  if (path === operations.drain.path) return one('drain');
  if (path === operations.returnClaims.path) return one('returnClaims');
  const prefixSegs = leasePrefix.split('/').length - 1; // "/handoff/v1/leases/" → 4 segments before the Lease
  if (path.startsWith(leasePrefix) && segs.length === prefixSegs + 1 && segs[prefixSegs] !== '') {
    if (method !== operations.setLeadership.method) return { status: 405, allow: operations.setLeadership.method };
    return { op: 'setLeadership', lease: segs[prefixSegs]! };
  }
  return { status: 404 };
}

/**
 * handler returns the app API of agent as a request listener. Every call
 * must be signed with the pod's token (a signature, a timestamp within 30 s
 * and a nonce not seen before), or it is answered 401 with a JSON error and
 * not acted on (unless the Agent was made with insecureNoToken and no
 * token). The body (at most 64 KiB; a larger one is answered 413 and the
 * connection closed) is read whole before anything else, also for a call
 * refused. A leadership message that cannot come from the sidecar (a
 * sequence more than 1 s ahead of the Agent's clock, a grant valid for
 * longer than the lease duration) is answered 422 and not applied.
 */
export function handler(agent: Dispatcher): AppHandler {
  return (req, res) => {
    void serve(agent, req, res).catch((err: unknown) => {
      agent.log.error('serving a call failed', { error: err });
      writeError(res, 500, 'internal error');
    });
  };
}

async function serve(agent: Dispatcher, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const { body, tooLarge, error } = await readBody(req);
  if (error) {
    res.setHeader('Connection', 'close');
    writeError(res, 400, `body: ${error.message}; want at most ${maxBodyBytes} bytes of JSON, sent at once`);
    return;
  }
  if (tooLarge) {
    res.setHeader('Connection', 'close');
    writeError(res, 413, `body: larger than ${maxBodyBytes} bytes; want at most ${maxBodyBytes} bytes (64 KiB) of JSON`);
    return;
  }
  const method = req.method ?? '';
  const target = req.url ?? '';
  if (agent.verifier) {
    try {
      agent.verifier.verify({
        method,
        target,
        body,
        // The first value of a header sent twice, as Go's Header.Get reads it.
        header: (name) => req.headersDistinct[name.toLowerCase()]?.[0],
      });
    } catch (err) {
      if (!(err instanceof Refusal)) throw err;
      const msg = `${err.message} (the pod's token is the file named by ${tokenFileEnv})`;
      if (err.status === 503) writeError(res, 503, msg, { 'Retry-After': '1' });
      else writeError(res, 401, msg, { 'WWW-Authenticate': `${authScheme} realm="handoff"` });
      return;
    }
  }
  const r = route(method, target);
  if ('status' in r) {
    if (r.status === 405) writeError(res, 405, `method ${method} not allowed; want ${r.allow}`, { Allow: r.allow });
    else writeError(res, 404, `no such call: ${target.split('?')[0]} (the app API is under ${appPrefix})`);
    return;
  }
  const text = body.toString('utf8');
  switch (r.op) {
    case 'stopClaiming':
      writeJSON(res, 200, agent.stopClaiming());
      return;
    case 'drain':
      return drain(agent, target, res);
    case 'returnClaims':
      return returnCall(agent, text, res);
    case 'setLeadership':
      return leadership(agent, r.lease, text, res);
  }
}

async function drain(agent: Dispatcher, target: string, res: ServerResponse): Promise<void> {
  const wait = parseWaitMillis(target);
  if (typeof wait === 'string') {
    writeError(res, 400, wait);
    return;
  }
  if (wait > 0) {
    const c = new AbortController();
    const gone = callerGone(res);
    const onGone = () => c.abort();
    gone.addEventListener('abort', onGone, { once: true });
    const t = setTimeout(() => c.abort(), wait);
    try {
      await agent.waitDrained(c.signal);
    } catch {
      // not drained: the status says so
    } finally {
      clearTimeout(t);
      gone.removeEventListener('abort', onGone);
    }
  }
  writeJSON(res, 200, agent.drainStatus());
}

async function returnCall(agent: Dispatcher, text: string, res: ServerResponse): Promise<void> {
  let req: ReturnRequest;
  try {
    req = decode<ReturnRequest>('ReturnRequest', text);
  } catch (e) {
    if (!(e instanceof BodyError)) throw e;
    writeError(res, 400, e.message);
    return;
  }
  const wait = req.cancelWaitMillis ?? 0n;
  if (wait < 0n) {
    writeError(res, 400, `body: cancelWaitMillis ${wait}; want a whole number of milliseconds, 0 or more`);
    return;
  }
  const result = await agent.return({
    cancel: req.cancel,
    cancelWaitMillis: wait > BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : Number(wait),
    signal: callerGone(res),
  });
  const answer: { returned: number; error?: string } = { returned: result.returned };
  if (result.error !== undefined) answer.error = result.error instanceof Error ? result.error.message : String(result.error);
  writeJSON(res, 200, answer);
}

/** A Leadership as decoded: until in Unix nanoseconds, undefined when absent. */
type DecodedLeadership = Omit<WireLeadership, 'until'> & { until?: bigint };

async function leadership(agent: Dispatcher, lease: string, text: string, res: ServerResponse): Promise<void> {
  const recvMono = agent.clock.monotonic();
  const recvWall = agent.clock.now();
  let l: DecodedLeadership;
  try {
    l = decode<DecodedLeadership>('Leadership', text);
  } catch (e) {
    if (!(e instanceof BodyError)) throw e;
    writeError(res, 400, e.message);
    return;
  }
  if (l.lease !== '' && l.lease !== lease) {
    writeError(res, 400, `body: lease ${JSON.stringify(l.lease)} differs from the path's Lease ${JSON.stringify(lease)}; want the same name, or leave it out`);
    return;
  }
  const why = notGenuine(agent, l, recvWall);
  if (why) {
    writeError(res, 422, why);
    return;
  }
  let grant: Grant | undefined;
  if (l.leader) {
    // The term ends at min(receipt + validForMillis, until), measured on the
    // Agent's monotonic clock from the receipt.
    const vf = l.validForMillis ?? 0n;
    const valid = vf > 0n ? Number(vf) : 0;
    let left = valid;
    if (l.until !== undefined) {
      // In nanoseconds first: a Unix time in ns is beyond a double's exact integers.
      const whole = Math.floor(recvWall);
      const untilLeft = Number(l.until - BigInt(whole) * 1_000_000n) / 1e6 - (recvWall - whole);
      if (untilLeft < left) left = untilLeft;
    }
    grant = { fencingToken: l.fencingToken, end: recvMono + left, until: recvWall + left };
  }
  // The sequence is checked and the term changed at once: of two messages
  // handled together, the earlier is stale either way.
  const { stale, waitLeaderWork } = agent.setLeadership(lease, l.sequence, grant);
  if (stale) {
    writeJSON(res, 200, { leader: l.leader, stale: true });
    return;
  }
  if (l.leader) {
    writeJSON(res, 200, { leader: true });
    return;
  }
  try {
    await waitLeaderWork(callerGone(res));
  } catch (err) {
    writeError(res, 503, `leader work did not stop: ${err instanceof Error ? err.message : String(err)}`);
    return;
  }
  writeJSON(res, 200, { leader: false });
}

/** notGenuine says why a leadership message received at recvWall cannot come from the sidecar, or undefined. */
function notGenuine(agent: Dispatcher, l: DecodedLeadership, recvWall: number): string | undefined {
  const now = BigInt(Math.floor(recvWall)) * 1_000_000n;
  if (l.sequence > now && l.sequence - now > maxSequenceAheadNanos) {
    return `body: sequence ${l.sequence} is ${Number(l.sequence - now) / 1e9}s ahead of this process's clock; want a sequence (the send time in Unix nanoseconds) at most 1s ahead`;
  }
  if (!l.leader) return undefined;
  const maxMs = Math.floor(agent.maxTerm);
  if ((l.validForMillis ?? 0n) > BigInt(maxMs)) {
    return `body: validForMillis ${l.validForMillis} is longer than the lease duration ${agent.maxTerm / 1000}s, which bounds every term the sidecar grants; want at most ${maxMs}`;
  }
  if (l.until !== undefined && l.until - now > BigInt(Math.round(agent.maxTerm * 1e6))) {
    return `body: until is ${Number(l.until - now) / 1e9}s after receipt, longer than the lease duration ${agent.maxTerm / 1000}s, which bounds every term the sidecar grants; want an until at most ${agent.maxTerm / 1000}s ahead`;
  }
  return undefined;
}

/** A server of the app API, from Agent.listen. */
export interface AppServer extends AsyncDisposable {
  /** The address served, in the protocol's form (for port 0, the port picked). */
  readonly url: string;
  readonly server: Server;
  /** Stops serving: new connections are refused at once, calls under way get 1 s to end, then their connections are closed; the socket is removed. */
  close(): Promise<void>;
}

/**
 * listen serves agent's app API on url, in the protocol's form: the socket
 * the injector names, `unix:///handoff-run/app.sock`, or a loopback address
 * a pod opted into, like `http://127.0.0.1:7452`; unset, the address in
 * $HANDOFF_APP_URL. A socket is made at the path itself with mode 0666 (a
 * stale one replaced, anything else refused) and removed when the server
 * closes; accepted TCP connections get TCP_NODELAY. The server cuts off a
 * client that takes more than 5 s to send its request (of at most 8 KiB of
 * header); a long poll or a revoke waits as long as it must; idle
 * connections are closed after 90 s. signal, when given, closes it.
 */
export async function listen(agent: Dispatcher, options: { url?: string; signal?: AbortSignal; env?: Record<string, string | undefined> } = {}): Promise<AppServer> {
  let url = options.url;
  let from = 'address';
  if (!url) {
    url = (options.env ?? process.env)[appURLEnv];
    from = `environment variable ${appURLEnv}`;
    if (!url) throw new ConfigError(`handoff app address: none given and ${appURLEnv} is not set (the handoff injector sets it to unix://${appSocket})`);
  }
  let e: Endpoint;
  try {
    e = parseEndpoint(url);
  } catch (err) {
    throw new ConfigError(`handoff app ${from}: ${(err as Error).message}`);
  }
  const server = createServer(
    {
      maxHeaderSize: 8 << 10,
      requestTimeout: 5_000,
      headersTimeout: 5_000,
      keepAliveTimeout: 90_000,
      connectionsCheckingInterval: 1_000,
      noDelay: true,
    },
    handler(agent),
  );
  server.on('connection', (s: Socket) => {
    if (e.network === 'tcp') s.setNoDelay(true);
  });
  try {
    await listenOn(server, e);
  } catch (err) {
    if (err instanceof ConfigError) throw new ConfigError(`handoff app ${from} ${url}: ${err.message}`, { cause: err });
    throw new ConfigError(`handoff app ${from} ${url}: ${(err as Error).message}`, { cause: err });
  }
  let served = e;
  if (e.network === 'tcp') {
    const a = server.address();
    if (a && typeof a === 'object') served = { network: 'tcp', host: e.host, port: a.port };
  }
  let closing: Promise<void> | undefined;
  const close = () => {
    closing ??= new Promise<void>((resolve) => {
      const t = setTimeout(() => server.closeAllConnections(), 1_000);
      server.close(() => {
        clearTimeout(t);
        resolve();
      });
      server.closeIdleConnections();
    });
    return closing;
  };
  options.signal?.addEventListener('abort', () => void close(), { once: true });
  agent.log.info('serving the handoff app API', { url: endpointString(served) });
  return { url: endpointString(served), server, close, [Symbol.asyncDispose]: close };
}
