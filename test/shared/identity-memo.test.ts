// IdentityMemo: the last two keys' values, found by identity, the older replaced first.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { IdentityMemo } from '../../shared/identity-memo.js';

void test('identity memo: a value is found for the same object only, among the last two set; the older goes first', () => {
  const memo = new IdentityMemo<object, number>();
  const [a, b, c] = [{ k: 1 }, { k: 1 }, { k: 1 }];
  const all = (): (number | undefined)[] => [a, b, c].map((k) => memo.get(k));
  assert.deepEqual(all(), [undefined, undefined, undefined], 'empty');
  memo.set(a, 1);
  memo.set(b, 2);
  assert.deepEqual(all(), [1, 2, undefined]);
  assert.equal(memo.get({ k: 1 }), undefined, 'an equal object is another key');
  memo.set(c, 3); // replaces a, the older
  assert.deepEqual(all(), [undefined, 2, 3]);
  memo.set(a, 4); // replaces b
  assert.deepEqual(all(), [4, undefined, 3]);
});
