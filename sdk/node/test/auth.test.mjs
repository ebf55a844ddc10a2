// Signed calls: the protocol's test vector, and what the Verifier refuses.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { authScheme, bodyDigest, checkToken, maxNonces, signHeaders, signature, Verifier } from '../dist/index.js';

// docs/protocol.md, "Signed calls" (Go's TestSignatureVector keeps it).
test('the signature test vector of docs/protocol.md', () => {
  const tok = '0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef';
  const body = '{"lease":"orders","leader":false,"sequence":1}';
  const sig = signature(tok, 'PUT', '/handoff/v1/leases/orders', '1767225600000', '0123456789abcdef0123456789abcdef', bodyDigest(body));
  assert.equal(sig, 'a0f1c8d2ed8f4e07198cb8d99f3dab235a5951df319652a0efa706b242fa2a7e');
  // And the Verifier accepts that very call at its time.
  const v = new Verifier(tok, { now: () => 1767225600000 });
  v.verify(callOf('PUT', '/handoff/v1/leases/orders', body, {
    authorization: `${authScheme} ${sig}`,
    'handoff-timestamp': '1767225600000',
    'handoff-nonce': '0123456789abcdef0123456789abcdef',
  }));
  assert.equal(bodyDigest(''), 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855');
});

const tok = 'x'.repeat(20) + 'y'.repeat(20);

function callOf(method, target, body, headers) {
  const h = Object.fromEntries(Object.entries(headers).map(([k, v]) => [k.toLowerCase(), v]));
  return { method, target, body: Buffer.from(body), header: (n) => h[n.toLowerCase()] };
}

function signed(method, target, body = '', at = Date.now(), key = tok) {
  return callOf(method, target, body, signHeaders(key, method, target, body, at));
}

function refusal(fn) {
  try {
    fn();
  } catch (e) {
    return e;
  }
  assert.fail('not refused');
}

test('a call signed with the token is accepted once; sent again it is refused as replayed', () => {
  const v = new Verifier(tok);
  const c = signed('GET', '/handoff/v1/drain?waitMillis=0');
  v.verify(c);
  const e = refusal(() => v.verify(c));
  assert.equal(e.kind, 'replayed');
  assert.equal(e.status, 401);
});

test('unsigned, malformed and altered calls are refused 401, and none is remembered', () => {
  const v = new Verifier(tok);
  const good = signHeaders(tok, 'POST', '/handoff/v1/stop-claiming', '{}');
  const cases = [
    ['no Authorization', {}, 'unsigned'],
    ['a bearer token', { Authorization: `Bearer ${tok}` }, 'unsigned'],
    ['another scheme', { ...good, Authorization: good.Authorization.replace(authScheme, 'Basic') }, 'unsigned'],
    ['the scheme alone', { ...good, Authorization: authScheme }, 'unsigned'],
    ['a short signature', { ...good, Authorization: `${authScheme} abc` }, 'unsigned'],
    ['no timestamp', { ...good, 'Handoff-Timestamp': undefined }, 'unsigned'],
    ['a timestamp not a number', { ...good, 'Handoff-Timestamp': '17e11' }, 'unsigned'],
    ['a timestamp of 16 digits', { ...good, 'Handoff-Timestamp': '1'.repeat(16) }, 'unsigned'],
    ['a short nonce', { ...good, 'Handoff-Nonce': 'abc' }, 'unsigned'],
    ['a nonce with a dot', { ...good, 'Handoff-Nonce': '0123456789abcdef.' }, 'unsigned'],
    ['a nonce of 65 characters', { ...good, 'Handoff-Nonce': 'a'.repeat(65) }, 'unsigned'],
    ['another nonce than signed', { ...good, 'Handoff-Nonce': 'a'.repeat(32) }, 'bad-signature'],
    ['another timestamp than signed', { ...good, 'Handoff-Timestamp': String(Number(good['Handoff-Timestamp']) - 1) }, 'bad-signature'],
    ['a signature with a non-hex character', { ...good, Authorization: `${authScheme} ${'z'.repeat(64)}` }, 'bad-signature'],
  ];
  for (const [what, headers, kind] of cases) {
    const clean = Object.fromEntries(Object.entries(headers).filter(([, v]) => v !== undefined));
    const e = refusal(() => v.verify(callOf('POST', '/handoff/v1/stop-claiming', '{}', clean)));
    assert.equal(e.kind, kind, what);
    assert.equal(e.status, 401, what);
  }
  // Another target, method or body than signed.
  assert.equal(refusal(() => v.verify(callOf('POST', '/handoff/v1/stop-claiming?x=1', '{}', good))).kind, 'bad-signature');
  assert.equal(refusal(() => v.verify(callOf('PUT', '/handoff/v1/stop-claiming', '{}', good))).kind, 'bad-signature');
  assert.equal(refusal(() => v.verify(callOf('POST', '/handoff/v1/stop-claiming', '{} ', good))).kind, 'bad-signature');
  // Another token.
  assert.equal(refusal(() => v.verify(signed('POST', '/x', '', Date.now(), 'z'.repeat(40)))).kind, 'bad-signature');
  assert.equal(v.remembered, 0);
  // The untouched call is still good: none of the refused ones took its nonce.
  v.verify(callOf('POST', '/handoff/v1/stop-claiming', '{}', good));
});

test('the scheme is read in any case, and the signature in upper case hex too', () => {
  const v = new Verifier(tok);
  const h = signHeaders(tok, 'GET', '/a');
  v.verify(callOf('GET', '/a', '', { ...h, Authorization: h.Authorization.replace(authScheme, 'handoff-hmac-sha256') }));
  const h2 = signHeaders(tok, 'GET', '/a');
  const [scheme, sig] = h2.Authorization.split(' ');
  v.verify(callOf('GET', '/a', '', { ...h2, Authorization: `${scheme} ${sig.toUpperCase()}` }));
});

test('a timestamp more than 30 s away, either way, is refused', () => {
  // A receiver that started a minute ago.
  let now = 1_800_000_000_000 - 60_000;
  const v = new Verifier(tok, { now: () => now });
  now = 1_800_000_000_000;
  v.verify(signed('GET', '/a', '', now - 30_000));
  v.verify(signed('GET', '/a', '', now + 30_000));
  assert.equal(refusal(() => v.verify(signed('GET', '/a', '', now - 30_001))).kind, 'clock-skew');
  assert.equal(refusal(() => v.verify(signed('GET', '/a', '', now + 30_001))).kind, 'clock-skew');
});

test('a call signed before the receiver started is refused 401 before-start, within the skew too', () => {
  const start = 1_800_000_000_500;
  let now = start;
  const v = new Verifier(tok, { now: () => now });
  assert.equal(v.startedMillis, start);
  now = start + 15_000; // a restart 15 s ago: a call captured before it, replayed
  for (const at of [start - 15_000, start - 1]) {
    const e = refusal(() => v.verify(signed('POST', '/handoff/v1/stop-claiming', '{}', at)));
    assert.equal(e.kind, 'before-start', String(at));
    assert.equal(e.status, 401);
    assert.match(e.message, /^signed before this receiver started/);
  }
  // Past the skew it is refused for that, as before.
  assert.equal(refusal(() => v.verify(signed('POST', '/a', '{}', start - 60_000))).kind, 'clock-skew');
  assert.equal(v.remembered, 0);
  // Signed at the start, or after, it is accepted.
  v.verify(signed('POST', '/a', '{}', start));
  v.verify(signed('POST', '/a', '{}', start + 1));
});

test(`at most ${maxNonces} nonces are remembered: then 503 with Retry-After until one expires`, () => {
  let now = 1_800_000_000_000;
  const v = new Verifier(tok, { now: () => now });
  for (let i = 0; i < maxNonces; i++) {
    const n = i.toString(16).padStart(32, '0');
    const ts = String(now);
    v.verify(callOf('GET', '/a', '', {
      authorization: `${authScheme} ${signature(tok, 'GET', '/a', ts, n, bodyDigest(''))}`,
      'handoff-timestamp': ts,
      'handoff-nonce': n,
    }));
  }
  assert.equal(v.remembered, maxNonces);
  const e = refusal(() => v.verify(signed('GET', '/a', '', now)));
  assert.equal(e.kind, 'busy');
  assert.equal(e.status, 503);
  // Only a good signature is remembered: a bad one is 401, not 503.
  assert.equal(refusal(() => v.verify(signed('GET', '/a', '', now, 'z'.repeat(40)))).kind, 'bad-signature');
  // Once their timestamps are 30 s old, the nonces are forgotten.
  now += 30_001;
  v.verify(signed('GET', '/a', '', now));
  assert.equal(v.remembered, 1);
});

test('a token is at least 32 printable ASCII characters, no space', () => {
  checkToken('a'.repeat(32));
  assert.throws(() => checkToken('a'.repeat(31)), /at least 32/);
  assert.throws(() => checkToken('a'.repeat(32) + ' b'), /printable/);
  assert.throws(() => checkToken('a'.repeat(32) + 'é'), /printable/);
});
