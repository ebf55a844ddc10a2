// A real handover between two pods, each the real handoff sidecar beside
// examples/bullmq-worker.mjs as plain processes (as `make demo` runs them,
// docs/protocol.md): a stream of jobs of varied durations, some longer than
// the drain window, and pod A shut down the way the kubelet does it (the
// preStop hook `handoff prestop` to A's control socket, then SIGTERM) with a
// grace period short enough that the drain deadline comes while jobs run.
// Checked: every job's effect applied exactly once and completed once
// (none lost, none applied twice), and the jobs A handed back at the
// deadline started on B within milliseconds.
//
// The sidecars run with no Leases and a kubeconfig whose API server refuses
// connections: without Leases a sidecar needs the API only to read its pod
// (the deletion deadline, else the grace period: HANDOFF_GRACE_PERIOD) and
// to write Events, which it logs and goes without.
//
// The binary is $HANDOFF_BIN (sdk/node/test.sh builds it); without it the
// test is skipped.
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { Queue, QueueEvents } from 'bullmq';
import { Redis } from 'ioredis';
import { queueName, redis, repo } from './redis.mjs';

const bin = process.env.HANDOFF_BIN;
const skip = bin ? false : 'HANDOFF_BIN is not set: build the handoff binary (go build ./cmd/handoff) and point HANDOFF_BIN at it, or run sdk/node/test.sh';
const example = join(repo, 'sdk', 'node', 'examples', 'bullmq-worker.mjs');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The grace period of pod A: deadline = prestop + grace - 2s margin, drain deadline 2s (handback reserve) before it. */
const grace = '6s';
const jobs = 240;

/** A deterministic stream: mostly short jobs, some longer than the drain window, some of those not stopping when told. */
function stream() {
  let seed = 23;
  const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  return Array.from({ length: jobs }, (_, i) => {
    const long = i % 4 === 1;
    return {
      name: `j${i}`,
      data: {
        amount: i + 1,
        workMillis: long ? 4000 + Math.floor(rnd() * 4000) : 20 + Math.floor(rnd() * 180),
        ignoreAbort: long && i % 8 === 1,
      },
      opts: { jobId: `job-${String(i).padStart(3, '0')}` },
    };
  });
}

const procs = [];
after(async () => {
  for (const p of procs) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
});

/** Starts a process whose output is kept (lines), and resolves its exit. */
function run(cmd, args, env, label) {
  const p = spawn(cmd, args, { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  procs.push(p);
  p.lines = [];
  p.label = label;
  let buf = '';
  const onData = (d) => {
    buf += d;
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      p.lines.push(buf.slice(0, nl));
      buf = buf.slice(nl + 1);
    }
  };
  p.stdout.setEncoding('utf8').on('data', onData);
  p.stderr.setEncoding('utf8').on('data', onData);
  p.exited = new Promise((resolve) => p.on('exit', (code, signal) => resolve({ code, signal })));
  return p;
}

function json(lines) {
  const out = [];
  for (const l of lines) {
    try {
      out.push(JSON.parse(l));
    } catch {
      // not a JSON line
    }
  }
  return out;
}

async function until(cond, ms, what) {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`${what}: not within ${ms}ms`);
    await sleep(20);
  }
}

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
};

/** One pod: a token, the sidecar and the example worker, with their sockets in a directory of their own. */
async function startPod(dir, name, env) {
  // The pod's handoff-run volume: the sockets of the control and app APIs.
  const runDir = join(dir, `${name}-run`);
  mkdirSync(runDir, { mode: 0o700 });
  const token = join(dir, `${name}-token`);
  await new Promise((resolve, reject) =>
    execFile(bin, ['install', '--token-file', token], (err, out, errOut) => (err ? reject(new Error(`${err.message}\n${out}${errOut}`)) : resolve())),
  );
  const pod = { name, token, control: `unix://${join(runDir, 'control.sock')}`, app: `unix://${join(runDir, 'app.sock')}` };
  pod.sidecar = run(
    bin,
    ['sidecar'],
    {
      HANDOFF_TOKEN_FILE: token,
      HANDOFF_POD_NAME: name,
      HANDOFF_POD_NAMESPACE: 'handover',
      HANDOFF_KUBECONFIG: join(dir, 'kubeconfig'),
      HANDOFF_CONTROL_ADDR: pod.control,
      HANDOFF_APP_URL: pod.app,
      HANDOFF_METRICS_ADDR: '127.0.0.1:0',
      HANDOFF_METRICS_LINGER: '0s',
      HANDOFF_GRACE_PERIOD: grace,
    },
    `${name}/sidecar`,
  );
  pod.worker = run(process.execPath, [example], { HANDOFF_TOKEN_FILE: token, HANDOFF_APP_URL: pod.app, ...env }, `${name}/worker`);
  await until(() => pod.worker.lines.some((l) => l.includes('"listening"')) || pod.worker.exitCode !== null, 20_000, `${name}'s worker listening`);
  assert.equal(pod.worker.exitCode, null, `${name}'s worker exited:\n${pod.worker.lines.join('\n')}`);
  await until(() => pod.sidecar.lines.some((l) => l.includes('handoff sidecar started')) || pod.sidecar.exitCode !== null, 20_000, `${name}'s sidecar started`);
  assert.equal(pod.sidecar.exitCode, null, `${name}'s sidecar exited:\n${pod.sidecar.lines.join('\n')}`);
  return pod;
}

test('handover: pod A shut down mid-stream; every job applied once, none lost, A\'s unfinished jobs started on B within milliseconds', { skip, timeout: 120_000 }, async (t) => {
  const { url, host, port } = await redis();
  const dir = mkdtempSync(join(tmpdir(), 'hbq-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  // An API server that refuses connections (port 1 on loopback).
  writeFileSync(
    join(dir, 'kubeconfig'),
    `apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
`,
  );
  const queue = queueName('handover');
  const connection = { host, port };
  const q = new Queue(queue, { connection });
  const events = new QueueEvents(queue, { connection });
  const r = new Redis(url);
  t.after(async () => {
    await events.close();
    await q.close();
    r.disconnect();
  });
  await events.waitUntilReady();
  const completed = new Map();
  const failed = [];
  events.on('completed', ({ jobId }) => completed.set(jobId, (completed.get(jobId) ?? 0) + 1));
  events.on('failed', ({ jobId, failedReason }) => failed.push(`${jobId}: ${failedReason}`));

  const common = { REDIS_URL: url, EXAMPLE_QUEUE: queue };
  const a = await startPod(dir, 'a', { ...common, EXAMPLE_WORKER_NAME: 'a', EXAMPLE_CONCURRENCY: '8' });
  const b = await startPod(dir, 'b', { ...common, EXAMPLE_WORKER_NAME: 'b', EXAMPLE_CONCURRENCY: '100' });

  // The stream: 12 jobs every 50 ms; A's preStop hook halfway through.
  const all = stream();
  let hook;
  for (let i = 0; i < all.length; i += 12) {
    await q.addBulk(all.slice(i, i + 12));
    if (!hook && i >= all.length / 2) {
      hook = new Promise((resolve) =>
        execFile(bin, ['prestop', '--addr', a.control, '--timeout', grace, '--token-file', a.token], (err, out, errOut) =>
          resolve({ err, out: `${out}${errOut}` }),
        ),
      );
    }
    await sleep(50);
  }
  const { err: hookErr, out: timeline } = await hook;
  for (const l of timeline.trim().split('\n')) t.diagnostic(`A's preStop: ${l}`);
  assert.equal(hookErr, null, timeline);
  // The kubelet's SIGTERM once the hook is done.
  a.worker.kill('SIGTERM');
  a.sidecar.kill('SIGTERM');

  await until(() => completed.size === jobs || failed.length > 0, 60_000, `all ${jobs} jobs completed (${completed.size} so far)`);
  await Promise.race([a.worker.exited, sleep(10_000)]);
  await sleep(500); // late events, if any

  // Once and only once.
  assert.deepEqual(failed, []);
  const twice = [...completed].filter(([, n]) => n !== 1);
  assert.deepEqual(twice, [], 'completed more than once');
  const applied = await r.hgetall(`${queue}:effects`);
  const ids = all.map((j) => j.opts.jobId);
  const lost = ids.filter((id) => applied[id] === undefined);
  const appliedTwice = ids.filter((id) => applied[id] !== undefined && applied[id] !== '1');
  assert.deepEqual(lost, [], 'effects never applied');
  assert.deepEqual(appliedTwice, [], 'effects applied more than once');
  assert.equal(Number(await r.get(`${queue}:balance`)), all.reduce((s, j) => s + j.data.amount, 0));
  const counts = await q.getJobCounts('waiting', 'active', 'delayed', 'failed', 'completed', 'prioritized');
  assert.deepEqual(counts, { waiting: 0, active: 0, delayed: 0, failed: 0, completed: jobs, prioritized: 0 });

  // What A did: started, handed back, and what B did with it.
  const aLog = json(a.worker.lines);
  const bLog = json(b.worker.lines);
  const sLog = json(a.sidecar.lines);
  const back = aLog.filter((l) => l.msg === 'job handed back');
  const deadlineBack = back.filter((l) => l.reason === 'deadline');
  assert.ok(deadlineBack.length > 0, `A handed back no job at the deadline: the scenario did not exercise it\n${timeline}`);
  const returnCall = sLog.find((l) => l.msg === 'shutdown step' && l.step === 'drain-deadline');
  assert.ok(returnCall, `no drain-deadline step in A's sidecar log:\n${a.sidecar.lines.join('\n')}`);
  const returnAt = returnCall.ts * 1000;
  const fromMove = [];
  const fromReturn = [];
  for (const h of back) {
    const start = bLog.find((l) => l.msg === 'job started' && l.jobId === h.jobId && l.at >= h.at - 50);
    assert.ok(start, `job ${h.jobId}, handed back by A (${h.reason}) at ${h.at}, never started on B after; B: ${JSON.stringify(bLog.filter((l) => l.jobId === h.jobId))}; A: ${JSON.stringify(aLog.filter((l) => l.jobId === h.jobId))}`);
    fromMove.push(start.at - h.at);
    if (h.reason === 'deadline') fromReturn.push(start.at - returnAt);
  }
  const applyTwiceAvoided = [...aLog, ...bLog].filter((l) => l.msg === 'effect was applied already').length;
  const aStarted = aLog.filter((l) => l.msg === 'job started').length;
  const fmt = (x) => `${x.toFixed(1)} ms`;
  const report = [
    `jobs ${jobs}: completed once ${[...completed.values()].filter((n) => n === 1).length}, effect applied once ${ids.length - lost.length - appliedTwice.length}, lost ${lost.length}, applied twice ${appliedTwice.length}`,
    `A started ${aStarted}; handed back ${back.length} (at the deadline ${deadlineBack.length}, unstarted ${back.length - deadlineBack.length}); second runs the dedup key stopped: ${applyTwiceAvoided}`,
    `B's pick-up of A's handed-back jobs, from A's move to waiting: p50 ${fmt(pct(fromMove, 50))}, max ${fmt(Math.max(...fromMove))}`,
    `B's pick-up of A's deadline hand-backs, from the sidecar's return call: p50 ${fmt(pct(fromReturn, 50))}, max ${fmt(Math.max(...fromReturn))}`,
  ];
  for (const l of report) t.diagnostic(l);
  // Without the hand-back they would wait for their lock (30 s) and a stalled check.
  assert.ok(Math.max(...fromReturn) < 1000, report.join('\n'));
  const exit = await a.worker.exited;
  assert.equal(exit.code, 0, `A's worker exit: ${JSON.stringify(exit)}\n${a.worker.lines.slice(-20).join('\n')}`);
  // B too: SIGTERM to its sidecar runs its (empty) shutdown sequence.
  b.sidecar.kill('SIGTERM');
  await Promise.race([b.sidecar.exited, sleep(10_000)]);
  b.worker.kill('SIGTERM');
  await Promise.race([b.worker.exited, sleep(10_000)]);
  assert.ok(!existsSync(join(dir, 'a-run', 'app.sock')), "A's worker removed its socket");
});
