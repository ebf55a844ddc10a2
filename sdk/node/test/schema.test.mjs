// docs/protocol.yaml is the one source: src/protocol.gen.ts must be what the
// generator makes of it, and what the server answers must be of its schemas.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { parse } from 'yaml';
import { generate, outPath, schemaPath } from '../scripts/gen-types.mjs';
import { protocol } from '../dist/index.js';
import { serve } from './app.mjs';
import { call, grantBody, nextSeq } from './helpers.mjs';

test('src/protocol.gen.ts is generated from docs/protocol.yaml as it is (npm run gen)', () => {
  const want = generate(readFileSync(schemaPath, 'utf8'));
  const got = readFileSync(outPath, 'utf8');
  assert.ok(got === want, 'src/protocol.gen.ts is stale: run npm run gen in sdk/node and rebuild');
});

test('the server serves every operation of the app API in the schema, and no other', () => {
  const doc = parse(readFileSync(schemaPath, 'utf8'));
  const app = [];
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(item)) {
      if (op?.operationId && path.startsWith('/handoff/v1/')) app.push(`${method.toUpperCase()} ${path} ${op.operationId}`);
    }
  }
  assert.deepEqual(app.sort(), [
    'GET /handoff/v1/drain drain',
    'POST /handoff/v1/return returnClaims',
    'POST /handoff/v1/stop-claiming stopClaiming',
    'PUT /handoff/v1/leases/{lease} setLeadership',
  ]);
});

/** conforms checks a decoded answer against the field specs of schema. */
function conforms(schema, v, what) {
  const specs = protocol.schemaFields[schema];
  assert.ok(specs, schema);
  for (const [field, spec] of Object.entries(specs)) {
    if (spec.required) assert.ok(field in v, `${what}: required field ${schema}.${field} missing in ${JSON.stringify(v)}`);
  }
  for (const [field, x] of Object.entries(v)) {
    const spec = specs[field];
    assert.ok(spec, `${what}: field ${field} is not in schema ${schema}`);
    switch (spec.kind) {
      case 'boolean':
        assert.equal(typeof x, 'boolean', `${what}: ${field}`);
        break;
      case 'string':
        assert.equal(typeof x, 'string', `${what}: ${field}`);
        if (spec.enum) assert.ok(spec.enum.includes(x), `${what}: ${field}`);
        break;
      case 'int':
      case 'int64':
        assert.ok(Number.isInteger(x), `${what}: ${field}`);
        if (spec.minimum !== undefined) assert.ok(x >= spec.minimum, `${what}: ${field} ≥ ${spec.minimum}`);
        break;
      default:
        assert.fail(`${what}: ${field} of kind ${spec.kind}`);
    }
    // Optional fields are left out when zero (docs/protocol.md, "Required and optional fields").
    if (!spec.required && field !== 'receiving') assert.ok(x !== 0 && x !== '' && x !== false, `${what}: optional ${field} sent with its zero value`);
  }
}

test('what the server answers is of the schema: required fields sent, optional ones left out when zero', async (t) => {
  const app = await serve(t, { returnClaims: () => 0 });
  const r = app.agent.receive();
  const unstarted = r.holdUnstarted('u');
  const started = r.hold();
  conforms('DrainStatus', await app.drain(), 'drain status');
  conforms('DrainStatus', await app.stopClaiming(), 'stop-claiming');
  r.end();
  unstarted.done();
  started.done();
  conforms('DrainStatus', await app.drain(), 'drain status, drained');
  conforms('ReturnResult', await app.return(), 'return');
  conforms('LeadershipAck', await app.grant('a', nextSeq()), 'grant');
  conforms('LeadershipAck', await app.revoke('a', nextSeq()), 'revoke');
  conforms('LeadershipAck', await app.grant('a', 1n), 'stale');
  for (const [method, target, body, sign] of [
    ['GET', '/handoff/v1/drain?waitMillis=x', '', true],
    ['PUT', '/handoff/v1/leases/a', grantBody('b', nextSeq()), true],
    ['GET', '/handoff/v1/drain', '', false],
  ]) {
    const a = await call(app.url, method, target, body, { sign });
    conforms('Error', a.json, `${a.status} ${target}`);
  }
  const failing = await serve(t, { returnClaims: () => Promise.reject(new Error('down')) });
  conforms('ReturnResult', await failing.return(), 'a failed return');
});
