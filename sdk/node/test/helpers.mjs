// Helpers of the tests: a token, a temporary directory, signed calls.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { signHeaders } from '../dist/index.js';

export const token = randomBytes(32).toString('hex');

/** A temporary directory, removed at the end of the test. */
export function tempDir(t) {
  // Short: a socket path holds at most 107 bytes.
  const dir = mkdtempSync(join(tmpdir(), 'hw-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

export function tokenFileIn(dir) {
  const f = join(dir, 'token');
  writeFileSync(f, `${token}\n`);
  return f;
}

/**
 * call sends one call to the server at url (unix:///path or http://host:port)
 * and resolves to {status, headers, body, json}. sign: true (default) signs
 * with token; a function (method, target, body) → headers signs otherwise.
 */
export function call(url, method, target, body = '', { sign = true, agent, headers = {}, signal } = {}) {
  const opts = { method, path: target, agent, headers: { ...headers }, signal };
  if (url.startsWith('unix://')) opts.socketPath = url.slice('unix://'.length);
  else {
    const u = new URL(url);
    opts.host = u.hostname.replace(/^\[|\]$/g, '');
    opts.port = u.port;
  }
  if (sign === true) Object.assign(opts.headers, signHeaders(token, method, target, body));
  else if (typeof sign === 'function') Object.assign(opts.headers, sign(method, target, body));
  if (body !== '') opts.headers['Content-Type'] = 'application/json';
  opts.headers['Content-Length'] = String(Buffer.byteLength(body));
  return new Promise((resolve, reject) => {
    const req = request(opts, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let json;
        try {
          json = JSON.parse(text);
        } catch {
          // not JSON
        }
        resolve({ status: res.statusCode, headers: res.headers, body: text, json });
      });
    });
    req.on('error', reject);
    req.end(body);
  });
}

/** A grant body as the sidecar sends it. */
export function grantBody(lease, sequence, { validForMillis = 10_000, until, fencingToken = 1 } = {}) {
  const u = until ?? new Date(Date.now() + validForMillis).toISOString();
  return `{"lease":${JSON.stringify(lease)},"leader":true,"sequence":${sequence},"holderIdentity":"test_0000","fencingToken":${fencingToken},"until":"${u}","validForMillis":${validForMillis}}`;
}

export function revokeBody(lease, sequence) {
  return `{"lease":${JSON.stringify(lease)},"leader":false,"sequence":${sequence},"fencingToken":0}`;
}

/** The current time in Unix nanoseconds, as the sidecar's sequence. */
let lastSeq = 0n;
export function nextSeq() {
  const now = BigInt(Date.now()) * 1_000_000n;
  lastSeq = now > lastSeq + 1000n ? now : lastSeq + 1000n;
  return lastSeq;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Waits until cond() is true, polling, at most ms. */
export async function eventually(cond, ms = 2000, what = 'condition') {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`${what}: not true within ${ms}ms`);
    await sleep(2);
  }
}

/** Lets pending promise callbacks and immediates run. */
export const settle = () => new Promise((r) => setImmediate(r));
