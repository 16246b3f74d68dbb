// One ledger log for the command-format gate (test/coordinator/ledger/ledger-format-gate.test.ts): the entries a
// cluster wrote before its log was raised to format 5 (every command of format 1 and 3 the builds before it
// proposed, with the cases whose semantics format 5 changes: a tenant deleted under tier:NAME with its grants out,
// the policy becoming tier:NAME over a deleted tenant's slices, leaving it while implicit tenants wind down), then
// the raise, then the same cases at format 5. Plain command objects, no import of the ledger, so that
// test/coordinator/ledger/record-pre-format-5.ts can apply the first part on an older checkout of the ledger.
const TTL = 3000;
const CELLS = ['a', 'b'] as const;

function round(nowMs: number, grants: [key: string, rate: number, epoch: number][], acks: typeof grants = []) {
  return {
    type: 'reportAndGrant',
    nowMs,
    leases: CELLS.map((cellId) => ({ cellId, leaseExpiresAtMs: nowMs + TTL })),
    acks: acks.flatMap(([key, , epoch]) => CELLS.map((cellId) => ({ key, cellId, epoch }))),
    grants: grants.flatMap(([key, rate, epoch]) =>
      CELLS.map((cellId) => ({ key, cellId, rate, burst: rate, epoch, leaseExpiresAtMs: nowMs + TTL })),
    ),
  };
}

/** Entries before the raise: what builds before format 5 wrote (the review's repro first). */
export const PRE_RAISE_LOG: readonly unknown[] = [
  { type: 'putTier', name: 'gold', rate: 100, burst: 100, floorFraction: 0 },
  { type: 'putTier', name: 'platinum', rate: 1000, burst: 1000, floorFraction: 0 },
  { type: 'putTierCap', tier: 'gold', rate: 5000, burst: 5000 },
  { type: 'putTenant', id: 'acme', tier: 'platinum' },
  { type: 'putTenant', id: 'globex', tier: 'gold' },
  ...CELLS.map((cellId) => ({ type: 'registerCell', cellId, nowMs: 0 })),
  { type: 'putSettings', unknownTenant: 'tier:gold' },
  round(10, [
    ['tenant/acme', 400, 1],
    ['tenant/globex', 40, 1],
    ['tenant/stranger', 30, 1],
  ]),
  // Under tier:gold, with 2 × 400/s out: the review's case.
  { type: 'deleteTenant', id: 'acme' },
  round(20, [['tenant/acme', 50, 2]]),
  // An idle implicit tenant wound down (format 3, since 129ef84).
  { type: 'retireImplicitTenants', keys: ['tenant/stranger'] },
  round(30, [['tenant/stranger', 0, 2]], [['tenant/acme', 50, 2]]),
  // A tenant deleted under deny, then the policy becomes tier:gold over its slices, then deny again.
  { type: 'putSettings', unknownTenant: 'deny' },
  { type: 'deleteTenant', id: 'globex' },
  { type: 'putSettings', unknownTenant: 'tier:gold' },
  round(40, [['tenant/globex', 20, 2]]),
  { type: 'putSettings', unknownTenant: 'deny' },
  round(50, [['tenant/globex', 0, 3]], [['tenant/globex', 20, 2]]),
  { type: 'expireLeases', nowMs: 50 + TTL + 2000 },
];

/** The raise (format 5). */
export const RAISE_ENTRY = { type: 'raiseCommandFormat', format: 5 } as const;

/** Entries after the raise: the same cases, applied at format 5. */
export const POST_RAISE_LOG: readonly unknown[] = [
  { type: 'putTenant', id: 'initech', tier: 'platinum' },
  { type: 'putSettings', unknownTenant: 'tier:gold' },
  round(10_000, [['tenant/initech', 400, 10]]),
  { type: 'deleteTenant', id: 'initech' },
  // The round an older leader would propose for the key: a shrink towards the tier (refused at format 5: no quota
  // while it winds down).
  round(10_010, [['tenant/initech', 50, 11]]),
  { type: 'reviveImplicitTenants', keys: ['tenant/initech'] },
  round(10_020, [['tenant/initech', 50, 11]]),
];
