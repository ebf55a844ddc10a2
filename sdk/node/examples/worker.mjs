#!/usr/bin/env node
// An example worker on @handoff-dev/worker: a few claim loops on an in-memory
// queue (memory-queue.mjs), served on $HANDOFF_APP_URL with the pod's token
// from $HANDOFF_TOKEN_FILE, as it would run beside the handoff sidecar.
//
//   HANDOFF_APP_URL=unix:///tmp/app.sock HANDOFF_TOKEN_FILE=token node examples/worker.mjs
//
// With $EXAMPLE_FIXTURE_SOCKET set it also serves the hooks `handoff
// conformance` drives through examples/fixture.mjs (--fixture-cmd and
// --leader-cmd): hold N, hold-cancelable N, hold-unstarted N, finish, lead,
// stopping, release.
import { createServer } from 'node:net';
import { unlinkSync } from 'node:fs';
import { Agent, NotLeaderError, StoppingError } from '@handoff-dev/worker';
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
async function handle(msg, signal) {
  const hook = fixtureWork(msg, signal);
  if (hook) return hook;
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
      await handle(msg, claim.signal); // aborted by the cancel fallback (CanceledError)
      if (!queue.ack(msg)) log('info')('message handed back before it was finished', { id: msg.id });
    } catch (err) {
      log('info')('work ended unfinished; the message stays claimed until handed back', { id: msg.id, error: String(err) });
    } finally {
      claim.done();
    }
  }
}

const server = await agent.listen(); // $HANDOFF_APP_URL
const loops = Array.from({ length: concurrency }, () => claimLoop());
if (process.env.EXAMPLE_FIXTURE_SOCKET) await serveFixture(process.env.EXAMPLE_FIXTURE_SOCKET);
console.log(`listening ${server.url}`);

// SIGTERM: the sidecar's shutdown sequence has stopped claiming by now, and
// drained or handed back; stop claiming anyway, wait for the loops, exit.
process.once('SIGTERM', async () => {
  agent.stopClaiming();
  await Promise.race([Promise.allSettled(loops), new Promise((r) => setTimeout(r, 5_000))]);
  await server.close();
  process.exit(0);
});

function replacer(_key, v) {
  if (typeof v === 'bigint') return Number(v);
  if (v instanceof Error) return v.message;
  return v;
}

// --- Hooks for `handoff conformance` (examples/fixture.mjs) ---------------

/** Work the fixture holds: released by finish, or (cancelable) ended by the cancel fallback. */
const held = new Map(); // msg id -> {kind, release, ended}
let releaseHeld;
let releasedHeld = new Promise((r) => (releaseHeld = r));

function fixtureWork(msg, signal) {
  if (msg.body !== 'hold' && msg.body !== 'hold-cancelable') return undefined;
  const entry = { kind: msg.body, ended: false };
  held.set(msg.id, entry);
  const released = releasedHeld;
  const work =
    msg.body === 'hold'
      ? released // ignores the cancel fallback: stands for work that does not stop in time
      : new Promise((resolve, reject) => {
          released.then(resolve);
          signal.addEventListener('abort', () => reject(signal.reason), { once: true });
        });
  return work.finally(() => {
    entry.ended = true;
    held.delete(msg.id);
  });
}

const leaderWork = new Map(); // lease -> LeaderWork[]
const unstarted = []; // claims of hold-unstarted, for finish to drop

async function fixtureStep(words) {
  const [step, arg] = words;
  switch (step) {
    case 'ping':
      return 'ok';
    case 'hold':
    case 'hold-cancelable': {
      const n = Number(arg);
      const before = held.size;
      queue.publish(...Array.from({ length: n }, () => step));
      // Returns once the Agent counts them started (in flight, not unstarted).
      const deadline = Date.now() + 10_000;
      while (held.size < before + n || agent.inFlight < before + n) {
        if (Date.now() > deadline) throw new Error(`only ${held.size} of ${n} claims held after 10s`);
        await new Promise((r) => setTimeout(r, 5));
      }
      return 'ok';
    }
    case 'hold-unstarted': {
      // Delivered to this worker, not started: the rest of a batch, a
      // prefetch. handBack takes them at stop-claiming.
      const r = agent.receive();
      for (let i = 0; i < Number(arg); i++) unstarted.push(r.holdUnstarted(queue.deliver('hold-unstarted')));
      r.end();
      return 'ok';
    }
    case 'finish': {
      for (const c of unstarted.splice(0)) c.done(); // those stop-claiming did not hand back: dropped
      releaseHeld();
      releasedHeld = new Promise((r) => (releaseHeld = r));
      const deadline = Date.now() + 5_000;
      while (held.size > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 5));
      return 'ok';
    }
    case 'lead':
      try {
        const w = agent.beginLeading(arg);
        leaderWork.set(arg, [...(leaderWork.get(arg) ?? []), w]);
        return 'yes';
      } catch (err) {
        if (err instanceof NotLeaderError) return 'no';
        throw err;
      }
    case 'stopping': {
      const ws = leaderWork.get(arg) ?? [];
      return ws.length > 0 && ws.every((w) => w.signal.aborted) ? 'yes' : 'no';
    }
    case 'release':
      for (const w of leaderWork.get(arg) ?? []) w.done();
      leaderWork.delete(arg);
      return 'ok';
    default:
      throw new Error(`unknown step ${JSON.stringify(words.join(' '))}`);
  }
}

/** Serves fixture steps on a Unix socket: one line in ("hold 3"), one line out ("ok", "yes", "no", or "error: ..."). */
function serveFixture(path) {
  try {
    unlinkSync(path);
  } catch {
    // none yet
  }
  const srv = createServer((conn) => {
    let buf = '';
    conn.setEncoding('utf8');
    conn.on('data', async (d) => {
      buf += d;
      const nl = buf.indexOf('\n');
      if (nl < 0) return;
      const words = buf.slice(0, nl).trim().split(/\s+/);
      try {
        conn.end(`${await fixtureStep(words)}\n`);
      } catch (err) {
        conn.end(`error: ${err.message}\n`);
      }
    });
    conn.on('error', () => {});
  });
  srv.unref();
  return new Promise((resolve) => srv.listen(path, resolve));
}
