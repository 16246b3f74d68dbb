// HeldKeys (cell-agent/lease/held-keys.ts): which keys the lease client evicts past --max-lease-keys
// (least recently used first, never one with demand, down to the low watermark) and the releases it
// sends (the highest epoch given back; done only once a leader took them).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { HeldKeys, LOW_WATERMARK, MAX_RELEASES_PER_REPORT } from '../../../cell-agent/lease/held-keys.js';

void test('held keys: nothing is evicted up to the bound; past it the least recently used without demand go, down to the low watermark', () => {
  const h = new HeldKeys(10);
  const held = new Set<string>();
  for (let i = 0; i < 10; i++) {
    held.add(`tenant/t${i}`);
    h.touch(`tenant/t${i}`);
  }
  assert.deepEqual(
    h.victims(held.size, (k) => held.has(k)),
    [],
    'at the bound: none',
  );
  for (let i = 10; i < 12; i++) {
    held.add(`tenant/t${i}`);
    h.touch(`tenant/t${i}`);
  }
  h.touch('tenant/t0'); // used again: the most recent now
  h.setDemand(new Set(['tenant/t1'])); // in use: never evicted
  const target = Math.floor(10 * LOW_WATERMARK);
  const victims = h.victims(held.size, (k) => held.has(k) && k !== 'tenant/t2'); // t2 was dropped meanwhile
  assert.deepEqual(victims, ['tenant/t3', 'tenant/t4', 'tenant/t5']);
  assert.equal(held.size - victims.length, target);
  assert.equal(h.size, 12 - 3 - 1, 'the victims and the stale entry are gone from the order');
});

void test('held keys: a release keeps the highest epoch given back, is done only when delivered at that epoch, and ends when a newer grant is taken', () => {
  const h = new HeldKeys(Infinity);
  assert.deepEqual(
    h.victims(1e9, () => true),
    [],
    'no bound: no eviction',
  );
  h.release('tenant/a', 3);
  h.release('tenant/a', 2);
  assert.equal(h.released('tenant/a'), 3);
  const sent = h.page();
  h.release('tenant/a', 5); // evicted again at a newer epoch while the report was out
  h.delivered(sent);
  assert.equal(h.released('tenant/a'), 5, 'the newer release still waits');
  h.unrelease('tenant/a');
  assert.equal(h.released('tenant/a'), undefined);
  for (let i = 0; i < MAX_RELEASES_PER_REPORT + 5; i++) h.release(`tenant/t${i}`, 1);
  assert.equal(h.page().length, MAX_RELEASES_PER_REPORT, 'a report carries at most MAX_RELEASES_PER_REPORT');
  assert.equal(h.pending, MAX_RELEASES_PER_REPORT + 5);
});

void test('held keys: releases a leader parked are kept and not sent until unparked, still refuse grants at or below their epoch, and a newer release or grant ends the parking', () => {
  const h = new HeldKeys(100);
  h.release('tenant/a', 4);
  h.release('tenant/b', 7);
  const sent = h.page();
  assert.deepEqual(
    sent.map((r) => r.key),
    ['tenant/a', 'tenant/b'],
  );
  h.release('tenant/c', 1); // released while that report was out: not part of it
  h.park(sent);
  assert.equal(h.parkedCount, 2);
  assert.equal(h.pending, 3, 'parked releases still wait');
  assert.deepEqual(
    h.page().map((r) => r.key),
    ['tenant/c'],
    'parked ones are not sent again',
  );
  assert.equal(h.released('tenant/a'), 4, 'a parked release still names its epoch (grants at or below it not taken)');
  h.release('tenant/b', 9); // evicted again at a newer epoch: a new release, sent
  assert.equal(h.parkedCount, 1);
  assert.deepEqual(
    h.page().map((r) => r.key),
    ['tenant/b', 'tenant/c'],
  );
  assert.equal(h.unpark(), true, 'a leader that drops slices now: unparked');
  assert.equal(h.unpark(), false, 'nothing left parked');
  const again = h.page();
  assert.deepEqual(
    again.map((r) => [r.key, r.epoch]),
    [
      ['tenant/a', 4],
      ['tenant/b', 9],
      ['tenant/c', 1],
    ],
    'sent again at the epochs given back',
  );
  h.park(again);
  h.unrelease('tenant/a'); // a newer grant taken
  assert.equal(h.parkedCount, 2);
  h.delivered(again);
  assert.equal(h.pending, 0);
  assert.equal(h.parkedCount, 0, 'delivered: neither waiting nor parked');
});
