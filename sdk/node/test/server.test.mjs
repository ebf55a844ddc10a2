// The app API over HTTP: one write per answer, the body limit, refused
// calls read whole, routes, long polls beyond the server's read timeout,
// and the socket the server makes.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { lstatSync, mkdirSync, symlinkSync, writeFileSync, existsSync } from 'node:fs';
import { Agent as HttpAgent } from 'node:http';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { test } from 'node:test';
import { Agent, ConfigError, parseEndpoint } from '../dist/index.js';
import { serve } from './app.mjs';
import { call, grantBody, nextSeq, revokeBody, sleep, tempDir, token } from './helpers.mjs';

/** Counts the writes to each connection the server accepts (libuv write requests: one per syscall at most, as the Go test counts writes). */
function countWrites(server) {
  const conns = [];
  server.on('connection', (s) => {
    const rec = { writes: 0 };
    conns.push(rec);
    const h = s._handle;
    for (const m of ['writev', 'writeBuffer', 'writeUtf8String', 'writeLatin1String', 'writeAsciiString', 'writeUcs2String']) {
      const orig = h[m];
      if (typeof orig !== 'function') continue;
      h[m] = function (...args) {
        rec.writes++;
        return orig.apply(this, args);
      };
    }
  });
  return conns;
}

for (const transport of ['unix', 'tcp']) {
  test(`each answer is one write to the connection (${transport})`, async (t) => {
    const agent = new Agent({ token });
    let url;
    if (transport === 'unix') url = `unix://${join(tempDir(t), 'app.sock')}`;
    else url = 'http://127.0.0.1:0';
    const server = await agent.listen({ url });
    t.after(() => server.close());
    const conns = countWrites(server.server);
    const keep = new HttpAgent({ keepAlive: true, maxSockets: 1 });
    t.after(() => keep.destroy());
    const lease = 'one-write-é'; // a non-ASCII error body, too
    const calls = [
      ['GET', '/handoff/v1/drain?waitMillis=0', '', 200],
      ['PUT', `/handoff/v1/leases/${encodeURIComponent(lease)}`, grantBody(lease, nextSeq()), 200],
      ['PUT', `/handoff/v1/leases/${encodeURIComponent(lease)}`, revokeBody(lease, nextSeq()), 200],
      ['PUT', `/handoff/v1/leases/x`, grantBody('é', nextSeq()), 400],
      ['GET', '/handoff/v1/drain?waitMillis=soon', '', 400],
      ['GET', '/handoff/v1/no-such-call', '', 404],
      ['GET', '/handoff/v1/stop-claiming', '', 405],
      ['POST', '/handoff/v1/return', '{"cancel": false}', 200],
      ['POST', '/handoff/v1/stop-claiming', '{}', 200],
    ];
    for (const [method, target, body, want] of calls) {
      const r = await call(server.url, method, target, body, { agent: keep });
      assert.equal(r.status, want, `${method} ${target}: ${r.body}`);
      assert.equal(r.headers['content-length'], String(Buffer.byteLength(r.body)));
    }
    const r = await call(server.url, 'GET', '/handoff/v1/drain', '', { agent: keep, sign: false });
    assert.equal(r.status, 401);
    assert.equal(conns.length, 1, 'one kept-alive connection');
    assert.equal(conns[0].writes, calls.length + 1, 'one write per answer');
  });
}

test('the body of a refused call is read whole: the next call on the connection is answered', async (t) => {
  const app = await serve(t);
  const keep = new HttpAgent({ keepAlive: true, maxSockets: 1 });
  t.after(() => keep.destroy());
  const conns = countWrites(app.server.server);
  const big = '{"cancel": false, "pad": "' + 'x'.repeat(60_000) + '"}';
  for (const [method, target] of [['POST', '/handoff/v1/return'], ['POST', '/handoff/v1/nothing'], ['GET', '/handoff/v1/return']]) {
    const r = await call(app.url, method, target, big, { agent: keep, sign: false });
    assert.equal(r.status, 401);
    assert.equal(r.headers['www-authenticate'], 'HANDOFF-HMAC-SHA256 realm="handoff"');
    assert.ok(r.json.error);
  }
  for (const [method, target, want] of [['POST', '/handoff/v1/nothing', 404], ['GET', '/handoff/v1/return', 405]]) {
    const r = await call(app.url, method, target, big, { agent: keep });
    assert.equal(r.status, want);
  }
  const r = await call(app.url, 'GET', '/handoff/v1/drain', '', { agent: keep });
  assert.equal(r.status, 200);
  assert.equal(conns.length, 1);
  assert.equal(app.agent.isStopping, false);
});

test('a body over 64 KiB is answered 413, signed or not, and not acted on; 64 KiB is read', async (t) => {
  const app = await serve(t);
  const over = '{"cancel": false, "pad": "' + 'x'.repeat(65_536) + '"}';
  for (const sign of [true, false]) {
    const r = await call(app.url, 'POST', '/handoff/v1/return', over, { sign });
    assert.equal(r.status, 413);
    assert.match(r.json.error, /larger than 65536 bytes/);
  }
  const lease = 'big';
  const r = await call(app.url, 'PUT', `/handoff/v1/leases/${lease}`, grantBody(lease, nextSeq()).slice(0, -1) + ', "pad": "' + 'x'.repeat(1 << 20) + '"}');
  assert.equal(r.status, 413);
  assert.equal(app.agent.leader(lease), undefined);
  const head = '{"cancel": false, "pad": "';
  const exact = head + 'x'.repeat(65_536 - head.length - 2) + '"}';
  assert.equal(Buffer.byteLength(exact), 65_536);
  const ok = await call(app.url, 'POST', '/handoff/v1/return', exact);
  assert.equal(ok.status, 200);
  assert.deepEqual(ok.json, { returned: 0 });
});

test('the return call refuses bad bodies and a negative cancelWaitMillis', async (t) => {
  const app = await serve(t);
  for (const b of ['', '{', '[]', 'null', '"cancel"', '{"cancel": "yes"}', '{"cancelWaitMillis": "5"}', '{"cancel": false, "cancelWaitMillis": -1}', '{"cancel": false} {"cancel": true}', '{"cancel": false}garbage']) {
    const r = await call(app.url, 'POST', '/handoff/v1/return', b);
    assert.equal(r.status, 400, b);
    assert.ok(r.json.error, b);
  }
  assert.equal(app.agent.isStopping, false, 'none acted on');
});

test('undefined paths and methods are 4xx and act on nothing; HEAD of the drain is a GET', async (t) => {
  const app = await serve(t);
  const calls = [
    ['GET', '/handoff/v1/stop-claiming', 405, 'POST'],
    ['PUT', '/handoff/v1/stop-claiming', 405, 'POST'],
    ['POST', '/handoff/v1/drain?waitMillis=0', 405, 'GET, HEAD'],
    ['GET', '/handoff/v1/return', 405, 'POST'],
    ['GET', '/handoff/v1/leases/x', 405, 'PUT'],
    ['DELETE', '/handoff/v1/leases/x', 405, 'PUT'],
    ['PUT', '/handoff/v1/leases/', 404],
    ['PUT', '/handoff/v1/leases/x/y', 404],
    ['GET', '/handoff/v1/', 404],
    ['GET', '/', 404],
    ['GET', '/handoff/v1/drain%', 404],
  ];
  for (const [method, target, want, allow] of calls) {
    const r = await call(app.url, method, target, '');
    assert.equal(r.status, want, `${method} ${target}`);
    if (allow) assert.equal(r.headers.allow, allow, `${method} ${target}`);
  }
  const h = await call(app.url, 'HEAD', '/handoff/v1/drain', '');
  assert.equal(h.status, 200);
  assert.equal(app.agent.isStopping, false);
});

test('a long poll and a revoke wait beyond the server read timeout (5 s); an idle kept-alive connection outlives it', { timeout: 30_000 }, async (t) => {
  const app = await serve(t);
  const keep = new HttpAgent({ keepAlive: true, maxSockets: 1 });
  t.after(() => keep.destroy());
  const c = app.agent.begin();
  await app.grant('l', nextSeq());
  const w = app.agent.beginLeading('l');
  const first = await call(app.url, 'GET', '/handoff/v1/drain', '', { agent: keep });
  assert.equal(first.status, 200);
  const start = Date.now();
  const poll = app.drain(6500);
  const revoke = app.revoke('l', nextSeq());
  setTimeout(() => w.done(), 6000);
  await sleep(6000); // the kept-alive connection idles meanwhile
  const st = await poll;
  assert.ok(Date.now() - start >= 6400, 'the long poll waited its waitMillis');
  assert.deepEqual([st.inFlight, st.drained], [1, false]);
  assert.deepEqual(await revoke, { leader: false });
  const again = await call(app.url, 'GET', '/handoff/v1/drain', '', { agent: keep });
  assert.equal(again.status, 200);
  c.done();
});

test('the server makes its socket at the path itself with mode 0666 and removes it when it closes', async (t) => {
  const dir = tempDir(t);
  const path = join(dir, 'app.sock');
  const agent = new Agent({ token });
  const old = process.umask(0o077);
  let server;
  try {
    server = await agent.listen({ url: `unix://${path}` });
  } finally {
    process.umask(old);
  }
  const st = lstatSync(path);
  assert.ok(st.isSocket());
  assert.equal(st.mode & 0o777, 0o666);
  // Another process serves it: refused.
  await assert.rejects(new Agent({ token }).listen({ url: `unix://${path}` }), /another process serves it/);
  await server.close();
  assert.equal(existsSync(path), false, 'removed at close');
});

test('a path that exists and is not a socket is refused, never replaced; a stale socket is replaced', async (t) => {
  const dir = tempDir(t);
  const file = join(dir, 'file');
  writeFileSync(file, 'x');
  const sub = join(dir, 'dir');
  mkdirSync(sub);
  // A socket served by this process, linked to: a link is refused even to a socket.
  const real = join(dir, 'real.sock');
  const other = createServer();
  await new Promise((r) => other.listen(real, r));
  t.after(() => other.close());
  const link = join(dir, 'link.sock');
  symlinkSync(real, link);
  for (const [p, what] of [[file, 'a file'], [sub, 'a directory'], [link, 'a symbolic link']]) {
    await assert.rejects(new Agent({ token }).listen({ url: `unix://${p}` }), (e) => e instanceof ConfigError && e.message.includes(`not a socket (${what})`), what);
  }
  assert.ok(lstatSync(link).isSymbolicLink());
  // A stale socket: its process was killed.
  const stale = join(dir, 'stale.sock');
  const r = spawnSync(process.execPath, ['-e', `require('net').createServer().listen(${JSON.stringify(stale)}, () => process.kill(process.pid, 'SIGKILL'))`]);
  assert.equal(r.signal, 'SIGKILL');
  assert.ok(lstatSync(stale).isSocket());
  const server = await new Agent({ token }).listen({ url: `unix://${stale}` });
  const ok = await call(server.url, 'GET', '/handoff/v1/drain', '');
  assert.equal(ok.status, 200);
  await server.close();
});

test('addresses: unix:// and an absolute clean path of at most 107 bytes, or a loopback IP and port', async () => {
  assert.deepEqual(parseEndpoint('unix:///handoff-run/app.sock'), { network: 'unix', path: '/handoff-run/app.sock' });
  assert.deepEqual(parseEndpoint('http://127.0.0.1:7452'), { network: 'tcp', host: '127.0.0.1', port: 7452 });
  assert.deepEqual(parseEndpoint('127.0.0.1:7450'), { network: 'tcp', host: '127.0.0.1', port: 7450 });
  assert.deepEqual(parseEndpoint('http://[::1]:0'), { network: 'tcp', host: '::1', port: 0 });
  assert.deepEqual(parseEndpoint('http://127.0.0.1:7452/'), { network: 'tcp', host: '127.0.0.1', port: 7452 });
  for (const bad of ['unix://relative.sock', 'unix:///a/../b.sock', 'unix:///a//b.sock', 'unix:///a/', `unix:///${'x'.repeat(107)}`, 'http://localhost:7452', 'localhost:7452', 'http://10.0.0.1:7452', 'http://0.0.0.0:7452', 'http://127.0.0.1', 'http://127.0.0.1:70000', 'http://127.0.0.1:7452/path', 'http://u@127.0.0.1:7452', 'https://127.0.0.1:7452', '']) {
    assert.throws(() => parseEndpoint(bad), ConfigError, bad);
  }
  await assert.rejects(new Agent({ token }).listen({ env: {} }), /HANDOFF_APP_URL is not set/);
  await assert.rejects(new Agent({ token }).listen({ url: 'http://localhost:1' }), /localhost names both/);
});

test('on TCP, port 0 serves on a free port, and the url says which', async (t) => {
  const server = await new Agent({ token }).listen({ url: 'http://127.0.0.1:0' });
  t.after(() => server.close());
  assert.match(server.url, /^http:\/\/127\.0\.0\.1:[1-9][0-9]*$/);
  assert.equal((await call(server.url, 'GET', '/handoff/v1/drain', '')).status, 200);
});

test('insecureNoToken without a token serves unsigned calls', async (t) => {
  const dir = tempDir(t);
  const server = await new Agent({ insecureNoToken: true, env: {} }).listen({ url: `unix://${join(dir, 'a.sock')}` });
  t.after(() => server.close());
  assert.equal((await call(server.url, 'GET', '/handoff/v1/drain', '', { sign: false })).status, 200);
});
