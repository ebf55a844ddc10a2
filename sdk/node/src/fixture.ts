/**
 * The fixture contract of `handoff conformance` (docs/protocol.md, "The
 * fixture contract"), both halves: FixtureHooks in the worker under test,
 * serving the steps on the Unix socket $HANDOFF_FIXTURE_SOCKET, and
 * runFixture, the fixture command (`--fixture-cmd`, `--leader-cmd`) that
 * starts the worker at `restart` and passes every other step to it. Between
 * them the SDKs' own wire, the same in every SDK: one connection per step,
 * the step's words and `\n` in, one line out (`ok`, `yes`, `no`,
 * `unsupported`, or `error: WHY`), sent once the step is done.
 * @module
 */
import { spawn } from 'node:child_process';
import { closeSync, existsSync, openSync, readFileSync, unlinkSync, writeFileSync } from 'node:fs';
import { connect, createServer, type Server } from 'node:net';
import { join } from 'node:path';
import type { Agent } from './agent.js';
import type { Claim } from './claims.js';
import { NotLeaderError } from './errors.js';
import type { LeaderWork } from './leadership.js';

/** The environment variable naming the worker's fixture socket, set by runFixture's `restart`. */
export const fixtureSocketEnv = 'HANDOFF_FIXTURE_SOCKET';

/** Every body the fixture puts in the queue begins with it (FixtureHooks.handles). */
export const fixturePrefix = 'conformance-';

/** Milliseconds `hold N` waits for the worker to work on the N messages put before it answers an error. */
export const fixtureHoldTimeoutMillis = 20_000;

/** What a worker gives FixtureHooks: how to put a message in its queue. */
export interface FixtureOptions {
  /** Puts one message with this body in the worker's queue, where its own claim loops claim it. Required. */
  publish: (body: string) => unknown;
  /**
   * Returns a message with this body claimed by this worker at once (what
   * a broker pushes to a prefetching consumer), for `hold-unstarted`;
   * without it that step answers `unsupported` and its case is skipped.
   */
  deliver?: (body: string) => unknown;
}

const held = `${fixturePrefix}held-`;
const cancelable = `${fixturePrefix}cancelable-`;
const unstartedPrefix = `${fixturePrefix}unstarted-`;

function count(arg: string | undefined): number {
  const n = arg !== undefined && /^[0-9]+$/.test(arg) ? Number(arg) : NaN;
  if (!(n >= 1)) throw new Error(`N must be an integer >= 1, got ${JSON.stringify(arg ?? '')}`);
  return n;
}

/**
 * FixtureHooks is the worker's half of the fixture contract. The worker
 * passes each message whose body `handles` to `work`, with its claim held
 * started, and acknowledges the message when `work` resolves; `work`
 * rejects (with the claim's abort reason, a CanceledError) for work that
 * must end unacknowledged. Serve the steps with `serve` (or serveFixture)
 * once the Agent listens.
 *
 * - `hold N`: publishes N messages and answers once the worker works on
 *   all N (their claims counted started in inFlight); that work ignores
 *   the cancel fallback and resolves at `finish`.
 * - `hold-cancelable N`: the same, the work rejecting once the cancel
 *   fallback aborts its claim's signal.
 * - `hold-unstarted N`: holds N delivered messages unstarted
 *   (Receive.holdUnstarted), for stop-claiming to hand back.
 * - `finish`: the held work resolves; the unstarted claims stop-claiming
 *   did not hand back are dropped.
 * - `lead LEASE` (`yes`/`no`), `stopping LEASE` (`yes` once all the leader
 *   work begun for it and not released was told to stop, else `no`),
 *   `release LEASE` (ends that leader work, forgotten from then).
 * - `ping`: `ok` (runFixture's `restart` waits for it).
 */
export class FixtureHooks {
  readonly agent: Agent;
  readonly #publish: (body: string) => unknown;
  readonly #deliver: ((body: string) => unknown) | undefined;
  #release!: () => void;
  #released!: Promise<void>;
  #working = 0;
  readonly #waiters = new Set<() => void>();
  #seq = 0;
  #unstarted: Claim[] = [];
  readonly #leaders = new Map<string, LeaderWork[]>();
  #server: Server | undefined;
  #path = '';

  constructor(agent: Agent, options: FixtureOptions) {
    if (typeof options?.publish !== 'function') throw new TypeError('FixtureHooks: options.publish is required: (body) => queue.publish(body)');
    this.agent = agent;
    this.#publish = options.publish;
    this.#deliver = options.deliver;
    this.#renew();
  }

  #renew(): void {
    this.#released = new Promise((resolve) => (this.#release = resolve));
  }

  /** Whether body is a message of the fixture's, to pass to work. */
  handles(body: string): boolean {
    return typeof body === 'string' && body.startsWith(fixturePrefix);
  }

  /**
   * The work on a fixture message: resolves at `finish`; for a
   * `hold-cancelable` message, rejects once claim.signal aborts (the
   * cancel fallback): leave that message unacknowledged.
   */
  work(body: string, claim: { readonly signal: AbortSignal }): Promise<void> {
    const released = this.#released;
    this.#working++;
    for (const w of [...this.#waiters]) w();
    if (!body.startsWith(cancelable)) return released;
    const signal = claim.signal;
    return new Promise((_, reject) => {
      if (signal.aborted) return reject(signal.reason);
      signal.addEventListener('abort', () => reject(signal.reason), { once: true });
    });
  }

  /** Runs one step; resolves to its answer line (`error: WHY` for a bad or failed step). */
  async step(words: readonly string[]): Promise<string> {
    try {
      return await this.#step(words);
    } catch (err) {
      return `error: ${err instanceof Error ? err.message : String(err)}`;
    }
  }

  async #step(words: readonly string[]): Promise<string> {
    const [cmd, arg] = words;
    switch (cmd) {
      case 'ping':
        return 'ok';
      case 'hold':
      case 'hold-cancelable':
        return this.#hold(cmd === 'hold' ? held : cancelable, count(arg));
      case 'hold-unstarted': {
        const n = count(arg);
        if (!this.#deliver) return 'unsupported';
        const values: unknown[] = [];
        for (let i = 0; i < n; i++) values.push(await this.#deliver(this.#body(unstartedPrefix)));
        const r = this.agent.receive();
        try {
          for (const v of values) this.#unstarted.push(r.holdUnstarted(v));
        } finally {
          r.end();
        }
        return 'ok';
      }
      case 'finish': {
        this.#release();
        this.#renew();
        for (const c of this.#unstarted.splice(0)) c.done(); // those stop-claiming did not hand back: dropped
        return 'ok';
      }
      case 'lead':
      case 'stopping':
      case 'release':
        return this.#leader(cmd, arg ?? '');
      case 'restart':
        throw new Error("restart is the fixture command's step (runFixture), not the worker's");
      default:
        throw new Error(`unknown step ${JSON.stringify(words.join(' '))}`);
    }
  }

  #body(prefix: string): string {
    return `${prefix}${process.pid}-${++this.#seq}`;
  }

  async #hold(prefix: string, n: number): Promise<string> {
    const want = this.#working + n;
    for (let i = 0; i < n; i++) await this.#publish(this.#body(prefix));
    if (this.#working >= want) return 'ok';
    const ok = await new Promise<boolean>((resolve) => {
      const t = setTimeout(() => (this.#waiters.delete(check), resolve(false)), fixtureHoldTimeoutMillis);
      const check = () => {
        if (this.#working < want) return;
        clearTimeout(t);
        this.#waiters.delete(check);
        resolve(true);
      };
      this.#waiters.add(check);
    });
    if (ok) return 'ok';
    throw new Error(`the worker works on ${n - (want - this.#working)} of the ${n} messages put after ${fixtureHoldTimeoutMillis / 1000}s`);
  }

  #leader(cmd: 'lead' | 'stopping' | 'release', lease: string): string {
    if (!lease) throw new Error(`${cmd} needs a Lease name`);
    if (cmd === 'lead') {
      try {
        const w = this.agent.beginLeading(lease);
        this.#leaders.set(lease, [...(this.#leaders.get(lease) ?? []), w]);
        return 'yes';
      } catch (err) {
        if (err instanceof NotLeaderError) return 'no';
        throw err;
      }
    }
    const ws = this.#leaders.get(lease) ?? [];
    if (cmd === 'stopping') return ws.length > 0 && ws.every((w) => w.signal.aborted) ? 'yes' : 'no';
    this.#leaders.delete(lease); // released work is forgotten: stopping answers no again
    for (const w of ws) w.done();
    return 'ok';
  }

  /** Serves the steps on the Unix socket path (default $HANDOFF_FIXTURE_SOCKET); resolves to the path once it listens. */
  serve(path: string = process.env[fixtureSocketEnv] ?? ''): Promise<string> {
    if (!path) return Promise.reject(new Error(`FixtureHooks.serve: no path given and ${fixtureSocketEnv} is not set`));
    if (existsSync(path)) unlinkSync(path);
    const srv = createServer((conn) => {
      let buf = '';
      conn.setEncoding('utf8');
      conn.on('error', () => {});
      conn.on('data', (d: Buffer | string) => {
        if (buf.includes('\n')) return;
        buf += String(d);
        const nl = buf.indexOf('\n');
        if (nl < 0) return;
        const words = buf.slice(0, nl).trim().split(/\s+/).filter(Boolean);
        const answer = words.length > 0 ? this.step(words) : Promise.resolve('error: empty step');
        void answer.then((a) => conn.end(`${a}\n`));
      });
    });
    srv.unref(); // the worker's own work keeps the process
    this.#server = srv;
    this.#path = path;
    return new Promise((resolve, reject) => {
      srv.once('error', reject);
      srv.listen(path, () => resolve(path));
    });
  }

  /** Stops serving and removes the socket. */
  async close(): Promise<void> {
    const srv = this.#server;
    if (!srv) return;
    this.#server = undefined;
    await new Promise<void>((resolve) => srv.close(() => resolve()));
    if (existsSync(this.#path)) unlinkSync(this.#path);
  }
}

/**
 * FixtureHooks served on $HANDOFF_FIXTURE_SOCKET, or undefined when it is
 * not set (not under `handoff conformance`). Call it once the Agent
 * listens: runFixture's `restart` answers once this socket does.
 */
export async function serveFixture(agent: Agent, options: FixtureOptions): Promise<FixtureHooks | undefined> {
  if (!process.env[fixtureSocketEnv]) return undefined;
  const hooks = new FixtureHooks(agent, options);
  await hooks.serve();
  return hooks;
}

// The fixture command.

const oneWord = ['restart', 'finish', 'stop'];
const twoWords = ['hold', 'hold-cancelable', 'hold-unstarted', 'lead', 'stopping', 'release'];
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function alive(pid: number): boolean {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    if (existsSync('/proc/self')) return false; // /proc without the pid: gone
    try {
      process.kill(pid, 0);
      return true;
    } catch {
      return false;
    }
  }
  return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[0] !== 'Z'; // a zombie is gone
}

function signalGroup(pid: number, sig: NodeJS.Signals): boolean {
  try {
    process.kill(-pid, sig); // the worker leads its own group: its children too
    return true;
  } catch {
    try {
      process.kill(pid, sig);
      return true;
    } catch {
      return false;
    }
  }
}

async function stop(dir: string, graceful: boolean): Promise<void> {
  const pidFile = join(dir, 'worker.pid');
  let pid: number;
  try {
    pid = Number(readFileSync(pidFile, 'utf8'));
  } catch {
    return;
  }
  const steps: [NodeJS.Signals, number][] = graceful ? [['SIGTERM', 5000], ['SIGKILL', 5000]] : [['SIGKILL', 5000]];
  for (const [sig, wait] of steps) {
    if (!signalGroup(pid, sig)) break;
    const end = Date.now() + wait;
    while (alive(pid) && Date.now() < end) await sleep(10);
    if (!alive(pid)) break;
  }
  if (alive(pid)) throw new Error(`worker ${pid} still running 5s after SIGKILL`);
  unlinkSync(pidFile);
}

function send(sock: string, words: readonly string[], timeoutMs: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const c = connect({ path: sock });
    let out = '';
    const t = setTimeout(() => (c.destroy(), reject(new Error(`no answer within ${timeoutMs / 1000}s`))), timeoutMs);
    c.setEncoding('utf8');
    c.on('connect', () => c.write(`${words.join(' ')}\n`));
    c.on('data', (d: Buffer | string) => (out += String(d)));
    c.on('end', () => (clearTimeout(t), resolve(out.trim())));
    c.on('error', (err) => (clearTimeout(t), reject(err)));
  });
}

async function restart(dir: string, worker: string | readonly string[], startTimeoutMs: number): Promise<void> {
  await stop(dir, false); // a fresh process, as after a kill of the worker container
  const sock = join(dir, 'fixture.sock');
  if (existsSync(sock)) unlinkSync(sock);
  const log = join(dir, 'worker.log');
  const fd = openSync(log, 'a');
  const argv = typeof worker === 'string' ? ['/bin/sh', '-c', `exec ${worker}`] : [...worker];
  const child = spawn(argv[0]!, argv.slice(1), { detached: true, stdio: ['ignore', fd, fd], env: { ...process.env, [fixtureSocketEnv]: sock } });
  closeSync(fd);
  let exited: string | undefined;
  child.on('exit', (code, sig) => (exited = sig ?? String(code)));
  child.on('error', (err) => (exited = err.message));
  child.unref();
  if (child.pid === undefined) await new Promise((r) => setImmediate(r));
  if (child.pid === undefined) throw new Error(`the worker did not start: ${exited ?? 'no pid'}`);
  writeFileSync(join(dir, 'worker.pid'), String(child.pid));
  const end = Date.now() + startTimeoutMs;
  while (Date.now() < end) {
    if (exited !== undefined) throw new Error(`the worker exited with status ${exited} at start: see ${log}`);
    try {
      if ((await send(sock, ['ping'], 1000)) === 'ok') return;
    } catch {
      // not yet
    }
    await sleep(10);
  }
  throw new Error(`the worker did not answer on ${sock} within ${startTimeoutMs / 1000}s: see ${log}`);
}

/** Where runFixture writes: process.stdout and process.stderr by default. */
export interface FixtureIO {
  stdout?: { write(s: string): unknown };
  stderr?: { write(s: string): unknown };
  /** How long `restart` waits for the worker's socket to answer, in ms; default 20 s. */
  startTimeoutMillis?: number;
}

/**
 * Runs one step as the fixture command and resolves to its exit status (0,
 * or 1 with the reason on stderr). dir is the command's own: the worker's
 * pid file (worker.pid), its log (worker.log) and its socket
 * (fixture.sock). worker is the worker's command: a shell command line,
 * run as `sh -c 'exec WORKER'`, or its argv. `restart` kills the worker
 * started last (SIGKILL, as a container is killed) and starts a fresh one
 * with $HANDOFF_FIXTURE_SOCKET set and the command's environment, stdin
 * /dev/null and its output appended to the log, and resolves once that
 * socket answers. `stop` stops it (SIGTERM, then SIGKILL after 5 s): run
 * it after `handoff conformance`. Every other step goes to the socket;
 * `yes`, `no` and `unsupported` are printed.
 */
export async function runFixture(dir: string, worker: string | readonly string[], words: readonly string[], io: FixtureIO = {}): Promise<number> {
  const stdout = io.stdout ?? process.stdout;
  const stderr = io.stderr ?? process.stderr;
  try {
    if (words.length === 0) throw new Error('no step given');
    if (words[0] === 'restart') {
      await restart(dir, worker, io.startTimeoutMillis ?? 20_000);
    } else if (words[0] === 'stop') {
      await stop(dir, true);
    } else {
      const answer = await send(join(dir, 'fixture.sock'), words, 60_000);
      if (answer === 'yes' || answer === 'no' || answer === 'unsupported') stdout.write(`${answer}\n`);
      else if (answer !== 'ok') throw new Error(answer.startsWith('error: ') ? answer.slice('error: '.length) : answer ? `answer ${JSON.stringify(answer)}` : 'no answer');
    }
    return 0;
  } catch (err) {
    stderr.write(`handoff fixture ${words.join(' ')}: ${err instanceof Error ? err.message : String(err)}\n`);
    return 1;
  }
}

const usage = `usage: --dir DIR --worker 'WORKER COMMAND' STEP [ARG]
The fixture command of handoff conformance (--fixture-cmd, --leader-cmd) for
a worker that serves FixtureHooks: STEP is restart, hold N, hold-cancelable N,
hold-unstarted N, finish, lead LEASE, stopping LEASE, release LEASE, or stop.
`;

/** The fixture command's command line (`--dir DIR --worker CMD STEP [ARG]`): runFixture; resolves to the exit status (2: usage). */
export async function fixtureMain(argv: readonly string[], io: FixtureIO = {}): Promise<number> {
  const args = [...argv];
  let dir = '';
  let worker = '';
  while (args[0]?.startsWith('--')) {
    const opt = args.shift();
    if (opt === '--dir' && args.length > 0) dir = args.shift()!;
    else if (opt === '--worker' && args.length > 0) worker = args.shift()!;
    else {
      (io.stderr ?? process.stderr).write(`handoff fixture: unknown option ${opt}\n${usage}`);
      return 2;
    }
  }
  const [step] = args;
  const ok = step !== undefined && ((oneWord.includes(step) && args.length === 1) || (twoWords.includes(step) && args.length === 2));
  if (!dir || !worker || !ok) {
    (io.stderr ?? process.stderr).write(usage);
    return 2;
  }
  return runFixture(dir, worker, args, io);
}
