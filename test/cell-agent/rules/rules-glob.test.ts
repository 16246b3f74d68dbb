// The `*` glob of wildcard values, checked by example and against an independent reference matcher.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { compileGlob, isGlobPattern } from '../../../cell-agent/rules/rules-glob.js';

/** Reference: the textbook recursive definition, memoised on (pattern index, subject index). */
function referenceMatch(pattern: string, subject: string): boolean {
  const memo = new Map<number, boolean>();
  const go = (p: number, s: number): boolean => {
    const key = p * (subject.length + 1) + s;
    const known = memo.get(key);
    if (known !== undefined) return known;
    let result: boolean;
    if (p === pattern.length) result = s === subject.length;
    else if (pattern[p] === '*') result = go(p + 1, s) || (s < subject.length && go(p, s + 1));
    else result = s < subject.length && pattern[p] === subject[s] && go(p + 1, s + 1);
    memo.set(key, result);
    return result;
  };
  return go(0, 0);
}

void test('examples from the reference: foo*, bar*b, foo*bar*baz', () => {
  const cases: [string, string, boolean][] = [
    ['foo*', 'foo', true],
    ['foo*', 'foobar', true],
    ['foo*', 'fo', false],
    ['foo*', 'afoo', false],
    ['bar*b', 'barb', true],
    ['bar*b', 'barxxb', true],
    ['bar*b', 'bar', false],
    ['bar*b', 'barbx', false],
    ['foo*bar*baz', 'foobarbaz', true],
    ['foo*bar*baz', 'fooXbarYbaz', true],
    ['foo*bar*baz', 'foobarbarbaz', true],
    ['foo*bar*baz', 'foobaz', false],
    ['foo*bar*baz', 'foobarba', false],
    ['*', '', true],
    ['**', 'x', true],
    ['*a*', 'bab', true],
    ['*a*', 'bbb', false],
    ['ab*ba', 'aba', false],
    ['ab*ba', 'abba', true],
    ['a*a*a', 'aa', false],
    ['a*a*a', 'aaa', true],
    ['plain', 'plain', true],
    ['plain', 'plains', false],
    ['.*', 'xyz', false],
    ['.*', '.xyz', true],
    ['(a|b)*', '(a|b)c', true],
    ['[x]*', 'x', false],
  ];
  for (const [pattern, subject, expected] of cases) {
    assert.equal(compileGlob(pattern).test(subject), expected, `${pattern} ~ ${subject}`);
    assert.equal(referenceMatch(pattern, subject), expected, `reference: ${pattern} ~ ${subject}`);
  }
  assert.equal(isGlobPattern('a*'), true);
  assert.equal(isGlobPattern('a'), false);
});

void test('property: compileGlob agrees with the reference matcher on random patterns and strings', () => {
  const pattern = fc.string({ unit: fc.constantFrom('a', 'b', '*'), maxLength: 10 });
  const subject = fc.string({ unit: fc.constantFrom('a', 'b', '*', 'c'), maxLength: 14 });
  fc.assert(
    fc.property(pattern, subject, (p, s) => compileGlob(p).test(s) === referenceMatch(p, s)),
    { numRuns: 5_000 },
  );
});

void test('property: a subject made by filling each `*` of a pattern always matches it', () => {
  const pattern = fc.string({ unit: fc.constantFrom('a', 'b', 'x', '*'), maxLength: 10 });
  const fill = fc.array(fc.string({ unit: fc.constantFrom('a', 'b', 'x', '*'), maxLength: 4 }), {
    minLength: 10,
    maxLength: 10,
  });
  fc.assert(
    fc.property(pattern, fill, (p, fills) => {
      let i = 0;
      const s = p.replace(/\*/g, () => fills[i++] ?? '');
      return compileGlob(p).test(s) && referenceMatch(p, s);
    }),
    { numRuns: 2_000 },
  );
});

void test('a long adversarial subject is matched quickly (no backtracking blow-up)', () => {
  const glob = compileGlob(`${'a*'.repeat(50)}b`);
  const subject = 'a'.repeat(100_000);
  const started = process.hrtime.bigint();
  assert.equal(glob.test(subject), false);
  // Generous: the point is "not exponential", not a timing target.
  assert.ok(process.hrtime.bigint() - started < 2_000_000_000n);
});
