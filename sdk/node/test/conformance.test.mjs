// The real `handoff conformance` against examples/worker.mjs, with the
// SDK's own fixture (@handoff-dev/worker/testing: serveFixture in the worker,
// fixtureMain as the command, examples/fixture.mjs) for claims and leader
// work, so the suite proves the SDK's side of the fixture contract too. The
// binary is $HANDOFF_BIN (sdk/node/test.sh builds it when unset); without
// it the test is skipped.
//
// With $HANDOFF_SDK_NODE_APP set to a scratch npm project that installed
// the packed @handoff-dev/worker and holds copies of examples/worker.mjs,
// memory-queue.mjs and fixture.mjs (sdk/node/test.sh makes one), the worker
// and the fixture command are those copies: their imports resolve to the
// project's node_modules, not to this tree, and the test checks so first.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFileSync, realpathSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { createServer } from 'node:net';
import { dirname, join, sep } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { tempDir, token } from './helpers.mjs';

const bin = process.env.HANDOFF_BIN;
const skip = bin ? false : 'HANDOFF_BIN is not set: build the handoff binary (go build ./cmd/handoff) and point HANDOFF_BIN at it, or run sdk/node/test.sh';
const installed = process.env.HANDOFF_SDK_NODE_APP;
const examples = installed || join(dirname(fileURLToPath(import.meta.url)), '..', 'examples');
const fixture = join(examples, 'fixture.mjs');
const worker = join(examples, 'worker.mjs');

/**
 * The files @handoff-dev/worker and its /testing export resolve to from the
 * scratch project `app`; throws unless both are inside app/node_modules
 * (real paths: not a link back into the source tree).
 */
function installedFiles(app) {
  const require = createRequire(join(app, 'worker.mjs'));
  const root = `${realpathSync(join(app, 'node_modules', '@handoff-dev', 'worker'))}${sep}`;
  assert.ok(root.startsWith(`${realpathSync(app)}${sep}node_modules${sep}`), `@handoff-dev/worker in ${app} is a link to ${root}`);
  return ['@handoff-dev/worker', '@handoff-dev/worker/testing'].map((spec) => {
    const file = realpathSync(require.resolve(spec));
    assert.ok(file.startsWith(root), `${spec} resolves to ${file} from ${app}, not to the installed package ${root}`);
    return file;
  });
}
const quote = (s) => `'${s.replaceAll("'", `'\\''`)}'`;

function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/** Runs handoff conformance on the example worker at appURL; resolves to {code, out, counts}. */
function conformance(t, dir, appURL) {
  if (installed) t.diagnostic(`installed @handoff-dev/worker: ${installedFiles(installed).join(' ')}`);
  writeFileSync(join(dir, 'token'), `${token}\n`);
  const run = `${quote(process.execPath)} ${quote(worker)}`;
  const cmd = `${quote(process.execPath)} ${quote(fixture)} --dir ${quote(dir)} --worker ${quote(run)}`;
  const stopWorker = () => {
    try {
      process.kill(Number(readFileSync(join(dir, 'worker.pid'), 'utf8')), 'SIGKILL');
    } catch {
      // gone, or never started
    }
  };
  return new Promise((resolve) => {
    execFile(
      bin,
      ['conformance', '--app-url', appURL, '--token-file', join(dir, 'token'), '--fixture-cmd', cmd, '--leader-cmd', cmd, '--timeout', '3m'],
      { env: { ...process.env, HANDOFF_APP_URL: appURL, HANDOFF_TOKEN_FILE: join(dir, 'token') }, cwd: installed || undefined, timeout: 200_000 },
      (err, stdout, stderr) => {
        stopWorker();
        const out = `${stdout}${stderr}`;
        const m = /(\d+) passed, (\d+) failed, (\d+) skipped/.exec(out);
        resolve({ code: err ? (err.code ?? 1) : 0, out, counts: m ? { pass: +m[1], fail: +m[2], skip: +m[3] } : undefined });
      },
    );
  });
}

test('handoff conformance: every case passes on a Unix socket, none skipped', { skip, timeout: 240_000 }, async (t) => {
  const dir = tempDir(t);
  const { code, out, counts } = await conformance(t, dir, `unix://${join(dir, 'app.sock')}`);
  for (const line of out.trim().split('\n')) t.diagnostic(line);
  assert.ok(counts, `no summary in the output:\n${out}`);
  assert.equal(counts.fail, 0, out);
  assert.equal(counts.skip, 0, out);
  assert.ok(counts.pass >= 33, `${counts.pass} cases passed`);
  assert.equal(code, 0, out);
});

test('handoff conformance on loopback TCP: every case passes but the socket one, skipped on TCP', { skip, timeout: 240_000 }, async (t) => {
  const dir = tempDir(t);
  const { code, out, counts } = await conformance(t, dir, `http://127.0.0.1:${await freePort()}`);
  for (const line of out.trim().split('\n')) t.diagnostic(line);
  assert.ok(counts, `no summary in the output:\n${out}`);
  assert.equal(counts.fail, 0, out);
  const skipped = out.split('\n').filter((l) => l.startsWith('skip'));
  assert.deepEqual(skipped.map((l) => l.split(/\s+/)[1]), ['transport/socket'], out);
  assert.equal(code, 0, out);
});
