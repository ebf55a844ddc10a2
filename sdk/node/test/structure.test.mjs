// The shape of the sources and of the published types: no import circle
// among the modules of src/ and bullmq/src/ (type-only imports count), and
// no Agent internals in the emitted .d.ts (members named _…) or at run
// time. Run after the build (npm test, test.sh), as it reads dist/.
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { Agent } from '../dist/index.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const sourceDirs = [join(root, 'src'), join(root, 'bullmq', 'src')];

/** A static import or re-export (`import x from`, `import type {…} from`, `export * from`, …), a side-effect import, or a dynamic import(), at the start of a line. */
const importRe =
  /^(?:import|export)\s+(?:type\s+)?(?:[\w$]+\s*,\s*)?(?:\*(?:\s+as\s+[\w$]+)?|\{[^}]*\}|[\w$]+)\s+from\s+['"]([^'"]+)['"]|^import\s+['"]([^'"]+)['"]|\bimport\(\s*['"]([^'"]+)['"]\s*\)/gm;

/** The relative imports of a TypeScript source, as the .ts files they name. */
function importsOf(file) {
  const text = readFileSync(file, 'utf8');
  const out = [];
  for (const m of text.matchAll(importRe)) {
    const spec = m[1] ?? m[2] ?? m[3];
    if (!spec.startsWith('.')) continue; // a package (node:…, @handoff-dev/worker)
    out.push(resolve(dirname(file), spec).replace(/\.js$/, '.ts'));
  }
  // Every line that names a relative module after `from` must have been read.
  const named = text.split('\n').filter((l) => /^(?:import|export|\})[^'"]*\bfrom\s+['"]\./.test(l)).length;
  const read = [...text.matchAll(importRe)].filter((m) => m[1]?.startsWith('.')).length;
  assert.equal(read, named, `${relative(root, file)}: ${named} relative imports on its lines, ${read} parsed`);
  return out;
}

/** The import graph of the .ts files under dirs: file → the files it imports. */
function graph(dirs) {
  const g = new Map();
  for (const d of dirs) {
    for (const f of readdirSync(d)) {
      if (f.endsWith('.ts') && !f.endsWith('.d.ts')) g.set(join(d, f), importsOf(join(d, f)));
    }
  }
  return g;
}

/** The first circle found in g, as the files along it (the first repeated at the end), or undefined. */
export function findCycle(g) {
  const state = new Map(); // file → 'open' while on the path, 'done' after
  const path = [];
  const visit = (f) => {
    state.set(f, 'open');
    path.push(f);
    for (const to of g.get(f) ?? []) {
      if (state.get(to) === 'open') return [...path.slice(path.indexOf(to)), to];
      if (!state.has(to)) {
        const c = visit(to);
        if (c) return c;
      }
    }
    path.pop();
    state.set(f, 'done');
    return undefined;
  };
  for (const f of [...g.keys()].sort()) {
    if (!state.has(f)) {
      const c = visit(f);
      if (c) return c;
    }
  }
  return undefined;
}

test('findCycle finds a circle, and none in a tree', () => {
  assert.deepEqual(findCycle(new Map([['a', ['b']], ['b', ['c']], ['c', ['a']]])), ['a', 'b', 'c', 'a']);
  assert.deepEqual(findCycle(new Map([['a', ['a']]])), ['a', 'a']);
  assert.equal(findCycle(new Map([['a', ['b', 'c']], ['b', ['c']], ['c', []]])), undefined);
});

test('no import circle among the sources of src/ and bullmq/src/', () => {
  const g = graph(sourceDirs);
  assert.ok(g.size >= 10, `${g.size} sources read`);
  // Imports are read: the Agent's own, and the server's.
  assert.ok(g.get(join(root, 'src', 'agent.ts')).includes(join(root, 'src', 'server.ts')));
  assert.ok(g.get(join(root, 'src', 'server.ts')).includes(join(root, 'src', 'auth.ts')));
  for (const [f, tos] of g) {
    for (const to of tos) assert.ok(g.has(to), `${relative(root, f)} imports ${relative(root, to)}, not a source`);
  }
  const c = findCycle(g);
  assert.equal(c, undefined, `an import circle: ${c?.map((f) => relative(root, f)).join(' → ')}`);
});

test('no source file of src/ is longer than 500 lines, but the generated protocol types', () => {
  const d = join(root, 'src');
  for (const f of readdirSync(d)) {
    if (!f.endsWith('.ts') || f.endsWith('.gen.ts')) continue;
    const n = readFileSync(join(d, f), 'utf8').split('\n').length;
    assert.ok(n <= 500, `src/${f}: ${n} lines`);
  }
});

/** The members a class declares in a .d.ts, by the text of the class's body: name → line. */
function declaredMembers(dts, cls) {
  const start = dts.search(new RegExp(`^export declare class ${cls}\\b`, 'm'));
  assert.ok(start >= 0, `class ${cls} not declared`);
  const lines = dts.slice(start).split('\n');
  const members = new Map();
  let depth = 0;
  for (const [i, line] of lines.entries()) {
    const code = line.replace(/\/\*.*?\*\/|\/\/.*$/g, '');
    if (depth === 1 && !/^\s*(\*|\/\*\*)/.test(line)) {
      const m = /^\s*(?:(?:readonly|static|private|protected|get|set|async)\s+)*(#?[\w$]+|\[[^\]]+\])\s*[?(:<;]/.exec(code);
      if (m) members.set(m[1], line.trim());
    }
    for (const ch of code) {
      if (ch === '{') depth++;
      else if (ch === '}') depth--;
    }
    if (i > 0 && depth === 0) break;
  }
  return members;
}

test('the published types show no internals: no member named _… in the .d.ts, private constructors of Receive and Claim', () => {
  const dist = join(root, 'dist');
  const dts = Object.fromEntries(
    readdirSync(dist)
      .filter((f) => f.endsWith('.d.ts'))
      .map((f) => [f, readFileSync(join(dist, f), 'utf8')]),
  );
  assert.ok(dts['index.d.ts'], 'dist/index.d.ts: run the build first');
  const agent = declaredMembers(dts['agent.d.ts'], 'Agent');
  for (const want of ['receive', 'stopClaiming', 'return', 'drainStatus', 'beginLeading', 'listen', 'handler']) {
    assert.ok(agent.has(want), `Agent.${want} not read from agent.d.ts: ${[...agent.keys()]}`);
  }
  for (const [f, text] of Object.entries(dts)) {
    for (const cls of text.matchAll(/^export declare class ([\w$]+)/gm)) {
      for (const [name, line] of declaredMembers(text, cls[1])) {
        assert.ok(!name.startsWith('_'), `${f}: ${cls[1]} declares ${line}`);
      }
    }
    assert.doesNotMatch(text, /@internal/, `${f} keeps an @internal declaration`);
  }
  // Claims and receives are made by the Agent alone.
  for (const cls of ['Receive', 'Claim']) {
    assert.equal(declaredMembers(dts['claims.d.ts'], cls).get('constructor'), 'private constructor();', cls);
  }
  // The public entry exports no internal module's machinery.
  for (const name of ['Ledger', 'ClaimCore', 'Drain', 'Leases', 'Dispatcher']) {
    assert.doesNotMatch(dts['index.d.ts'], new RegExp(`\\b${name}\\b`), `index.d.ts exports ${name}`);
  }
});

test('an Agent has no member named _… at run time, beside those of EventEmitter', () => {
  const a = new Agent({ insecureNoToken: true, env: {} });
  const emitter = new Set(Object.keys(new EventEmitter()));
  const names = [];
  for (let o = a; o && o !== EventEmitter.prototype; o = Object.getPrototypeOf(o)) {
    names.push(...Object.getOwnPropertyNames(o).filter((n) => !emitter.has(n)));
  }
  assert.ok(names.includes('stopClaiming'));
  assert.deepEqual(
    names.filter((n) => n.startsWith('_')),
    [],
  );
  const r = a.receive();
  const c = r.hold();
  for (const o of [r, c]) {
    for (let p = o; p && p !== Object.prototype; p = Object.getPrototypeOf(p)) {
      assert.deepEqual(
        Object.getOwnPropertyNames(p).filter((n) => n.startsWith('_')),
        [],
        o.constructor.name,
      );
    }
  }
  c.done();
  r.end();
});
