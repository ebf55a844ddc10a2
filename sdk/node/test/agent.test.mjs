// The Agent's semantics, the same as the Go package worker's: receives and
// claims, stop-claiming, the drain, hand-back of unstarted claims, the
// return fallback and the hand-backs after it.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  Agent,
  CanceledError,
  ClaimDoneError,
  ConfigError,
  HandedBackError,
  ReturnOverdueError,
  StoppingError,
  parseGoDuration,
  shardsFromEnv,
} from '../dist/index.js';
import { FakeClock } from '../dist/testing.js';
import { serve } from './app.mjs';
import { call, eventually, settle, sleep, tempDir, token } from './helpers.mjs';

/** A queue with a visibility timeout, as one worker sees it (the Go tests' visQueue). */
class VisQueue {
  visible = [];
  claimed = new Set();
  calls = 0;
  running = 0;
  overlapped = false;
  waiters = new Set();
  /** Runs inside returnClaims, after it has looked at the queue. */
  hook = undefined;
  /** Runs first in returnClaims, before it looks at the queue, with the call's number (1 for the first). */
  gate = undefined;

  put(id) {
    this.visible.push(id);
    for (const w of [...this.waiters]) w();
  }

  receive(signal) {
    return new Promise((resolve, reject) => {
      const take = () => {
        const id = this.visible.shift();
        if (id === undefined) return false;
        this.claimed.add(id);
        this.waiters.delete(take);
        resolve(id);
        return true;
      };
      if (take()) return;
      if (signal?.aborted) return reject(signal.reason);
      this.waiters.add(take);
      signal?.addEventListener('abort', () => {
        if (this.waiters.delete(take)) reject(signal.reason);
      });
    });
  }

  returnClaims = async () => {
    if (++this.running > 1) this.overlapped = true;
    const call = ++this.calls;
    if (this.gate) await this.gate(call);
    const n = this.claimed.size;
    for (const id of this.claimed) this.visible.push(id);
    this.claimed.clear();
    try {
      if (this.hook) await this.hook();
    } finally {
      this.running--;
    }
    return n;
  };

  async waitVisible(...ids) {
    await eventually(() => ids.every((id) => this.visible.includes(id)), 5000, `${ids} handed back`);
  }
}

test('a receive is not in flight, and stop-claiming aborts its signal before it answers', async (t) => {
  const app = await serve(t);
  const a = app.agent;
  const r = a.receive();
  let st = await app.drain();
  assert.deepEqual([st.inFlight, st.receiving, st.drained, st.stopping], [0, 1, false, false]);
  let seen;
  r.signal.addEventListener('abort', () => (seen = r.signal.reason));
  let stoppingEvent = false;
  a.on('stopping', () => (stoppingEvent = true));
  st = await app.stopClaiming();
  assert.equal(st.stopping, true);
  assert.ok(seen instanceof StoppingError, 'the receive aborted with StoppingError before stop-claiming answered');
  assert.ok(a.stoppingSignal.aborted && a.stoppingSignal.reason instanceof StoppingError);
  assert.ok(stoppingEvent);
  await a.stopping; // resolved
  assert.throws(() => a.receive(), StoppingError);
  assert.throws(() => a.begin(), StoppingError);
  r.end();
  st = await app.drain();
  assert.equal(st.drained, true);
  assert.equal(st.instance, a.instance);
  assert.match(a.instance, /^[0-9a-f]{16}$/);
});

test('a stopping listener that throws does not keep stop-claiming from answering', async (t) => {
  const errors = [];
  const app = await serve(t, { logger: { info() {}, error: (msg) => errors.push(msg) } });
  app.agent.on('stopping', () => {
    throw new Error('listener bug');
  });
  const st = await app.stopClaiming();
  assert.equal(st.stopping, true);
  assert.deepEqual(errors, ["a 'stopping' listener threw"]);
});

test('an idle long poll is drained once stop-claiming ends it', async (t) => {
  const app = await serve(t);
  const q = new VisQueue();
  const loop = (async () => {
    for (;;) {
      let r;
      try {
        r = app.agent.receive();
      } catch (e) {
        assert.ok(e instanceof StoppingError);
        return;
      }
      try {
        await q.receive(r.signal);
      } catch {
        // cut off
      }
      r.end();
    }
  })();
  await eventually(() => app.agent.receiving === 1);
  const poll = app.drain(5000);
  await sleep(50);
  await app.stopClaiming();
  const st = await poll;
  assert.equal(st.drained, true);
  await loop;
});

test('a message received in the race with stop-claiming is held, and the drain waits for it', async (t) => {
  const app = await serve(t);
  const r = app.agent.receive();
  await app.stopClaiming();
  const c = r.hold(); // never refused
  r.end();
  let st = await app.drain();
  assert.deepEqual([st.inFlight, st.drained], [1, false]);
  assert.equal(c.signal.aborted, false, 'stop-claiming does not end a claim');
  const poll = app.drain(5000);
  await sleep(20);
  c.done();
  c.done(); // idempotent
  st = await poll;
  assert.equal(st.drained, true);
});

test('a batch holds each message; done of each ends it', async (t) => {
  const app = await serve(t);
  const r = app.agent.receive();
  const cs = [r.hold(), r.hold(), r.hold()];
  r.end();
  assert.equal(app.agent.inFlight, 3);
  cs[1].done();
  assert.equal(app.agent.inFlight, 2);
  assert.ok(cs[1].signal.aborted && cs[1].isDone);
  for (const c of cs) c.done();
  assert.equal(app.agent.inFlight, 0);
});

test('the cancel fallback aborts every claim with CanceledError, also one held after it', async (t) => {
  const q = new VisQueue();
  const app = await serve(t, { returnClaims: q.returnClaims });
  const r = app.agent.receive();
  const c = r.hold();
  const b = app.agent.begin();
  const start = Date.now();
  const ret = app.return(true, 300);
  await eventually(() => c.signal.aborted);
  assert.ok(c.signal.reason instanceof CanceledError);
  assert.ok(b.signal.reason instanceof CanceledError);
  // The work ignores it: the return waits cancelWaitMillis, then hands back.
  const res = await ret;
  assert.ok(Date.now() - start >= 290, 'waited for canceled work');
  assert.deepEqual(res, { returned: 0 });
  const late = r.hold(); // received in the race: held, and canceled at once
  r.end();
  assert.ok(late.signal.aborted && late.signal.reason instanceof CanceledError);
  late.done();
  const r2 = (() => {
    try {
      return app.agent.receive();
    } catch (e) {
      return e;
    }
  })();
  assert.ok(r2 instanceof StoppingError, 'the return fallback stopped claiming');
  c.done();
  b.done();
});

test('the cancel fallback answers as soon as canceled work has ended', async (t) => {
  const q = new VisQueue();
  q.put('m');
  const app = await serve(t, { returnClaims: q.returnClaims });
  const r = app.agent.receive();
  await q.receive(r.signal);
  const c = r.hold();
  r.end();
  c.signal.addEventListener('abort', () => c.done()); // ends unacknowledged
  const start = Date.now();
  const res = await app.return(true, 5000);
  assert.ok(Date.now() - start < 2000);
  assert.deepEqual(res, { returned: 1 }); // still claimed in the queue: handed back
});

test('receive and begin refuse an aborted signal; claims end with the signal given', async (t) => {
  const app = await serve(t);
  const c = new AbortController();
  const r = app.agent.receive(c.signal);
  const claim = r.hold();
  const b = app.agent.begin(c.signal);
  r.end();
  c.abort(new Error('shutting down'));
  assert.equal(claim.signal.reason.message, 'shutting down');
  assert.equal(b.signal.reason.message, 'shutting down');
  assert.throws(() => app.agent.receive(c.signal), /shutting down/);
  claim.done();
  b.done();
  // Many claims on one signal add one listener to it.
  const parent = new AbortController();
  const r2 = app.agent.receive(parent.signal);
  const many = Array.from({ length: 50 }, () => r2.hold());
  r2.end();
  for (const m of many) m.done();
});

// Node 20 has no `using` syntax yet; TypeScript compiles `using` and
// `await using` to calls of these (examples/loop.ts uses them).
test('Symbol.dispose ends receives and claims (using / await using)', async (t) => {
  const app = await serve(t);
  const r = app.agent.receive();
  const c = r.hold();
  assert.equal(app.agent.inFlight, 1);
  c[Symbol.dispose]();
  r[Symbol.dispose]();
  assert.deepEqual([app.agent.inFlight, app.agent.receiving], [0, 0]);
  assert.ok(c.isDone);
  const b = app.agent.begin();
  b[Symbol.dispose]();
  assert.equal(app.agent.inFlight, 0);
  assert.equal(typeof app.server[Symbol.asyncDispose], 'function');
});

test('stop-claiming hands back the unstarted claims at once, and start refuses them', async (t) => {
  const handedBack = [];
  const app = await serve(t, {
    handBack: (claims) => {
      handedBack.push(claims.map((c) => c.value));
    },
    returnClaims: () => assert.fail('returnClaims called: the fallback is not this test\'s'),
  });
  const r = app.agent.receive();
  const batch = [r.holdUnstarted(1), r.holdUnstarted(2), r.holdUnstarted(3)];
  r.end();
  batch[0].start();
  let st = await app.drain();
  assert.deepEqual([st.inFlight, st.unstarted, st.drained], [3, 2, false]);
  st = await app.stopClaiming();
  assert.deepEqual([st.inFlight, st.unstarted], [3, 2], 'stop-claiming answers what was held when told to stop');
  for (const c of batch.slice(1)) {
    assert.throws(() => c.start(), HandedBackError);
    c.done(); // the app's, on a claim taken: nothing
  }
  await eventually(() => handedBack.length === 1);
  assert.deepEqual(handedBack[0].sort(), [2, 3]);
  assert.equal(batch[0].signal.aborted, false);
  batch[0].start(); // started already: nothing
  batch[0].done();
  st = await app.drain(5000);
  assert.deepEqual([st.drained, st.inFlight, st.unstarted ?? 0], [true, 0, 0]);
  assert.throws(() => batch[0].start(), ClaimDoneError);
  assert.equal(handedBack.length, 1);
});

test('a claim held unstarted after stop-claiming is handed back too; a failed hand-back waits for the return', async (t) => {
  const calls = [];
  let returned = 0;
  const app = await serve(t, {
    handBack: (claims) => {
      calls.push(claims);
      throw new Error('queue unreachable');
    },
    returnClaims: () => ++returned && 1,
  });
  const r = app.agent.receive();
  await app.stopClaiming();
  const c = r.holdUnstarted('late');
  r.end();
  assert.throws(() => c.start(), HandedBackError);
  await eventually(() => calls.length === 1);
  assert.equal(calls[0][0].value, 'late');
  await settle();
  let st = await app.drain(10);
  assert.deepEqual([st.drained, st.unstarted], [false, 1]);
  assert.deepEqual(await app.return(false, 0), { returned: 1 });
  st = await app.drain(5000);
  assert.equal(st.drained, true);
  assert.equal(returned, 1);
});

test('without handBack, unstarted claims stay held until started or done', async (t) => {
  const app = await serve(t);
  const r = app.agent.receive();
  const c = r.holdUnstarted('x');
  r.end();
  await app.stopClaiming();
  c.start();
  assert.deepEqual([app.agent.inFlight, app.agent.unstarted], [1, 0]);
  c.done();
});

test('runningMillis is the age of the oldest claim in progress, on the Agent clock', async (t) => {
  const fake = new FakeClock();
  const app = await serve(t, { clock: fake });
  const running = async () => (await app.drain()).runningMillis ?? 0;
  assert.equal(await running(), 0);
  const r = app.agent.receive();
  const later = r.holdUnstarted('later');
  const first = r.hold();
  r.end();
  fake.step(1500);
  assert.equal(await running(), 1500);
  later.start();
  fake.step(1000);
  assert.equal(await running(), 2500);
  first.done();
  assert.equal(await running(), 1000);
  later.done();
  assert.equal(await running(), 0);
});

/** beginWorker is one turn of a loop that waits for its message inside begin: it gives the message up once claiming has stopped. */
async function beginWorker(agent, q, begun) {
  const c = agent.begin();
  begun();
  const id = await q.receive(c.signal);
  await agent.stopping; // stopping: do not start it
  c.done();
  return id;
}

test('a claim ended after the return fallback is handed back: returnClaims runs again', async (t) => {
  const q = new VisQueue();
  const app = await serve(t, { returnClaims: q.returnClaims });
  let begun;
  const b = new Promise((r) => (begun = r));
  const ended = beginWorker(app.agent, q, begun);
  await b;
  await app.stopClaiming();
  assert.equal((await app.drain()).inFlight, 1);
  assert.deepEqual(await app.return(false, 0), { returned: 0 });
  q.put('m'); // after the hand-back; the waiting worker claims it
  assert.equal(await ended, 'm');
  await q.waitVisible('m');
  await app.agent.waitDrained();
});

test('waitDrained resolves only once the hand-back after the return fallback has run', async (t) => {
  // A worker that exits once waitDrained resolves leaves nothing claimed: a
  // wait inside begin claims its message just after the hand-back and gives
  // it up. Failed so before: waitDrained resolved as soon as no claim was
  // held, with the message still claimed (Go:
  // TestWaitDrainedWaitsForTheHandBackAfterReturn).
  const q = new VisQueue();
  let entered;
  const enteredP = new Promise((r) => (entered = r));
  let resume;
  const resumeP = new Promise((r) => (resume = r));
  q.gate = async (call) => {
    if (call !== 2) return; // the hand-back after the return fallback's
    entered();
    await resumeP;
  };
  const app = await serve(t, { returnClaims: q.returnClaims });
  let begun;
  const b = new Promise((r) => (begun = r));
  const ended = beginWorker(app.agent, q, begun);
  await b;
  await app.stopClaiming();
  assert.deepEqual(await app.return(false, 0), { returned: 0 });
  q.put('m'); // lands just after the hand-back; the worker claims it and gives it up
  assert.equal(await ended, 'm');
  await enteredP; // the hand-back of m is under way, and held there
  assert.equal(app.agent.inFlight, 0);
  const gone = new Error('gave up');
  await assert.rejects(
    app.agent.waitDrained(AbortSignal.abort(gone)),
    (e) => e === gone,
    'drained while the hand-back of m runs: a worker exiting now leaves m claimed',
  );
  resume();
  await app.agent.waitDrained(AbortSignal.timeout(10_000));
  assert.ok(q.visible.includes('m'), 'waitDrained resolved with m still claimed');
});

test('waitDrained waits for a hand-back only within its bound: past it, a ReturnOverdueError', async (t) => {
  // returnClaims stuck, ignoring its signal; the sidecar gives up on its
  // return call (the connection closes), which is that call's bound.
  let entered;
  const enteredP = new Promise((r) => (entered = r));
  let release;
  const releaseP = new Promise((r) => (release = r));
  t.after(() => release());
  let calls = 0;
  const app = await serve(t, {
    returnClaims: async () => {
      if (++calls === 1) {
        entered();
        await releaseP;
      }
      return 0;
    },
  });
  const r = app.agent.receive();
  const c = r.hold();
  r.end();
  const giveUp = new AbortController();
  const returned = call(app.url, 'POST', '/handoff/v1/return', '{"cancel":false}', { signal: giveUp.signal });
  await enteredP;
  c.done(); // nothing held now; the hand-back under way has not settled
  const gone = new Error('gave up');
  await assert.rejects(app.agent.waitDrained(AbortSignal.abort(gone)), (e) => e === gone);
  giveUp.abort();
  await assert.rejects(returned);
  await assert.rejects(app.agent.waitDrained(AbortSignal.timeout(10_000)), ReturnOverdueError);
});

test('a claim held after the return fallback and given up is handed back', async (t) => {
  const q = new VisQueue();
  const app = await serve(t, { returnClaims: q.returnClaims });
  const r = app.agent.receive();
  const received = q.receive(); // on the worker's own signal, not the receive's
  await app.stopClaiming();
  assert.deepEqual(await app.return(false, 0), { returned: 0 });
  q.put('m');
  assert.equal(await received, 'm');
  const c = r.hold();
  r.end();
  assert.equal(app.agent.inFlight, 1);
  c.done(); // given up, not finished
  await q.waitVisible('m');
});

test('claims ending during the first returnClaims are covered by one more call, never beside it', async (t) => {
  const q = new VisQueue();
  let looked;
  const lookedP = new Promise((r) => (looked = r));
  let resume;
  const resumeP = new Promise((r) => (resume = r));
  let first = true;
  q.hook = async () => {
    if (!first) return;
    first = false;
    looked();
    await resumeP;
  };
  const app = await serve(t, { returnClaims: q.returnClaims });
  const begun = [];
  const ended = [];
  for (let i = 0; i < 2; i++) {
    let b;
    begun.push(new Promise((r) => (b = r)));
    ended.push(beginWorker(app.agent, q, b));
  }
  await Promise.all(begun);
  await app.stopClaiming();
  const ret = app.return(false, 0);
  await lookedP; // the first call found nothing claimed
  q.put('m1');
  q.put('m2');
  await Promise.all(ended); // both given up while the first call runs
  resume();
  assert.deepEqual(await ret, { returned: 0 });
  await q.waitVisible('m1', 'm2');
  await app.return(false, 0);
  assert.equal(q.calls, 3, "the deadline's, one for the two claims that ended during it, the repeated return's");
  assert.equal(q.overlapped, false);
});

test('the return fallback stops claiming, should stop-claiming never have come', async (t) => {
  const q = new VisQueue();
  const app = await serve(t, { returnClaims: q.returnClaims });
  const r = app.agent.receive();
  await app.return(false, 0);
  assert.equal(app.agent.isStopping, true);
  assert.ok(r.signal.reason instanceof StoppingError);
  r.end();
  assert.throws(() => app.agent.begin(), StoppingError);
  assert.throws(() => app.agent.receive(), StoppingError);
});

test('a returnClaims error is answered with its count; a bad count is an error', async (t) => {
  const app = await serve(t, {
    returnClaims: () => {
      const e = new Error('queue down');
      e.returned = 2;
      throw e;
    },
  });
  assert.deepEqual(await app.return(false, 0), { returned: 2, error: 'queue down' });
  const app2 = await serve(t, { returnClaims: async () => -1 });
  const res = await app2.return(false, 0);
  assert.equal(res.returned, 0);
  assert.match(res.error, /returnClaims resolved to -1/);
});

test('no token, no Agent: unless insecureNoToken; a configured token must be good', async (t) => {
  assert.throws(() => new Agent({ env: {} }), (e) => e instanceof ConfigError && /HANDOFF_TOKEN_FILE/.test(e.message) && /insecureNoToken/.test(e.message));
  // An unsigned call: served without a token, refused with one.
  const unsigned = async (agent) => (await call((await serve(t, agent)).url, 'GET', '/handoff/v1/drain', '', { sign: false })).status;
  assert.equal(await unsigned(new Agent({ env: {}, insecureNoToken: true })), 200);
  const dir = tempDir(t);
  const f = join(dir, 'token');
  writeFileSync(f, `\n  ${token}  \n`);
  const b = new Agent({ env: { HANDOFF_TOKEN_FILE: f } });
  assert.equal(await unsigned(b), 401);
  assert.equal((await call((await serve(t, b)).url, 'GET', '/handoff/v1/drain')).status, 200, 'signed with the token read from the file');
  writeFileSync(f, 'short');
  assert.throws(() => new Agent({ env: { HANDOFF_TOKEN_FILE: f }, insecureNoToken: true }), /at least 32/);
  assert.throws(() => new Agent({ env: { HANDOFF_TOKEN_FILE: join(dir, 'none') }, insecureNoToken: true }), /ENOENT/);
  assert.throws(() => new Agent({ token: 'short' }), ConfigError);
});

test('the lease duration bounds grants: options, else $HANDOFF_LEASE_DURATION, else 1h', () => {
  assert.equal(new Agent({ token, env: {} }).maxTerm, 3_600_000);
  assert.equal(new Agent({ token, env: { HANDOFF_LEASE_DURATION: '15s' } }).maxTerm, 15_000);
  assert.equal(new Agent({ token, env: { HANDOFF_LEASE_DURATION: '1m30s' } }).maxTerm, 90_000);
  assert.equal(new Agent({ token, env: { HANDOFF_LEASE_DURATION: '15s' }, leaseDuration: 7000 }).maxTerm, 7000);
  for (const v of ['15', 'soon', '-1s', '0', '2h', '1h0m1s']) {
    assert.throws(() => new Agent({ token, env: { HANDOFF_LEASE_DURATION: v } }), ConfigError, v);
  }
  assert.equal(parseGoDuration('1.5s'), 1500);
  assert.equal(parseGoDuration('250ms'), 250);
  assert.equal(parseGoDuration('1h'), 3_600_000);
  assert.equal(parseGoDuration('1x'), undefined);
  assert.deepEqual(shardsFromEnv({ HANDOFF_SHARDS: ' a, b,,c ' }), ['a', 'b', 'c']);
  assert.deepEqual(shardsFromEnv({}), []);
});
