// @handoff-dev/worker/testing's fixture, step by step: FixtureHooks (the
// worker's half) and runFixture (the fixture command). The whole contract
// is proved by the real `handoff conformance` in conformance.test.mjs.
import assert from 'node:assert/strict';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { StoppingError } from '../dist/index.js';
import { FakeClock, FixtureHooks, fixtureMain, runFixture, serveFixture } from '../dist/testing.js';
import { serve } from './app.mjs';
import { tempDir } from './helpers.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function eventually(cond, ms = 5000) {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) return false;
    await sleep(5);
  }
  return true;
}

/** A worker: three claim loops on an in-process list, the fixture's messages worked by FixtureHooks.work. */
async function worker(t, { deliver = true, options = {} } = {}) {
  const app = await serve(t, options);
  const { agent } = app;
  const items = [];
  const wake = new Set();
  const canceled = [];
  const hooks = new FixtureHooks(agent, {
    publish: (body) => (items.push(body), [...wake].forEach((w) => w())),
    deliver: deliver ? (body) => body : undefined,
  });
  const take = () =>
    new Promise((resolve) => {
      if (items.length) return resolve(items.shift());
      const w = () => items.length && (wake.delete(w), resolve(items.shift()));
      wake.add(w);
    });
  const loop = async () => {
    for (;;) {
      let r;
      try {
        r = agent.receive();
      } catch (err) {
        if (err instanceof StoppingError) return;
        throw err;
      }
      const body = await take();
      const claim = r.hold();
      r.end();
      try {
        await hooks.work(body, claim);
      } catch {
        canceled.push(body);
      } finally {
        claim.done();
      }
    }
  };
  for (let i = 0; i < 3; i++) void loop();
  t.after(() => hooks.step(['finish']));
  return { app, agent, hooks, canceled };
}

test('hold answers once the work runs; finish ends it', async (t) => {
  const { agent, hooks } = await worker(t);
  assert.equal(await hooks.step(['hold', '2']), 'ok');
  assert.deepEqual([agent.inFlight, agent.unstarted], [2, 0], 'counted at the answer, not later');
  assert.equal(await hooks.step(['hold', '1']), 'ok');
  assert.equal(agent.inFlight, 3);
  assert.equal(await hooks.step(['finish']), 'ok');
  assert.ok(await eventually(() => agent.inFlight === 0));
  assert.equal(await hooks.step(['hold', '1']), 'ok'); // work held after a finish waits for the next one
  assert.equal(agent.inFlight, 1);
  assert.equal(await hooks.step(['finish']), 'ok');
  assert.ok(await eventually(() => agent.inFlight === 0));
});

test('hold-cancelable ends at the cancel fallback, not at finish', async (t) => {
  const { app, agent, hooks, canceled } = await worker(t);
  assert.equal(await hooks.step(['hold-cancelable', '2']), 'ok');
  assert.equal(await hooks.step(['hold', '1']), 'ok');
  assert.equal(await hooks.step(['finish']), 'ok');
  assert.ok(await eventually(() => agent.inFlight === 2), 'the held one ended; the cancelable ones wait for the cancel');
  assert.deepEqual(canceled, []);
  await app.return(true, 3000);
  assert.ok(await eventually(() => canceled.length === 2 && agent.inFlight === 0));
});

test('hold-unstarted holds unstarted; finish drops those not handed back; without deliver: unsupported', async (t) => {
  const { agent, hooks } = await worker(t);
  assert.equal(await hooks.step(['hold-unstarted', '3']), 'ok');
  assert.deepEqual([agent.inFlight, agent.unstarted], [3, 3]);
  assert.equal(await hooks.step(['finish']), 'ok');
  assert.deepEqual([agent.inFlight, agent.unstarted], [0, 0]);
  const plain = await worker(t, { deliver: false });
  assert.equal(await plain.hooks.step(['hold-unstarted', '1']), 'unsupported');
});

test('bad steps answer an error', async (t) => {
  const { hooks } = await worker(t);
  for (const [words, want] of [
    [['hold'], 'error: N must be an integer >= 1, got ""'],
    [['hold', 'x'], 'error: N must be an integer >= 1, got "x"'],
    [['hold-cancelable', '0'], 'error: N must be an integer >= 1, got "0"'],
    [['lead'], 'error: lead needs a Lease name'],
    [['restart'], "error: restart is the fixture command's step (runFixture), not the worker's"],
    [['frobnicate', '1'], 'error: unknown step "frobnicate 1"'],
    [['ping'], 'ok'],
  ]) {
    assert.equal(await hooks.step(words), want, words.join(' '));
  }
});

test('lead, stopping, release', async (t) => {
  const fake = new FakeClock();
  const { app, hooks } = await worker(t, { options: { clock: fake } });
  assert.equal(await hooks.step(['lead', 'L']), 'no', 'not the leader');
  assert.equal(await hooks.step(['stopping', 'L']), 'no', 'no leader work began');
  const seq = BigInt(Math.floor(fake.now())) * 1_000_000n;
  await app.grant('L', seq, { validForMillis: 2000, until: new Date(fake.now() + 10_000).toISOString(), fencingToken: 1 });
  assert.equal(await hooks.step(['lead', 'L']), 'yes');
  assert.equal(await hooks.step(['lead', 'L']), 'yes');
  assert.equal(await hooks.step(['stopping', 'L']), 'no');
  fake.step(3000);
  assert.equal(await hooks.step(['stopping', 'L']), 'yes');
  assert.equal(await hooks.step(['release', 'L']), 'ok');
  assert.equal(await hooks.step(['stopping', 'L']), 'no', 'released work is forgotten');
  assert.equal(await hooks.step(['release', 'L']), 'ok', 'nothing begun: nothing to do');
});

/** Collects what runFixture writes. */
function sink() {
  const s = { out: '', err: '' };
  s.io = { stdout: { write: (x) => (s.out += x) }, stderr: { write: (x) => (s.err += x) } };
  return s;
}

test('served on a socket and driven by the fixture command', async (t) => {
  const dir = tempDir(t);
  const { hooks } = await worker(t);
  await hooks.serve(join(dir, 'fixture.sock'));
  const run = async (...words) => {
    const s = sink();
    return [await runFixture(dir, 'unused', words, s.io), s.out, s.err];
  };
  assert.deepEqual(await run('stopping', 'L'), [0, 'no\n', '']);
  assert.deepEqual(await run('release', 'L'), [0, '', ''], 'ok prints nothing');
  const [status, out, err] = await run('hold', 'x');
  assert.deepEqual([status, out], [1, '']);
  assert.match(err, /hold x: N must be an integer/);
  await hooks.close();
  assert.equal(existsSync(join(dir, 'fixture.sock')), false);
  assert.equal((await run('finish'))[0], 1, 'nothing serves: a failed step');
  const s = sink();
  assert.equal(await fixtureMain(['--dir', dir, 'hold'], s.io), 2, 'usage');
});

test('serveFixture serves only under the fixture', async (t) => {
  const { agent } = await serve(t);
  const before = process.env.HANDOFF_FIXTURE_SOCKET;
  delete process.env.HANDOFF_FIXTURE_SOCKET;
  t.after(() => (before === undefined ? delete process.env.HANDOFF_FIXTURE_SOCKET : (process.env.HANDOFF_FIXTURE_SOCKET = before)));
  assert.equal(await serveFixture(agent, { publish() {} }), undefined);
  assert.throws(() => new FixtureHooks(agent, {}), /publish is required/);
});

const dist = join(fileURLToPath(import.meta.url), '..', '..', 'dist', 'index.js');
const workerSource = `
import { Agent } from ${JSON.stringify(dist)};
import { serveFixture } from ${JSON.stringify(join(dist, '..', 'testing.js'))};
const agent = new Agent({ insecureNoToken: true });
await agent.listen({ url: 'unix://' + process.argv[2] });
await serveFixture(agent, { publish() {} });
setInterval(() => {}, 1 << 30);
`;

test('restart starts a fresh process; stop stops it', async (t) => {
  const dir = tempDir(t);
  writeFileSync(join(dir, 'w.mjs'), workerSource);
  const cmd = `'${process.execPath}' '${join(dir, 'w.mjs')}' '${join(dir, 'app.sock')}'`;
  const pids = [];
  for (let i = 0; i < 2; i++) {
    const s = sink();
    assert.equal(await runFixture(dir, cmd, ['restart'], s.io), 0, s.err);
    assert.ok(existsSync(join(dir, 'app.sock')), 'the app serves before the fixture answers');
    pids.push(Number(readFileSync(join(dir, 'worker.pid'), 'utf8')));
  }
  t.after(() => {
    try {
      process.kill(pids[1], 'SIGKILL');
    } catch {
      // stopped
    }
  });
  assert.notEqual(pids[0], pids[1]);
  const gone = (pid) => {
    try {
      return readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].startsWith('Z');
    } catch {
      return true;
    }
  };
  assert.ok(gone(pids[0]), 'the process before is gone');
  assert.equal(await runFixture(dir, cmd, ['stop'], sink().io), 0);
  assert.ok(gone(pids[1]));
  const s = sink();
  assert.equal(await runFixture(dir, "sh -c 'exit 3'", ['restart'], s.io), 1);
  assert.match(s.err, /exited with status 3/);
});
