#!/usr/bin/env node
// The fixture command `handoff conformance` runs for examples/worker.mjs
// (docs/protocol.md, "Checking an app"), as both --fixture-cmd and
// --leader-cmd:
//
//   handoff conformance --app-url unix://$DIR/app.sock --token-file $DIR/token \
//     --fixture-cmd "node examples/fixture.mjs $DIR" --leader-cmd "node examples/fixture.mjs $DIR"
//
// DIR holds the worker's sockets, its pid file and its log; the token is
// $DIR/token. The worker serves on $HANDOFF_APP_URL when set (the
// conformance command passes its environment on), else unix://$DIR/app.sock. restart kills the worker process (if any) and starts a fresh
// one, returning once it answers; every other step (hold N,
// hold-cancelable N, hold-unstarted N, finish, lead LEASE, stopping LEASE, release LEASE) is
// sent to the running worker on $DIR/fixture.sock and its answer printed.
import { spawn } from 'node:child_process';
import { closeSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const [dir, ...words] = process.argv.slice(2);
if (!dir || words.length === 0) {
  console.error('usage: fixture.mjs DIR restart | hold N | hold-cancelable N | hold-unstarted N | finish | lead LEASE | stopping LEASE | release LEASE');
  process.exit(2);
}
const fixtureSocket = join(dir, 'fixture.sock');
const pidFile = join(dir, 'worker.pid');

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Sends one step to the worker and returns its answer line. */
function send(line, timeoutMs = 20_000) {
  return new Promise((resolve, reject) => {
    const c = connect({ path: fixtureSocket });
    let out = '';
    const t = setTimeout(() => (c.destroy(), reject(new Error(`no answer to ${line} within ${timeoutMs}ms`))), timeoutMs);
    c.setEncoding('utf8');
    c.on('connect', () => c.write(`${line}\n`));
    c.on('data', (d) => (out += d));
    c.on('end', () => (clearTimeout(t), resolve(out.trim())));
    c.on('error', (err) => (clearTimeout(t), reject(err)));
  });
}

async function restart() {
  let old;
  try {
    old = Number(readFileSync(pidFile, 'utf8'));
  } catch {
    // no worker yet
  }
  if (old && alive(old)) {
    process.kill(old, 'SIGKILL'); // a fresh process, as after a kill of the worker container
    for (let i = 0; i < 500 && alive(old); i++) await sleep(10);
    if (alive(old)) throw new Error(`worker ${old} still running 5s after SIGKILL`);
  }
  const logFd = openSync(join(dir, 'worker.log'), 'a');
  const here = dirname(fileURLToPath(import.meta.url));
  const child = spawn(process.execPath, [join(here, 'worker.mjs')], {
    detached: true,
    stdio: ['ignore', logFd, logFd],
    env: {
      ...process.env,
      HANDOFF_APP_URL: process.env.HANDOFF_APP_URL || `unix://${join(dir, 'app.sock')}`,
      HANDOFF_TOKEN_FILE: join(dir, 'token'),
      EXAMPLE_FIXTURE_SOCKET: fixtureSocket,
    },
  });
  closeSync(logFd);
  writeFileSync(pidFile, String(child.pid));
  child.unref();
  // Answers once the app serves: the fixture socket is made after the app's.
  for (let i = 0; i < 1000; i++) {
    if (!alive(child.pid)) throw new Error(`the worker exited at start; see ${join(dir, 'worker.log')}`);
    try {
      if ((await send('ping', 1000)) === 'ok') return;
    } catch {
      // not yet
    }
    await sleep(10);
  }
  throw new Error('the worker did not answer within 10s');
}

try {
  if (words[0] === 'restart') {
    await restart();
  } else {
    const answer = await send(words.join(' '));
    if (answer.startsWith('error:')) throw new Error(answer);
    if (answer !== 'ok') console.log(answer);
  }
} catch (err) {
  console.error(`fixture ${words.join(' ')}: ${err.message}`);
  process.exit(1);
}
