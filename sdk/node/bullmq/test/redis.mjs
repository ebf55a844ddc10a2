// A Redis for the tests: $HANDOFF_TEST_REDIS (host:port, which
// sdk/node/test.sh starts), or one started here with the repository's
// hack/redis.sh (Debian's redis-server) on a free port and stopped when the
// test file's process ends.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
export const repo = join(here, '..', '..', '..', '..');
const redisScript = join(repo, 'hack', 'redis.sh');

/** A free TCP port on 127.0.0.1 (free when asked; the caller binds it soon after). */
export function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

let started;

/**
 * The Redis of this test file, {host, port, url}: $HANDOFF_TEST_REDIS, or
 * one started on first use and stopped at process exit (and by
 * hack/redis.sh's watchdog should the process be killed).
 */
export async function redis() {
  if (started) return started;
  const env = process.env.HANDOFF_TEST_REDIS;
  if (env) {
    const [host, port] = env.split(':');
    started = { host, port: Number(port), url: `redis://${env}` };
    return started;
  }
  const dir = mkdtempSync(join(tmpdir(), 'hbq-redis-'));
  const port = await freePort();
  const addr = execFileSync('bash', [redisScript, 'start', dir, String(port)], {
    env: { ...process.env, HANDOFF_WATCH_PID: String(process.pid) },
    stdio: ['ignore', 'pipe', 'inherit'],
    encoding: 'utf8',
  }).trim();
  process.once('exit', () => {
    try {
      execFileSync('bash', [redisScript, 'stop', dir], { stdio: 'ignore' });
      rmSync(dir, { recursive: true, force: true });
    } catch {
      // The watchdog stops it (it needs the directory).
    }
  });
  const [host, p] = addr.split(':');
  started = { host, port: Number(p), url: `redis://${addr}` };
  return started;
}

let seq = 0;
/** A queue name of its own for one test. */
export function queueName(prefix = 'q') {
  return `${prefix}-${process.pid}-${++seq}-${Date.now().toString(36)}`;
}
