// The adapter against a real Redis and BullMQ's own Worker (no sidecar: the
// Agent's calls are made directly): jobs as claims, stop-claiming pauses
// the worker and cuts its blocking wait, unstarted jobs handed back, the
// drain deadline's hand-back with BullMQ refusing the late result, and the
// cancel fallback.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { Queue, Worker } from 'bullmq';
import { CanceledError, HandedBackError } from '@handoff-dev/worker';
import { BullMQAdapter, HandoffWorker } from '../dist/index.js';
import { queueName, redis } from './redis.mjs';

const { host, port } = await redis();
const connection = { host, port };
const closers = [];
after(async () => {
  for (const c of closers.reverse()) await c();
});

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const now = () => performance.timeOrigin + performance.now();

async function eventually(cond, ms = 5000, what = 'condition') {
  const end = Date.now() + ms;
  for (;;) {
    if (await cond()) return;
    if (Date.now() > end) throw new Error(`${what}: not true within ${ms}ms`);
    await sleep(2);
  }
}

/** A gate the processors wait on: open() lets them all through. */
function gate() {
  let open;
  const p = new Promise((r) => (open = r));
  return { p, open };
}

function newQueue(name) {
  const q = new Queue(name, { connection });
  closers.push(() => q.close());
  return q;
}

// HANDOFF_TEST_DEBUG=1 prints the adapter's and the Agent's logs.
const logger = process.env.HANDOFF_TEST_DEBUG
  ? { info: (m, f) => console.log('#', m, JSON.stringify(f)), error: (m, f) => console.log('# error:', m, String(f?.error ?? ''), JSON.stringify(f)) }
  : undefined;

function newAdapter() {
  const adapter = new BullMQAdapter({ insecureNoToken: true, logger });
  closers.push(() => adapter.close({ force: true }));
  return adapter;
}

/** A plain BullMQ Worker: the other pod's worker. */
function plainWorker(name, processor, opts = {}) {
  const w = new Worker(name, processor, { connection, ...opts });
  w.on('error', () => {});
  closers.push(() => w.close(true));
  return w;
}

test('a job is a claim: in flight while its processor runs, done once BullMQ has completed it', async () => {
  const name = queueName();
  const queue = newQueue(name);
  const adapter = newAdapter();
  const g = gate();
  let started = 0;
  const w = adapter.worker(name, async () => {
    started++;
    await g.p;
    return 'ok';
  }, { connection });
  assert.ok(w instanceof HandoffWorker && w instanceof Worker);
  const job = await queue.add('j', {});
  await eventually(() => started === 1, 5000, 'started');
  const st = adapter.agent.drainStatus();
  assert.equal(st.inFlight, 1);
  assert.equal(st.unstarted, undefined);
  assert.equal(st.drained, false);
  g.open();
  await eventually(async () => (await queue.getJobState(job.id)) === 'completed', 5000, 'completed');
  await eventually(() => adapter.agent.inFlight === 0, 5000, 'done');
});

test('stop-claiming pauses the worker: active jobs drain, jobs added later are not taken', async () => {
  const name = queueName();
  const queue = newQueue(name);
  const adapter = newAdapter();
  const g = gate();
  let calls = 0;
  const w = adapter.worker(name, async () => {
    calls++;
    await g.p;
  }, { connection, concurrency: 4 });
  await queue.addBulk([{ name: 'a', data: {} }, { name: 'b', data: {} }]);
  // Held as soon as fetched, started once BullMQ calls the processor:
  // wait for both processors, or stop-claiming hands the unstarted back.
  await eventually(() => calls === 2, 5000, 'two started');
  assert.equal(adapter.agent.inFlight, 2);
  assert.equal(adapter.agent.unstarted, 0);
  adapter.agent.stopClaiming();
  await eventually(() => w.isPaused(), 2000, 'paused');
  await queue.addBulk([{ name: 'c', data: {} }, { name: 'd', data: {} }, { name: 'e', data: {} }]);
  await sleep(300);
  assert.equal(await queue.getWaitingCount(), 3);
  assert.equal(calls, 2);
  assert.equal(adapter.agent.inFlight, 2);
  const drained = adapter.agent.waitDrained();
  g.open();
  await drained;
  assert.equal(await queue.getCompletedCount(), 2);
  assert.equal(await queue.getWaitingCount(), 3);
});

test("stop-claiming cuts the worker's blocking wait: a job added then wakes another worker at once", async (t) => {
  // Both workers idle in BZPOPMIN on the queue's marker, this one first:
  // Redis would hand it the next marker, and a paused worker would take no
  // job for it, leaving the other asleep until its drainDelay (5 s).
  const name = queueName();
  const queue = newQueue(name);
  const adapter = newAdapter();
  adapter.worker(name, async () => {}, { connection });
  await sleep(300);
  let startedAt;
  plainWorker(name, async () => {
    startedAt = now();
  });
  await sleep(300);
  adapter.agent.stopClaiming();
  await sleep(100);
  const addedAt = now();
  await queue.add('j', {});
  await eventually(() => startedAt !== undefined, 4000, 'taken by the other worker');
  const ms = startedAt - addedAt;
  t.diagnostic(`job added after stop-claiming taken by the other worker in ${ms.toFixed(1)} ms`);
  assert.ok(ms < 1000, `${ms} ms`);
});

test("jobs BullMQ fetched ahead of processing them are handed back at stop-claiming, their processor never called", async () => {
  // BullMQ's main loop fetches up to concurrency jobs, one after another,
  // before it starts any: stop-claiming comes while it fetches the second.
  const name = queueName();
  const queue = newQueue(name);
  const adapter = newAdapter();
  const handedBack = [];
  adapter.on('handedBack', (job, reason) => handedBack.push([job.name, reason]));
  let calls = 0;
  let status;
  const w = adapter.worker(name, async () => {
    calls++;
  }, { connection, concurrency: 4, autorun: false });
  await queue.add('a', {});
  await queue.add('b', {});
  w.on('active', (job) => {
    if (job.name === 'b') {
      adapter.agent.stopClaiming();
      status = adapter.agent.drainStatus();
    }
  });
  void w.run();
  await eventually(() => handedBack.length === 2, 5000, 'both handed back');
  // a was held unstarted; b's fetch was a pending receive.
  assert.equal(status.inFlight, 1);
  assert.equal(status.unstarted, 1);
  assert.equal(status.receiving, 1);
  assert.deepEqual(handedBack.map(([n, r]) => `${n}:${r}`).sort(), ['a:unstarted', 'b:unstarted']);
  await eventually(() => adapter.agent.inFlight === 0, 5000, 'no claim left');
  await sleep(100);
  assert.equal(calls, 0);
  assert.equal(await queue.getWaitingCount(), 2);
  assert.equal(await queue.getActiveCount(), 0);
});

test('a job fetched in the race with stop-claiming is handed back unstarted: its processor is never called', async () => {
  // With concurrency 1, completing x fetches y in the same call
  // (moveToFinished's fetch-next); stop-claiming comes right then.
  const name = queueName();
  const queue = newQueue(name);
  const adapter = newAdapter();
  const handedBack = [];
  adapter.on('handedBack', (job, reason) => handedBack.push([job.name, reason]));
  const calls = [];
  const w = adapter.worker(name, async (job) => {
    calls.push(job.name);
  }, { connection, autorun: false });
  await queue.add('x', {});
  await queue.add('y', {});
  w.once('completed', () => adapter.agent.stopClaiming());
  void w.run();
  await eventually(() => handedBack.length === 1, 5000, 'y handed back');
  assert.deepEqual(handedBack, [['y', 'unstarted']]);
  await eventually(() => adapter.agent.inFlight === 0, 5000, 'no claim left');
  await sleep(100);
  assert.deepEqual(calls, ['x']);
  const [y] = await queue.getJobs(['waiting']);
  assert.equal(y?.name, 'y');
  assert.equal(y.attemptsMade, 0);
});

test('at the drain deadline unfinished jobs go back to waiting, another worker takes them in milliseconds, and the late result is refused', async (t) => {
  const name = queueName();
  const queue = newQueue(name);
  const adapter = newAdapter();
  const handedBack = [];
  adapter.on('handedBack', (job, reason) => handedBack.push([job.id, reason]));
  const g = gate();
  const reasons = new Map();
  const aCompleted = [];
  let started = 0;
  const w = adapter.worker(name, async (job, _token, signal) => {
    started++;
    signal.addEventListener('abort', () => reasons.set(job.id, signal.reason));
    await g.p; // ignores the abort: it stands for work that does not stop in time
    return 'A';
  }, { connection, concurrency: 4 });
  w.on('completed', (job) => aCompleted.push(job.id));
  const jobs = await queue.addBulk([{ name: 'a', data: {} }, { name: 'b', data: {} }, { name: 'c', data: {} }]);
  await eventually(() => started === 3, 5000, 'three started');
  adapter.agent.stopClaiming();

  const startedOnB = new Map();
  plainWorker(name, async (job) => {
    startedOnB.set(job.id, now());
    return 'B';
  }, { concurrency: 8 });
  await sleep(200); // B idle, blocked on the marker

  const returnedAt = now();
  const res = await adapter.agent.return();
  assert.deepEqual(res, { returned: 3 });
  await eventually(() => startedOnB.size === 3, 4000, 'taken by B');
  const lat = [...startedOnB.values()].map((t) => t - returnedAt);
  t.diagnostic(`returned 3 jobs; the other worker started them ${lat.map((l) => l.toFixed(1)).join(', ')} ms after the return began`);
  assert.ok(Math.max(...lat) < 1000, `${lat}`);
  assert.deepEqual(handedBack.map(([, r]) => r), ['deadline', 'deadline', 'deadline']);
  for (const j of jobs) assert.ok(reasons.get(j.id) instanceof HandedBackError, `job ${j.id}: ${reasons.get(j.id)}`);
  for (const j of jobs) await eventually(async () => (await queue.getJobState(j.id)) === 'completed', 4000, `job ${j.id} completed by B`);

  // A's processors now return: BullMQ refuses their results (the lock is B's, or gone).
  g.open();
  await eventually(() => adapter.agent.inFlight === 0, 5000, "A's claims done");
  await sleep(100);
  assert.deepEqual(aCompleted, []);
  for (const j of jobs) {
    const got = await queue.getJob(j.id);
    assert.equal(got.returnvalue, 'B');
    assert.equal(got.attemptsMade, 1);
    assert.equal(got.failedReason, undefined);
  }
  assert.equal(await queue.getFailedCount(), 0);
  // Safe to repeat: nothing left to hand back.
  assert.deepEqual(await adapter.agent.return(), { returned: 0 });
});

test('BullMQ refuses a completion with the lock token of a job moved back to waiting', async () => {
  // What the hand-back relies on, checked on BullMQ itself.
  const name = queueName();
  const queue = newQueue(name);
  const w = plainWorker(name, null, { autorun: false });
  await queue.add('j', {});
  const job = await w.getNextJob('token-1');
  assert.ok(job);
  await job.moveToWait('token-1');
  assert.equal(await queue.getJobState(job.id), 'waiting');
  await assert.rejects(job.moveToCompleted('late', 'token-1', false), /Missing lock for job/);
  await assert.rejects(job.moveToFailed(new Error('late'), 'token-1'), /Missing lock for job/);
  const again = await w.getNextJob('token-2');
  assert.equal(again.id, job.id);
  await assert.rejects(job.moveToCompleted('late', 'token-1', false), /Lock mismatch for job/);
  assert.equal(await queue.getJobState(job.id), 'active');
});

test('the cancel fallback aborts the processors; a job whose processor then throws goes back to waiting, not failed, and is counted', async () => {
  const name = queueName();
  const queue = newQueue(name);
  const adapter = newAdapter();
  const handedBack = [];
  adapter.on('handedBack', (job, reason) => handedBack.push(reason));
  const reasons = [];
  let started = 0;
  adapter.worker(name, (job, _token, signal) =>
    new Promise((_resolve, reject) => {
      started++;
      signal.addEventListener('abort', () => {
        reasons.push(signal.reason);
        reject(signal.reason);
      });
    }), { connection, concurrency: 2, attempts: 3 });
  await queue.addBulk([{ name: 'a', data: {}, opts: { attempts: 3 } }, { name: 'b', data: {}, opts: { attempts: 3 } }]);
  await eventually(() => started === 2, 5000, 'two started');
  adapter.agent.stopClaiming();
  const res = await adapter.agent.return({ cancel: true, cancelWaitMillis: 3000 });
  assert.deepEqual(res, { returned: 2 });
  assert.equal(reasons.length, 2);
  for (const r of reasons) assert.ok(r instanceof CanceledError);
  assert.deepEqual(handedBack, ['canceled', 'canceled']);
  assert.equal(adapter.agent.inFlight, 0);
  assert.equal(await queue.getWaitingCount(), 2);
  assert.equal(await queue.getFailedCount(), 0);
  assert.equal(await queue.getDelayedCount(), 0);
  for (const j of await queue.getJobs(['waiting'])) assert.equal(j.attemptsMade, 0);
});

test('a worker made after stop-claiming is paused and takes nothing, resumed or not', async () => {
  const name = queueName();
  const queue = newQueue(name);
  const adapter = newAdapter();
  adapter.agent.stopClaiming();
  let calls = 0;
  const w = adapter.worker(name, async () => {
    calls++;
  }, { connection });
  await queue.add('j', {});
  await sleep(300);
  assert.equal(calls, 0);
  assert.ok(w.isPaused());
  await w.resume();
  await sleep(200);
  assert.ok(w.isPaused());
  assert.equal(calls, 0);
  assert.equal(await queue.getWaitingCount(), 1);
});

test('the hand-backs are the adapter\'s own', () => {
  assert.throws(() => new BullMQAdapter({ insecureNoToken: true, returnClaims: () => 0 }), /returnClaims and options.handBack are the adapter's own/);
});
