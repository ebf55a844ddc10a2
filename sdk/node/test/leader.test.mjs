// Leadership: terms on the Agent's own clock, sequences, the revoke ack
// after leader work, the messages that cannot be genuine.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { NotLeaderError } from '../dist/index.js';
import { FakeClock } from '../dist/testing.js';
import { serve } from './app.mjs';
import { grantBody, nextSeq, revokeBody, settle, sleep } from './helpers.mjs';

/** An Agent on a FakeClock, and sequences and untils on that clock. */
async function fakeApp(t, options = {}) {
  const fake = new FakeClock();
  const app = await serve(t, { clock: fake, ...options });
  let n = 0n;
  const seq = () => BigInt(Math.floor(fake.now())) * 1_000_000n + ++n * 1000n;
  const until = (ms) => new Date(fake.now() + ms).toISOString();
  const grant = (lease, { validForMillis = 10_000, untilMillis = 10_000, fencingToken = 1 } = {}) =>
    app.grant(lease, seq(), { validForMillis, until: until(untilMillis), fencingToken });
  return { app, fake, seq, grant, agent: app.agent };
}

test('a term ends validForMillis after the receipt of its grant, on the Agent clock', async (t) => {
  const { fake, grant, agent } = await fakeApp(t);
  assert.deepEqual(await grant('a', { validForMillis: 1000 }), { leader: true });
  const l = agent.leader('a');
  assert.equal(l.fencingToken, 1n);
  assert.equal(l.until.getTime(), fake.now() + 1000);
  const w = agent.beginLeading('a');
  const changed = agent.leadershipChanged();
  fake.step(999);
  assert.ok(agent.leader('a'));
  assert.equal(w.signal.aborted, false);
  fake.step(1);
  assert.equal(agent.leader('a'), undefined);
  assert.ok(w.signal.aborted);
  assert.ok(w.signal.reason instanceof NotLeaderError);
  await changed;
  assert.throws(() => agent.beginLeading('a'), NotLeaderError);
  w.done();
});

test('a renewal moves the end of the term; until bounds it too', async (t) => {
  const { fake, grant, agent } = await fakeApp(t);
  await grant('a', { validForMillis: 1000 });
  fake.step(600);
  await grant('a', { validForMillis: 1000 }); // ends 1600 after the first grant
  fake.step(500);
  assert.ok(agent.leader('a'), 'renewed');
  fake.step(500);
  assert.equal(agent.leader('a'), undefined);
  // until before receipt + validForMillis ends the term first
  await grant('b', { validForMillis: 5000, untilMillis: 1000 });
  fake.step(999);
  assert.ok(agent.leader('b'));
  fake.step(1);
  assert.equal(agent.leader('b'), undefined);
  // a grant without validForMillis is over on arrival
  await grant('c', { validForMillis: 0 });
  assert.equal(agent.leader('c'), undefined);
});

test('a grant with a new fencing token ends the old term and begins another', async (t) => {
  const { grant, agent } = await fakeApp(t);
  await grant('a', { fencingToken: 3 });
  const w = agent.beginLeading('a');
  assert.equal(w.fencingToken, 3n);
  const changed = agent.leadershipChanged();
  let events = 0;
  agent.on('leadershipChanged', () => events++);
  await grant('a', { fencingToken: 4 });
  await changed;
  assert.ok(w.signal.aborted && w.signal.reason instanceof NotLeaderError);
  assert.equal(agent.leader('a').fencingToken, 4n);
  await grant('a', { fencingToken: 4 }); // a renewal: no change
  assert.equal(events, 1);
  w.done();
});

test('a revoke ends the term at once and is answered only once leader work is done', async (t) => {
  const { app, seq, grant, agent } = await fakeApp(t);
  await grant('a');
  const w1 = agent.beginLeading('a');
  const w2 = agent.beginLeading('a');
  let answered;
  const revoke = app.revoke('a', seq()).then((a) => (answered = a));
  await sleep(100);
  assert.ok(w1.signal.aborted && w2.signal.aborted, 'told to stop');
  assert.equal(answered, undefined, 'not acked while leader work runs');
  assert.throws(() => agent.beginLeading('a'), NotLeaderError, 'no leader work begins once revoked');
  w1.done();
  await sleep(50);
  assert.equal(answered, undefined);
  w2.done();
  w2.done(); // idempotent
  await revoke;
  assert.deepEqual(answered, { leader: false });
  // A revoke of a Lease never led, or revoked already, is acked at once.
  assert.deepEqual(await app.revoke('never', seq()), { leader: false });
  assert.deepEqual(await app.revoke('a', seq()), { leader: false });
});

// Stricter than the Go worker, as docs/protocol.md words it ("answers 200
// only after all its leader work for that Lease has stopped"): the Go Agent
// waits only for the work of the term the revoke ends, not for that of a
// term a new fencing token replaced while its work still ran.
test('a revoke waits also for the leader work of a term a new fencing token replaced', async (t) => {
  const { app, seq, grant, agent } = await fakeApp(t);
  await grant('a', { fencingToken: 3 });
  const w3 = agent.beginLeading('a');
  await grant('a', { fencingToken: 5 }); // lost and won again, its revoke never acked
  assert.ok(w3.signal.aborted, 'told to stop');
  const w5 = agent.beginLeading('a');
  let answered;
  const revoke = app.revoke('a', seq()).then((a) => (answered = a));
  w5.done();
  await sleep(100);
  assert.equal(answered, undefined, 'not acked while the replaced term\'s work runs');
  w3.done();
  await revoke;
  assert.deepEqual(answered, { leader: false });
  // Done, it is forgotten: the next revoke is acked at once.
  await grant('a', { fencingToken: 6 });
  assert.deepEqual(await app.revoke('a', seq()), { leader: false });
});

test('leader work ends with the signal given to beginLeading, and with using', async (t) => {
  const { grant, agent } = await fakeApp(t);
  await grant('a');
  const c = new AbortController();
  const w = agent.beginLeading('a', c.signal);
  c.abort(new Error('mine'));
  assert.equal(w.signal.reason.message, 'mine');
  w[Symbol.dispose]();
  assert.ok(agent.leader('a'), 'the term goes on');
});

test('sequences: older and repeated are stale, grant or revoke; the first message is applied whatever its number', async (t) => {
  const { app, seq, agent, fake } = await fakeApp(t);
  const until = new Date(fake.now() + 10_000).toISOString();
  const s1 = seq();
  assert.deepEqual(await app.grant('a', s1, { until }), { leader: true });
  assert.deepEqual(await app.grant('a', s1, { until }), { leader: true, stale: true });
  assert.deepEqual(await app.grant('a', s1 - 500n, { until }), { leader: true, stale: true });
  assert.deepEqual(await app.revoke('a', s1 - 1n), { leader: false, stale: true });
  assert.ok(agent.leader('a'), 'a stale revoke leaves the term');
  const mid = seq();
  assert.deepEqual(await app.revoke('a', seq()), { leader: false });
  assert.deepEqual(await app.grant('a', mid, { until }), { leader: true, stale: true }, 'a grant older than the revoke, delivered after it');
  assert.equal(agent.leader('a'), undefined);
  assert.deepEqual(await app.grant('b', 1n, { until }), { leader: true });
  assert.ok(agent.leader('b'));
  // Sequences are compared exactly, beyond 2^53.
  const big = seq();
  assert.deepEqual(await app.grant('c', big, { until }), { leader: true });
  assert.deepEqual(await app.grant('c', big + 1n, { until }), { leader: true });
  assert.deepEqual(await app.grant('c', big + 1n, { until }), { leader: true, stale: true });
});

test('messages the sidecar cannot send are answered 422 and not applied', async (t) => {
  const { app, seq, fake, agent } = await fakeApp(t, { leaseDuration: 15_000 });
  const nowNs = BigInt(fake.now()) * 1_000_000n;
  const until = (ms) => new Date(fake.now() + ms).toISOString();
  const bodies = [
    grantBody('a', nowNs + 1_000_000_001n, { until: until(1000), validForMillis: 1000 }),
    revokeBody('a', nowNs + 60_000_000_000n),
    grantBody('a', seq(), { validForMillis: 15_001, until: until(1000) }),
    grantBody('a', seq(), { validForMillis: 1000, until: until(15_001) }),
  ];
  for (const b of bodies) {
    const r = await app.lead('a', b);
    assert.equal(r.status, 422, b);
    assert.ok(r.json.error);
  }
  // Exactly at the bounds: applied.
  assert.equal((await app.lead('a', grantBody('a', nowNs + 1_000_000_000n, { until: until(15_000), validForMillis: 15_000 }))).status, 200);
  assert.ok(agent.leader('a'));
  // None of the refused sequences was recorded: a later one applies.
  fake.step(10);
  assert.deepEqual(await app.revoke('a', nowNs + 1_000_000_001n), { leader: false });
});

test('bad leadership bodies are 400 and not applied', async (t) => {
  const { app, seq, agent } = await fakeApp(t);
  const hi = seq() + 500_000_000n;
  for (const b of ['', '{', '[]', 'null', '{"leader": "yes"}', '{"sequence": "12"}', '{"leader": true, "until": "tomorrow"}', grantBody('other', hi), grantBody('a', hi) + ']']) {
    const r = await app.lead('a', b);
    assert.equal(r.status, 400, b);
    assert.ok(r.json.error, b);
  }
  assert.equal(agent.leader('a'), undefined);
  const r = await app.lead('a', `{"lease":"","leader":true,"sequence":${seq()},"fencingToken":1,"validForMillis":1000}`);
  assert.equal(r.status, 200, 'an empty lease is the path\'s');
  assert.ok(agent.leader('a'));
});

test('leadership continues after stop-claiming', async (t) => {
  const { app, grant, agent } = await fakeApp(t);
  await app.stopClaiming();
  await grant('a');
  await grant('a');
  const w = agent.beginLeading('a');
  assert.equal(w.signal.aborted, false);
  w.done();
});

test('leading lists the terms led, in the order of the names asked, or sorted', async (t) => {
  const { fake, grant, agent } = await fakeApp(t);
  await grant('s2', { validForMillis: 5000 });
  await grant('s1', { validForMillis: 1000 });
  await grant('s3', { validForMillis: 5000 });
  assert.deepEqual(agent.leading().map((l) => l.lease), ['s1', 's2', 's3']);
  assert.deepEqual(agent.leading('s3', 'x', 's1').map((l) => l.lease), ['s3', 's1']);
  fake.step(1000);
  assert.deepEqual(agent.leading().map((l) => l.lease), ['s2', 's3']);
});

test('a term runs out on the real clock by itself (no grant comes)', async (t) => {
  const app = await serve(t);
  // Not before validForMillis after the grant was sent, whatever the load
  // of the machine (a margin of a sleep would not hold on a busy one).
  const validForMillis = 400;
  const sent = performance.now();
  await app.grant('a', nextSeq(), { validForMillis });
  const w = app.agent.beginLeading('a');
  await new Promise((r) => w.signal.addEventListener('abort', r));
  const ranOut = performance.now() - sent;
  assert.ok(ranOut >= validForMillis - 5, `the term ran out ${ranOut}ms after the grant was sent; want ${validForMillis}ms at least`);
  assert.ok(w.signal.reason instanceof NotLeaderError);
  assert.match(w.signal.reason.message, /ran out/);
  assert.equal(app.agent.leader('a'), undefined);
  w.done();
  await settle();
});
