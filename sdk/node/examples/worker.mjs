#!/usr/bin/env node
// An example worker on @handoff-dev/worker: a few claim loops on an in-memory
// queue (memory-queue.mjs), served on $HANDOFF_APP_URL with the pod's token
// from $HANDOFF_TOKEN_FILE, as it would run beside the handoff sidecar.
//
//   HANDOFF_APP_URL=unix:///tmp/app.sock HANDOFF_TOKEN_FILE=token node examples/worker.mjs
//
// Under `handoff conformance` ($HANDOFF_FIXTURE_SOCKET set by its fixture
// command, examples/fixture.mjs) it also serves the fixture's steps
// (serveFixture from @handoff-dev/worker/testing): a test hook.
import { Agent, StoppingError } from '@handoff-dev/worker';
import { serveFixture } from '@handoff-dev/worker/testing';
import { MemoryQueue } from './memory-queue.mjs';

const concurrency = Number(process.env.EXAMPLE_CONCURRENCY ?? 4);
const queue = new MemoryQueue();
const log = (level) => (msg, fields) => console.error(JSON.stringify({ time: new Date().toISOString(), level, msg, ...fields }, replacer));

const agent = new Agent({
  // At the drain deadline (and after each claim that ends after it): make
  // every message this worker still has claimed visible again.
  returnClaims: () => queue.releaseAll(),
  // At stop-claiming: messages received and not started go back at once.
  handBack: (claims) => {
    for (const c of claims) queue.release(c.value);
  },
  logger: { info: log('info'), error: log('error') },
});

/** The work on one message: done when it resolves; an error leaves the message claimed (handed back by returnClaims, or after its visibility timeout). */
async function handle(msg, claim) {
  // The fixture's messages: until finish, or rejected at the cancel fallback.
  if (fixture?.handles(msg.body)) return fixture.work(msg.body, claim);
  const signal = claim.signal;
  await new Promise((resolve, reject) => {
    const t = setTimeout(resolve, 50); // the work
    signal.addEventListener('abort', () => (clearTimeout(t), reject(signal.reason)), { once: true });
  });
}

/** One claim loop: receive, hold, work, done, until claiming stops. */
async function claimLoop() {
  for (;;) {
    let r;
    try {
      r = agent.receive();
    } catch (err) {
      if (err instanceof StoppingError) return;
      throw err;
    }
    let msg;
    try {
      msg = await queue.receive(r.signal); // a long poll, cut off at stop-claiming without claiming
    } catch {
      r.end();
      continue;
    }
    const claim = r.hold(); // held from here: in flight until done, even after stop-claiming
    r.end();
    try {
      await handle(msg, claim); // claim.signal aborts at the cancel fallback (CanceledError)
      if (!queue.ack(msg)) log('info')('message handed back before it was finished', { id: msg.id });
    } catch (err) {
      log('info')('work ended unfinished; the message stays claimed until handed back', { id: msg.id, error: String(err) });
    } finally {
      claim.done();
    }
  }
}

const server = await agent.listen(); // $HANDOFF_APP_URL
// Under handoff conformance only: undefined otherwise.
const fixture = await serveFixture(agent, { publish: (body) => queue.publish(body), deliver: (body) => queue.deliver(body) });
const loops = Array.from({ length: concurrency }, () => claimLoop());
console.log(`listening ${server.url}`);

// SIGTERM: the sidecar's shutdown sequence has stopped claiming by now, and
// drained or handed back; stop claiming anyway, wait for the loops, exit.
process.once('SIGTERM', async () => {
  agent.stopClaiming();
  await Promise.race([Promise.allSettled(loops), new Promise((r) => setTimeout(r, 5_000))]);
  await server.close();
  await fixture?.close();
  process.exit(0);
});

function replacer(_key, v) {
  if (typeof v === 'bigint') return Number(v);
  if (v instanceof Error) return v.message;
  return v;
}
