// Request bodies: one JSON object of the schema's shape, integers exact.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { BodyError, decode, encode, parseRFC3339 } from '../dist/json.js';
import { parseWaitMillis } from '../dist/index.js';

test('a Leadership decodes with its int64 fields exact, beyond 2^53', () => {
  const l = decode('Leadership', '{"lease":"a","leader":true,"sequence":1764547200000000001,"fencingToken":9007199254740993,"until":"2025-01-02T15:04:15.123456789Z","validForMillis":9987,"extra":[1,{"x":null}]}');
  assert.equal(l.lease, 'a');
  assert.equal(l.leader, true);
  assert.equal(l.sequence, 1764547200000000001n);
  assert.equal(l.fencingToken, 9007199254740993n);
  assert.equal(l.until, 1735830255123456789n);
  assert.equal(l.validForMillis, 9987n);
  assert.equal(l.holderIdentity, '');
});

test('absent and null fields read as their zero value; unknown fields are ignored', () => {
  const l = decode('Leadership', '{"leader":null,"until":null,"newField":{"a":[true,false,1.5e3,"s\\u00e9"]}}');
  assert.deepEqual({ ...l }, { lease: '', leader: false, sequence: 0n, holderIdentity: '', fencingToken: 0n, until: undefined, validForMillis: 0n });
  const r = decode('ReturnRequest', '{}');
  assert.deepEqual({ ...r }, { cancel: false, cancelWaitMillis: 0n });
});

test("Go's zero time is an absent until", () => {
  assert.equal(decode('Leadership', '{"until":"0001-01-01T00:00:00Z"}').until, undefined);
  assert.notEqual(decode('Leadership', '{"until":"0001-01-01T00:00:00+01:00"}').until, undefined);
});

test('bodies that are not one JSON object of the shape are refused with the protocol errors', () => {
  const refused = [
    ['', /^body: empty; want one JSON object$/],
    ['  \n', /^body: empty/],
    ['{', /^body: unexpected end of JSON input/],
    ['[]', /is not a JSON object/],
    ['null', /is not a JSON object/],
    ['"cancel"', /is not a JSON object/],
    ['12', /is not a JSON object/],
    ['{"cancel": false} {"cancel": true}', /^body: data after the JSON value; want one JSON object and nothing after it but white space$/],
    ['{"cancel": false}garbage', /data after the JSON value/],
    ['{"cancel": "yes"}', /cannot unmarshal string into field ReturnRequest.cancel/],
    ['{"cancelWaitMillis": "5"}', /cannot unmarshal string/],
    ['{"cancelWaitMillis": 1.5}', /cannot unmarshal number 1.5/],
    ['{"cancelWaitMillis": 1e3}', /cannot unmarshal number 1e3/],
    ['{"cancelWaitMillis": 9223372036854775808}', /cannot unmarshal/],
    ['{"cancel": tru}', /invalid character/],
    ['{"cancel": false,}', /invalid character/],
    ["{'cancel': false}", /invalid character/],
    ['{"cancel": 01}', /invalid character/],
    ['{"a": "\u0001"}', /in string literal/],
    ['{"a": "\\x"}', /in string escape code/],
    ['{"a": 1.}', /invalid character/],
    ['{"a": -}', /invalid character/],
    ['[' .repeat(5000), /exceeded max depth/],
  ];
  for (const [body, want] of refused) {
    assert.throws(() => decode('ReturnRequest', body), (e) => e instanceof BodyError && want.test(e.message), JSON.stringify(body.slice(0, 40)));
  }
  const bad = [
    '{"leader": "yes"}',
    '{"sequence": "12"}',
    '{"leader": true, "until": "tomorrow"}',
    '{"until": "2025-01-02T15:04:05"}',
    '{"until": "2025-02-30T15:04:05Z"}',
    '{"until": "2025-01-02t15:04:05z"}',
    '{"until": "2025-01-02T24:00:00Z"}',
    '{"until": "2025-01-02T15:04:05+24:00"}',
    '{"until": 5}',
    '{"lease": 5}',
  ];
  for (const body of bad) assert.throws(() => decode('Leadership', body), BodyError, body);
  assert.equal(decode('ReturnRequest', ' \t\r\n{"cancel":true,"cancelWaitMillis":-1} \n').cancelWaitMillis, -1n);
  assert.equal(decode('ReturnRequest', '{"cancelWaitMillis": -0}').cancelWaitMillis, 0n);
  assert.equal(decode('ReturnRequest', '{"cancel": false, "cancel": true}').cancel, true); // the last wins, as in Go
});

test('RFC 3339 times with offsets and fractions, as Go writes them', () => {
  assert.equal(parseRFC3339('1970-01-01T00:00:00Z'), 0n);
  assert.equal(parseRFC3339('1970-01-01T01:00:00+01:00'), 0n);
  assert.equal(parseRFC3339('1969-12-31T23:59:59.999999999Z'), -1n);
  assert.equal(parseRFC3339('2024-02-29T00:00:00.5-00:30'), BigInt(Date.UTC(2024, 1, 29, 0, 30)) * 1_000_000n + 500_000_000n);
  assert.equal(parseRFC3339('2023-02-29T00:00:00Z'), undefined);
  assert.equal(parseRFC3339('2023-01-01T00:00:60Z'), undefined);
});

test('answers encode bigints as JSON integers and leave undefined fields out', () => {
  assert.equal(encode({ a: 1n << 62n, b: undefined, c: 'x"', d: [true, null], e: 1.5 }), '{"a":4611686018427387904,"c":"x\\"","d":[true,null],"e":1.5}');
});

test("waitMillis is read as the Go worker reads it", () => {
  const ok = [
    ['/handoff/v1/drain', 0],
    ['/handoff/v1/drain?waitMillis=', 0],
    ['/handoff/v1/drain?waitMillis=0', 0],
    ['/handoff/v1/drain?waitMillis=-0', 0],
    ['/handoff/v1/drain?waitMillis=%20250%20', 250],
    ['/handoff/v1/drain?waitMillis=+250', 250],
    ['/handoff/v1/drain?waitMillis=%2B250', 250],
    ['/handoff/v1/drain?waitMillis=29999', 29999],
    ['/handoff/v1/drain?waitMillis=30001', 30000],
    ['/handoff/v1/drain?waitMillis=9223372036854775807', 30000],
    ['/handoff/v1/drain?waitMillis=99999999999999999999', 30000],
    ['/handoff/v1/drain?other=1&waitMillis=5', 5],
    ['/handoff/v1/drain?waitMillis;x=1', 0], // Go's url.ParseQuery drops a pair with a semicolon
  ];
  for (const [target, want] of ok) assert.equal(parseWaitMillis(target), want, target);
  for (const target of ['?waitMillis=-1', '?waitMillis=1.5', '?waitMillis=1e3', '?waitMillis=soon', '?waitMillis=0x10', '?waitMillis=1&waitMillis=2', '?waitMillis=-99999999999999999999']) {
    assert.equal(typeof parseWaitMillis(`/handoff/v1/drain${target}`), 'string', target);
  }
  assert.match(parseWaitMillis('/d?waitMillis=1&waitMillis=2'), /given 2 times/);
});
