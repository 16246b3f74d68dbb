// The codec's table of decoded short strings: what it returns is always the bytes' string, whatever
// the slots held before (collisions and replacements included), and a repeated string is the same one.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { AsciiInterner, MAX_INTERNED_BYTES } from '../../../cell-agent/rls/ascii-interner.js';

const latin1 = (buf: Uint8Array, start: number, end: number): string => Buffer.from(buf).toString('latin1', start, end);

/** A `make` that counts the strings it makes. */
function countingMake(): { make: typeof latin1; made: () => number } {
  let made = 0;
  return {
    make: (buf, start, end) => {
      made++;
      return latin1(buf, start, end);
    },
    made: () => made,
  };
}

void test('a repeated string comes back as the same string, without being made again', () => {
  const interner = new AsciiInterner();
  const { make, made } = countingMake();
  const bytes = Buffer.from('..bench-limited..');
  const first = interner.get(bytes, 2, 15, make);
  const again = interner.get(Buffer.from('bench-limited'), 0, 13, make);
  assert.equal(first, 'bench-limited');
  assert.equal(again, 'bench-limited');
  assert.equal(made(), 1, 'made once');
});

void test('empty, over-long and non-ASCII ranges are not interned (null: the caller decodes them)', () => {
  const interner = new AsciiInterner();
  const make = (): string => assert.fail('nothing to make');
  assert.equal(interner.get(Buffer.from('abc'), 1, 1, make), null, 'empty');
  const long = Buffer.alloc(MAX_INTERNED_BYTES + 1, 0x61);
  assert.equal(interner.get(long, 0, long.length, make), null, 'one byte over the bound');
  assert.equal(interner.get(Buffer.from('caf\u00e9', 'utf8'), 0, 5, make), null, 'a UTF-8 sequence');
  assert.notEqual(interner.get(long, 0, MAX_INTERNED_BYTES, latin1), null, 'at the bound');
});

void test('slots must be a power of two', () => {
  assert.throws(() => new AsciiInterner(12), /power of two/);
  assert.throws(() => new AsciiInterner(0), /power of two/);
});

void test('whatever was looked up before (slots shared, strings replaced), the answer is the bytes\u2019 string', () => {
  const word = fc.uint8Array({ minLength: 0, maxLength: MAX_INTERNED_BYTES + 4, min: 0, max: 0x90 });
  fc.assert(
    fc.property(fc.array(word, { minLength: 1, maxLength: 200 }), fc.constantFrom(4, 8, 64), (words, slots) => {
      const interner = new AsciiInterner(slots);
      for (const w of [...words, ...words]) {
        const got = interner.get(w, 0, w.length, latin1);
        const ascii = w.every((b) => b < 0x80);
        if (w.length === 0 || w.length > MAX_INTERNED_BYTES || !ascii) assert.equal(got, null);
        else assert.equal(got, latin1(w, 0, w.length));
      }
    }),
    { numRuns: 300 },
  );
});

void test('a thousand tenants, a domain and a key fit: after the first round nothing is made again', () => {
  const interner = new AsciiInterner();
  const { make, made } = countingMake();
  const words = ['bench', 'tenant', ...Array.from({ length: 1000 }, (_, i) => `tenant-${i}`)].map((w) =>
    Buffer.from(w),
  );
  for (let round = 0; round < 3; round++) for (const w of words) interner.get(w, 0, w.length, make);
  assert.equal(made(), words.length);
});
