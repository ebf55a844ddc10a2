#!/usr/bin/env node
// An example BullMQ worker on @handoff-dev/bullmq, as it runs beside the handoff
// sidecar: a BullMQ Worker whose jobs are claims of the Agent served on
// $HANDOFF_APP_URL (the pod's token from $HANDOFF_TOKEN_FILE). At shutdown
// it stops fetching at once, lets its active jobs finish until the drain
// deadline, and then moves the jobs still running back to waiting, where
// another worker takes them in milliseconds.
//
//   REDIS_URL=redis://127.0.0.1:6379 HANDOFF_APP_URL=unix:///tmp/app.sock \
//     HANDOFF_TOKEN_FILE=token node examples/bullmq-worker.mjs
//
// A job's data: {amount, workMillis, ignoreAbort}. The work takes
// workMillis (default 50) and stops when its signal aborts (the cancel
// fallback, or the hand-back at the deadline), unless ignoreAbort (work
// that does not stop when told); then its effect adds amount to a balance.
// The effect is applied once per job, whoever runs it and however often: a
// job handed back at the deadline runs again on another worker, and its
// first run may go on and finish too.
//
// Settings: REDIS_URL, EXAMPLE_QUEUE (handoff-example), EXAMPLE_CONCURRENCY
// (8), EXAMPLE_WORKER_NAME (worker-PID). Logs are JSON lines on stderr (the
// adapter's among them: 'job handed back'), each with `at`, Unix ms to a
// fraction of a millisecond.
import { Redis } from 'ioredis';
import { BullMQAdapter } from '@handoff-dev/bullmq';

const env = process.env;
const redisURL = env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const queueName = env.EXAMPLE_QUEUE ?? 'handoff-example';
const concurrency = Number(env.EXAMPLE_CONCURRENCY ?? 8);
const workerName = env.EXAMPLE_WORKER_NAME ?? `worker-${process.pid}`;

/** @typedef {{amount?: number, workMillis?: number, ignoreAbort?: boolean}} JobData */

const now = () => performance.timeOrigin + performance.now();
/** @param {string} level */
const log = (level) => (/** @type {string} */ msg, /** @type {Record<string, unknown>} */ fields = {}) =>
  console.error(JSON.stringify({ at: now(), level, worker: workerName, msg, ...fields }, replacer));
const info = log('info');

// The effect, applied once per job: one script sets the job's key (SET NX)
// and, only if it was not set, applies the effect, atomically. The keys:
// the job's, a hash of how many times each job's effect was applied, and
// the balance.
const applyOnce = `
if redis.call('SET', KEYS[1], ARGV[2], 'NX') then
  redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
  redis.call('INCRBY', KEYS[3], ARGV[3])
  return 1
end
return 0`;
const redis = new Redis(redisURL, { maxRetriesPerRequest: null });
redis.defineCommand('applyOnce', { numberOfKeys: 3, lua: applyOnce });
/**
 * Applies job id's effect unless it was applied already: 1 if it applied it.
 * @type {(jobKey: string, effectsKey: string, balanceKey: string, jobId: string, worker: string, amount: number) => Promise<number>}
 */
const applyEffectOnce = (...args) => /** @type {any} */ (redis).applyOnce(...args);

const adapter = new BullMQAdapter({ logger: { info, error: log('error') } });
const handedBack = { unstarted: 0, deadline: 0, canceled: 0 };
adapter.on('handedBack', (_job, reason) => handedBack[reason]++);

/**
 * The processor: BullMQ's (job, token, signal).
 * @param {import('bullmq').Job<JobData>} job
 * @param {string | undefined} _token
 * @param {AbortSignal} signal
 */
async function processor(job, _token, signal) {
  info('job started', { jobId: job.id });
  const { amount = 1, workMillis = 50, ignoreAbort = false } = job.data;
  await work(workMillis, ignoreAbort ? undefined : signal);
  const id = String(job.id);
  const applied = await applyEffectOnce(`${queueName}:applied:${id}`, `${queueName}:effects`, `${queueName}:balance`, id, workerName, amount);
  info(applied === 1 ? 'effect applied' : 'effect was applied already', { jobId: job.id });
  return { by: workerName, applied: applied === 1 };
}

/**
 * Stands for the work: ms of it, cut short (rejecting with the signal's reason) when signal aborts.
 * @param {number} ms
 * @param {AbortSignal} [signal]
 * @returns {Promise<void>}
 */
function work(ms, signal) {
  return new Promise((resolve, reject) => {
    signal?.throwIfAborted();
    const t = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => (clearTimeout(t), reject(signal.reason)), { once: true });
  });
}

const worker = adapter.worker(queueName, processor, { connection: { url: redisURL }, concurrency, name: workerName });
worker.on('error', (err) => log('error')('BullMQ worker error', { error: err }));
const server = await adapter.listen(); // $HANDOFF_APP_URL
info('listening', { url: server.url, queue: queueName, concurrency });

// SIGTERM: the sidecar's sequence has stopped claiming by now, and drained
// or handed back; stop claiming anyway, give work still running a moment
// (a job handed back runs on another worker already), and exit.
process.once('SIGTERM', async () => {
  adapter.agent.stopClaiming();
  const closed = await adapter.close({ timeout: 3_000 });
  info('exiting', { closed, inFlight: adapter.agent.inFlight, handedBack });
  await server.close();
  redis.disconnect();
  process.exit(0);
});

/** @param {string} _key @param {unknown} v */
function replacer(_key, v) {
  if (typeof v === 'bigint') return Number(v);
  if (v instanceof Error) return v.message;
  return v;
}
