// Request bodies: one JSON value, decoded by the schema's field specs
// (protocol.gen.ts), with integers kept exact (int64 fields as bigint: a
// Leadership sequence is Unix nanoseconds, beyond a double's 2^53) and the
// errors the Go package worker answers with.
import { schemaFields, type FieldSpec } from './protocol.gen.js';

/** A JSON number as written, so that an int64 is read without rounding. */
class JsonNumber {
  constructor(readonly raw: string) {}
}

type JsonValue = null | boolean | string | JsonNumber | JsonValue[] | JsonObject;
interface JsonObject {
  [key: string]: JsonValue;
}

/** The deepest nesting accepted; deeper is a 400 (Go's decoder allows 10000; the sidecar's bodies are flat). */
const maxDepth = 1000;

class SyntaxErr extends Error {}

const numberRe = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;

/** A strict JSON parser (RFC 8259) over a string, keeping numbers as written. */
class Parser {
  i = 0;
  constructor(readonly s: string) {}

  ws(): void {
    const s = this.s;
    while (this.i < s.length) {
      const c = s.charCodeAt(this.i);
      if (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) this.i++;
      else break;
    }
  }

  fail(what: string): never {
    if (this.i >= this.s.length) throw new SyntaxErr('unexpected end of JSON input');
    throw new SyntaxErr(`invalid character ${JSON.stringify(this.s[this.i])} ${what}`);
  }

  value(depth: number): JsonValue {
    if (depth > maxDepth) throw new SyntaxErr(`exceeded max depth ${maxDepth}`);
    this.ws();
    const c = this.s[this.i];
    switch (c) {
      case '{':
        return this.object(depth);
      case '[':
        return this.array(depth);
      case '"':
        return this.string();
      case 't':
        return this.literal('true', true);
      case 'f':
        return this.literal('false', false);
      case 'n':
        return this.literal('null', null);
      default:
        if (c === '-' || (c !== undefined && c >= '0' && c <= '9')) return this.number();
        return this.fail('looking for beginning of value');
    }
  }

  literal<T>(word: string, v: T): T {
    if (this.s.startsWith(word, this.i)) {
      this.i += word.length;
      return v;
    }
    for (let k = 0; k < word.length; k++, this.i++) {
      if (this.s[this.i] !== word[k]) this.fail(`in literal ${word} (expecting ${JSON.stringify(word[k])})`);
    }
    return v;
  }

  number(): JsonNumber {
    numberRe.lastIndex = this.i;
    const m = numberRe.exec(this.s);
    if (!m) {
      this.i++;
      this.fail('in numeric literal');
    }
    // A number cut off where its grammar wants more ("1.", "1e") is a syntax error too.
    const next = this.s[this.i + m[0].length];
    if (next === '.' || next === 'e' || next === 'E') {
      this.i += m[0].length;
      this.fail('after numeric literal');
    }
    this.i += m[0].length;
    return new JsonNumber(m[0]);
  }

  string(): string {
    const s = this.s;
    this.i++; // the opening quote
    let out = '';
    let start = this.i;
    for (;;) {
      if (this.i >= s.length) throw new SyntaxErr('unexpected end of JSON input');
      const c = s.charCodeAt(this.i);
      if (c === 0x22) {
        out += s.slice(start, this.i);
        this.i++;
        return out;
      }
      if (c < 0x20) this.fail('in string literal');
      if (c !== 0x5c) {
        this.i++;
        continue;
      }
      out += s.slice(start, this.i);
      const e = s[this.i + 1];
      this.i += 2;
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          const hex = s.slice(this.i, this.i + 4);
          if (!/^[0-9a-fA-F]{4}$/.test(hex)) this.fail('in \\u hexadecimal character escape');
          out += String.fromCharCode(parseInt(hex, 16));
          this.i += 4;
          break;
        }
        default:
          this.i--;
          this.fail('in string escape code');
      }
      start = this.i;
    }
  }

  array(depth: number): JsonValue[] {
    this.i++;
    const out: JsonValue[] = [];
    this.ws();
    if (this.s[this.i] === ']') {
      this.i++;
      return out;
    }
    for (;;) {
      out.push(this.value(depth + 1));
      this.ws();
      const c = this.s[this.i];
      if (c === ',') {
        this.i++;
        continue;
      }
      if (c === ']') {
        this.i++;
        return out;
      }
      this.fail('after array element');
    }
  }

  object(depth: number): JsonObject {
    this.i++;
    const out: JsonObject = Object.create(null) as JsonObject;
    this.ws();
    if (this.s[this.i] === '}') {
      this.i++;
      return out;
    }
    for (;;) {
      this.ws();
      if (this.s[this.i] !== '"') this.fail('looking for beginning of object key string');
      const key = this.string();
      this.ws();
      if (this.s[this.i] !== ':') this.fail('after object key');
      this.i++;
      out[key] = this.value(depth + 1); // a repeated key: the last wins, as in Go
      this.ws();
      const c = this.s[this.i];
      if (c === ',') {
        this.i++;
        continue;
      }
      if (c === '}') {
        this.i++;
        return out;
      }
      this.fail('after object key:value pair');
    }
  }
}

/** BodyError is a request body refused with 400, its message the answer's error. */
export class BodyError extends Error {}

const int64Min = -(2n ** 63n);
const int64Max = 2n ** 63n - 1n;

/**
 * parseObject reads a body that must be one JSON object and nothing after
 * it but white space, as the Go worker does: its errors are the protocol's
 * ("body: empty; want one JSON object", "body: data after the JSON value;
 * ...").
 */
function parseObject(body: string): JsonObject {
  const p = new Parser(body);
  p.ws();
  if (p.i >= body.length) throw new BodyError('body: empty; want one JSON object');
  let v: JsonValue;
  try {
    v = p.value(0);
  } catch (e) {
    if (e instanceof SyntaxErr) throw new BodyError(`body: ${e.message}; want one JSON object`);
    throw e;
  }
  if (v === null || typeof v !== 'object' || Array.isArray(v) || v instanceof JsonNumber) {
    const raw = body.trimStart().slice(0, 20);
    throw new BodyError(`body: ${raw} is not a JSON object; want one JSON object`);
  }
  p.ws();
  if (p.i < body.length) {
    throw new BodyError('body: data after the JSON value; want one JSON object and nothing after it but white space');
  }
  return v;
}

function describe(v: JsonValue): string {
  if (v === null) return 'null';
  if (v instanceof JsonNumber) return `number ${v.raw}`;
  if (Array.isArray(v)) return 'array';
  if (typeof v === 'object') return 'object';
  return typeof v;
}

/** The value of an absent (or null) field: every field reads as its zero value (docs/protocol.md). */
function zero(spec: FieldSpec): unknown {
  switch (spec.kind) {
    case 'boolean':
      return false;
    case 'string':
      return '';
    case 'int':
      return 0;
    case 'int64':
      return 0n;
    default:
      return undefined;
  }
}

function decodeField(schema: string, field: string, spec: FieldSpec, v: JsonValue): unknown {
  const bad = (want: string) =>
    new BodyError(`body: json: cannot unmarshal ${describe(v)} into field ${schema}.${field} of type ${want}; want one JSON object`);
  if (v === null) return zero(spec); // Go leaves a field unchanged by null
  switch (spec.kind) {
    case 'boolean':
      if (typeof v !== 'boolean') throw bad('boolean');
      return v;
    case 'string':
      if (typeof v !== 'string') throw bad('string');
      return v;
    case 'int':
    case 'int64': {
      if (!(v instanceof JsonNumber) || !/^-?[0-9]+$/.test(v.raw)) throw bad(spec.kind === 'int' ? 'int' : 'int64');
      const n = BigInt(v.raw);
      if (n < int64Min || n > int64Max) throw bad(spec.kind);
      return spec.kind === 'int64' ? n : Number(n);
    }
    case 'date-time': {
      if (typeof v !== 'string') throw bad('date-time');
      const t = parseRFC3339(v);
      if (t === undefined) {
        throw new BodyError(`body: parsing time ${JSON.stringify(v)} as RFC 3339 in field ${schema}.${field}; want one JSON object`);
      }
      return t === zeroTime ? undefined : t; // Go's zero time is an absent one
    }
    default:
      throw bad(spec.kind); // no request field of another kind
  }
}

/**
 * decode reads body (a request's, whole) as one JSON object of the schema
 * named schema in docs/protocol.yaml: known fields of the wrong type are a
 * BodyError, absent and null ones read as their zero value (date-times:
 * undefined, as the Unix time in nanoseconds otherwise), unknown ones are
 * ignored.
 */
export function decode<T>(schema: string, body: string): T {
  const specs = schemaFields[schema];
  if (!specs) throw new Error(`no schema ${schema}`);
  const obj = parseObject(body);
  const out: Record<string, unknown> = {};
  for (const [field, spec] of Object.entries(specs)) {
    const v = obj[field];
    out[field] = v === undefined ? zero(spec) : decodeField(schema, field, spec, v);
  }
  return out as T;
}

// RFC 3339 times, as Go's time.Time reads them in JSON.

/** Go's zero time.Time (0001-01-01T00:00:00Z) in Unix nanoseconds. */
export const zeroTime = -62135596800n * 1_000_000_000n;

const rfc3339 = /^([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?(?:(Z)|([+-])([0-9]{2}):([0-9]{2}))$/;

function daysIn(month: number, year: number): number {
  if (month === 2) return (year % 4 === 0 && year % 100 !== 0) || year % 400 === 0 ? 29 : 28;
  return [4, 6, 9, 11].includes(month) ? 30 : 31;
}

/** parseRFC3339 reads an RFC 3339 time (fractional seconds up to nanoseconds) into Unix nanoseconds; undefined when it is not one. */
export function parseRFC3339(s: string): bigint | undefined {
  const m = rfc3339.exec(s);
  if (!m) return undefined;
  const [year, month, day, hour, minute, second] = m.slice(1, 7).map(Number) as [number, number, number, number, number, number];
  if (month < 1 || month > 12 || day < 1 || day > daysIn(month, year) || hour > 23 || minute > 59 || second > 59) return undefined;
  let offset = 0;
  if (!m[8]) {
    const oh = Number(m[10]);
    const om = Number(m[11]);
    if (oh > 23 || om > 59) return undefined;
    offset = (m[9] === '-' ? -1 : 1) * (oh * 60 + om) * 60;
  }
  const frac = ((m[7] ?? '') + '000000000').slice(0, 9);
  const date = new Date(0);
  date.setUTCFullYear(year, month - 1, day);
  date.setUTCHours(hour, minute, second, 0);
  const secs = BigInt(Math.round(date.getTime() / 1000)) - BigInt(offset);
  return secs * 1_000_000_000n + BigInt(frac);
}

// Answers: JSON with bigints written as numbers.

/** encode writes v as JSON: bigints as integers, undefined fields left out. */
export function encode(v: unknown): string {
  switch (typeof v) {
    case 'bigint':
      return v.toString();
    case 'number':
      return Number.isFinite(v) ? String(v) : 'null';
    case 'boolean':
      return v ? 'true' : 'false';
    case 'string':
      return JSON.stringify(v);
    case 'object': {
      if (v === null) return 'null';
      if (Array.isArray(v)) return `[${v.map((x) => (x === undefined ? 'null' : encode(x))).join(',')}]`;
      const parts: string[] = [];
      for (const [k, x] of Object.entries(v)) {
        if (x !== undefined) parts.push(`${JSON.stringify(k)}:${encode(x)}`);
      }
      return `{${parts.join(',')}}`;
    }
    default:
      return 'null';
  }
}
