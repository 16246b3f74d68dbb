// Property: any sequence of Raft-shaped saves and compactions, with reopens at random points, leaves
// the LevelDB storage holding exactly what a simple in-memory model of the contract holds.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { EntryKind, type Entry, type HardState, type Snapshot } from '../../../coordinator/raft/index.js';
import {
  assertSameState,
  bootstrapData,
  ent,
  layouts,
  options,
  save,
  withTempDir,
  StorageModel,
} from './storage-helpers.js';

/** Raw choices; each is interpreted against the model's current state so every op is a valid one. */
type OpSeed =
  | { t: 'append'; from: number; count: number; termBump: boolean; commitAdv: number; vote: boolean; sync: boolean }
  | { t: 'install'; at: number; count: number; termBump: boolean; voters: number }
  | { t: 'compact'; at: number; keepBack: number }
  | { t: 'reopen' };

const opSeed: fc.Arbitrary<OpSeed> = fc.oneof(
  {
    weight: 6,
    arbitrary: fc.record({
      t: fc.constant('append' as const),
      from: fc.nat(),
      count: fc.nat({ max: 5 }),
      termBump: fc.boolean(),
      commitAdv: fc.nat(),
      vote: fc.boolean(),
      sync: fc.boolean(),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      t: fc.constant('install' as const),
      at: fc.nat({ max: 8 }),
      count: fc.nat({ max: 3 }),
      termBump: fc.boolean(),
      voters: fc.integer({ min: 1, max: 5 }),
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({ t: fc.constant('compact' as const), at: fc.nat(), keepBack: fc.nat({ max: 6 }) }),
  },
  { weight: 1, arbitrary: fc.constant({ t: 'reopen' as const }) },
);

const kinds = [EntryKind.Normal, EntryKind.Noop, EntryKind.Conf] as const;
const mkEntries = (from: number, count: number, term: number): Entry[] =>
  Array.from({ length: count }, (_, i) =>
    ent(from + i, term, kinds[(from + i) % 3] ?? EntryKind.Normal, (from + i) % 4 === 0 ? 0 : 24),
  );

for (const layout of layouts)
  void test(`${layout.name}: storage matches the in-memory model over random save/compact/reopen sequences`, async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(opSeed, { minLength: 1, maxLength: 30 }), async (seeds) => {
        await withTempDir(async (dir) => {
          const initial: Snapshot = {
            meta: { index: 0, term: 0, conf: { voters: ['n1', 'n2', 'n3'], learners: [] } },
            data: bootstrapData,
          };
          const model = new StorageModel(initial);
          let s = await layout.open(dir, options());
          try {
            assertSameState(await s.load(), model.load(), 'fresh');
            for (const [step, seed] of seeds.entries()) {
              const where = `step ${step} ${JSON.stringify(seed)}`;
              const S = model.snapshot.meta.index;
              const { term, commit } = model.hard;
              if (seed.t === 'append') {
                const low = Math.max(S, commit) + 1;
                const high = model.lastIndex() + 1;
                const from = low + (seed.from % (high - low + 1));
                const newTerm = term + (seed.termBump ? 1 : 0);
                const entries = mkEntries(from, seed.count, newTerm);
                const newLast = seed.count > 0 ? from + seed.count - 1 : model.lastIndex();
                const hard: HardState = {
                  term: newTerm,
                  vote: seed.vote ? 'n2' : null,
                  commit: commit + (seed.commitAdv % (newLast - commit + 1)),
                };
                const rd = save({ entries, hardState: hard, mustSync: seed.sync });
                model.save(rd);
                await s.save(rd);
              } else if (seed.t === 'install') {
                const at = commit + 1 + seed.at;
                const newTerm = term + (seed.termBump ? 1 : 0);
                const voters = ['n1', 'n2', 'n3', 'n4', 'n5'].slice(0, seed.voters);
                const snapshot: Snapshot = {
                  meta: { index: at, term: newTerm, conf: { voters, learners: ['n9'] } },
                  data: new Uint8Array([at & 0xff, 1, 2]),
                };
                const rd = save({
                  snapshot,
                  entries: mkEntries(at + 1, seed.count, newTerm),
                  hardState: { term: newTerm, vote: null, commit: at },
                });
                model.save(rd);
                await s.save(rd);
              } else if (seed.t === 'compact') {
                if (commit <= S) continue;
                const at = S + 1 + (seed.at % (commit - S));
                const t = model.termAt(at);
                assert.ok(t !== undefined, `${where}: model has no entry at ${at}`);
                const snapshot: Snapshot = {
                  meta: { index: at, term: t, conf: { voters: ['n1', 'n2'], learners: [] } },
                  data: new Uint8Array([at & 0xff]),
                };
                const keepFrom = at + 1 - seed.keepBack;
                assert.equal(await s.compact(snapshot, keepFrom), model.compact(snapshot, keepFrom), where);
              } else {
                await s.close();
                s = await layout.open(dir, options());
                assert.equal(s.meta().fresh, false);
                assert.deepEqual(s.meta().repairs, [], `${where}: a clean store needs no repair`);
                assertSameState(await s.load(), model.load(), where);
              }
              // Cheap in-memory bookkeeping check after every step.
              const st = s.stats();
              assert.deepEqual(st.hardState, model.hard, where);
              assert.equal(st.snapshotIndex, model.snapshot.meta.index, where);
              // The log keeps whole segments, so it may hold more trailing entries than asked for.
              if (model.entries.length > 0) {
                assert.equal(st.lastStoredIndex, model.entries.at(-1)?.index, where);
                if (layout.trailingExact) assert.equal(st.firstStoredIndex, model.entries[0]?.index, where);
                else assert.ok(st.firstStoredIndex <= (model.entries[0]?.index ?? 0), where);
              } else if (layout.trailingExact) assert.ok(st.lastStoredIndex < st.firstStoredIndex, where);
            }
            assertSameState(await s.load(), model.load(), 'end, same handle');
            await s.close();
            s = await layout.open(dir, options());
            assertSameState(await s.load(), model.load(), 'end, reopened');
          } finally {
            await s.close();
          }
        });
      }),
      { numRuns: 40 },
    );
  });
