// The compact form of a reportAndGrant round (format 2): what is decoded is exactly what was
// encoded (order, duplicates, every number bit for bit), rounds written in the object form (format
// 1) still decode, malformed bytes are refused with LedgerCommandError and change nothing, and a
// ledger fed the compact entries ends in the same state as one fed the object form.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import {
  decodeCommand,
  encodeCommand,
  encodeCommandV1,
  LedgerCommandError,
  ROUND_FORMAT_VERSION,
} from '../../../coordinator/ledger/ledger-commands.js';
import type { LedgerCommandInput } from '../../../coordinator/ledger/ledger-commands.js';
import { Ledger } from '../../../coordinator/ledger/ledger.js';
import { Unpackr } from 'msgpackr';

const name = fc.stringMatching(/^[a-zA-Z0-9._:-]{1,12}$/);
const key = fc.tuple(fc.constantFrom('tenant', 'tier', 'domain'), name).map(([k, n]) => `${k}/${n}`);
const num = fc.oneof(
  fc.constant(0),
  fc.constant(-0),
  fc.nat({ max: 1e9 }),
  fc.double({ min: 0, max: 1e9, noNaN: true }),
  fc.double({ min: 0, max: 1e9, noNaN: true }).map(Math.fround),
);
const time = fc.oneof(fc.nat({ max: 2 ** 40 }), fc.double({ min: 0, max: 8.64e15, noNaN: true }));
const epoch = fc.oneof(fc.integer({ min: 1, max: 300 }), fc.integer({ min: 1, max: Number.MAX_SAFE_INTEGER }));
const round = fc.record(
  {
    nowMs: time,
    leases: fc.array(fc.record({ cellId: name, leaseExpiresAtMs: time }), { maxLength: 5 }),
    acks: fc.array(fc.record({ key, cellId: name, epoch }), { maxLength: 20 }),
    grants: fc.array(
      fc.record({
        key,
        cellId: name,
        rate: num,
        burst: num,
        epoch,
        leaseExpiresAtMs: fc.oneof(time, fc.constant(1000)),
      }),
      { maxLength: 40 },
    ),
    session: fc.record({ clientId: name, seq: fc.integer({ min: 1, max: Number.MAX_SAFE_INTEGER }) }),
  },
  { requiredKeys: ['nowMs'] },
);

const normalised = (v: unknown): unknown =>
  JSON.parse(JSON.stringify(v, (_k, x: unknown) => (Object.is(x, -0) ? 0 : x)));

void test('a round decodes to exactly what was encoded, in order, and equals the object form', () => {
  fc.assert(
    fc.property(round, (r) => {
      const cmd = { type: 'reportAndGrant', ...r } as LedgerCommandInput;
      const compact = decodeCommand(encodeCommand(cmd));
      assert.deepEqual(compact, decodeCommand(encodeCommandV1(cmd)));
      assert.deepEqual(normalised(compact), normalised(cmd));
      // Numbers bit for bit (no float32 or float64 loss), -0 stored as +0.
      const g = (compact as { grants?: { rate: number; burst: number }[] }).grants ?? [];
      (r.grants ?? []).forEach((x, i) => {
        assert.ok(Object.is(g[i]?.rate, x.rate + 0) && Object.is(g[i]?.burst, x.burst + 0));
      });
    }),
    { numRuns: 300 },
  );
});

void test('a round of 20,000 grants is several times smaller than its object form', () => {
  const grants = Array.from({ length: 20_000 }, (_, i) => ({
    key: `tenant/t-${Math.floor(i / 2)}`,
    cellId: `cell-${i % 2}`,
    rate: Math.fround(100 + (i % 97) * 1.37),
    burst: Math.fround(200 + (i % 89) * 2.11),
    epoch: 5 + (i % 11),
    leaseExpiresAtMs: 1_700_000_003_000,
  }));
  const cmd: LedgerCommandInput = { type: 'reportAndGrant', nowMs: 1_700_000_000_000, grants };
  const compact = encodeCommand(cmd).length;
  const object = encodeCommandV1(cmd).length;
  assert.ok(compact * 5 < object, `compact ${compact} B vs object ${object} B`);
  const doc = new Unpackr({ useRecords: false, mapsAsObjects: true }).unpack(encodeCommand(cmd)) as unknown[];
  assert.equal(doc[0], ROUND_FORMAT_VERSION);
  // Other commands keep the object form.
  assert.equal(
    (
      new Unpackr({ useRecords: false, mapsAsObjects: true }).unpack(
        encodeCommand({ type: 'expireLeases', nowMs: 1 }),
      ) as unknown[]
    )[0],
    1,
  );
});

void test('malformed compact rounds are refused with a clear error and change nothing', () => {
  const good = encodeCommand({
    type: 'reportAndGrant',
    nowMs: 10,
    leases: [{ cellId: 'eu', leaseExpiresAtMs: 3010 }],
    grants: [{ key: 'tenant/acme', cellId: 'eu', rate: 1.5, burst: 2, epoch: 1, leaseExpiresAtMs: 3010 }],
  });
  for (let cut = 1; cut < good.length; cut++) {
    assert.throws(() => decodeCommand(good.subarray(0, cut)), LedgerCommandError, `cut at ${cut}`);
  }
  const ledger = new Ledger({ assertInvariants: true });
  const before = ledger.snapshot();
  const r = ledger.applyEncoded(good.subarray(0, good.length - 3), 1);
  assert.equal(r.ok ? 'ok' : r.error.code, 'INVALID');
  const after = Ledger.restore(ledger.snapshot());
  assert.deepEqual(after.snapshot().length, Ledger.restore(before).snapshot().length);
  assert.equal(after.listCells().length, 0);
});

void test('a ledger fed compact rounds ends byte-identical to one fed the object form', () => {
  const a = new Ledger({ assertInvariants: true });
  const b = new Ledger({ assertInvariants: true });
  const cmds: LedgerCommandInput[] = [
    { type: 'putTier', name: 'gold', rate: 500, burst: 1000, floorFraction: 0.3 },
    { type: 'putTenant', id: 'acme', tier: 'gold' },
    { type: 'putTenant', id: 'globex', tier: 'gold' },
    { type: 'registerCell', cellId: 'eu', nowMs: 1000 },
    { type: 'registerCell', cellId: 'us', nowMs: 1000 },
    {
      type: 'reportAndGrant',
      nowMs: 1500,
      leases: [
        { cellId: 'eu', leaseExpiresAtMs: 4500 },
        { cellId: 'us', leaseExpiresAtMs: 4500 },
      ],
      grants: [
        { key: 'tenant/acme', cellId: 'eu', rate: Math.fround(123.4), burst: 246.8, epoch: 1, leaseExpiresAtMs: 4500 },
        { key: 'tenant/globex', cellId: 'us', rate: 200, burst: 400, epoch: 1, leaseExpiresAtMs: 4500 },
      ],
    },
    {
      type: 'reportAndGrant',
      nowMs: 1600,
      acks: [{ key: 'tenant/acme', cellId: 'eu', epoch: 1 }],
      grants: [{ key: 'tenant/acme', cellId: 'eu', rate: 0.1, burst: 0, epoch: 2, leaseExpiresAtMs: 4600 }],
    },
  ];
  cmds.forEach((c, i) => {
    const ra = a.applyEncoded(encodeCommand(c), i + 1);
    const rb = b.applyEncoded(encodeCommandV1(c), i + 1);
    assert.deepEqual(ra, rb);
  });
  assert.deepEqual(a.snapshot(), b.snapshot());
});
