// Loading rules from a real temporary directory, and hot reload with watchRules.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rename, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, dirname, join } from 'node:path';
import { listRulesFiles, loadRules, watchRules } from '../../../cell-agent/rules/rules-load.js';
import type { RuleSet } from '../../../cell-agent/rules/rules-compile.js';
import { matchDescriptor } from '../../../cell-agent/rules/rules-match.js';
import { RULES_ERROR_CODES, RulesError } from '../../../cell-agent/rules/rules-errors.js';

async function tempDir(t: { after: (fn: () => Promise<void>) => void }): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'cellquota-rules-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

/** Replaces a file atomically (a temporary dotfile renamed over it), as editors and ConfigMap updates do. */
async function replaceFile(path: string, text: string): Promise<void> {
  const temporary = join(dirname(path), `.${basename(path)}.tmp`);
  await writeFile(temporary, text);
  await rename(temporary, path);
}

function rules(domain: string, requestsPerUnit: number): string {
  return `domain: ${domain}\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: ${requestsPerUnit}}\n`;
}

function limitOf(ruleSet: RuleSet | null, domain = 'api'): number | null {
  const limit = ruleSet === null ? null : matchDescriptor(ruleSet, domain, [{ key: 'k', value: 'v' }])?.limit;
  return limit?.kind === 'rate' ? limit.requestsPerUnit : null;
}

void test('a directory: *.yaml and *.yml, sorted, dotfiles, other files and subdirectories skipped, symlinks followed', async (t) => {
  const dir = await tempDir(t);
  const other = await tempDir(t);
  await writeFile(join(dir, 'b.yml'), rules('b', 2));
  await writeFile(join(dir, 'a.yaml'), rules('a', 1));
  await writeFile(join(dir, '.hidden.yaml'), 'not: [valid');
  await writeFile(join(dir, 'notes.txt'), 'not yaml');
  await writeFile(join(dir, 'c.yaml~'), 'editor backup');
  await mkdir(join(dir, 'sub.yaml'));
  await writeFile(join(other, 'target.yaml'), rules('linked', 3));
  await symlink(join(other, 'target.yaml'), join(dir, 'c-link.yaml'));
  assert.deepEqual(
    await listRulesFiles(dir),
    ['a.yaml', 'b.yml', 'c-link.yaml'].map((n) => join(dir, n)),
  );
  const ruleSet = await loadRules(dir);
  assert.deepEqual([...ruleSet.domains.keys()], ['a', 'b', 'linked']);
  assert.equal(limitOf(ruleSet, 'linked'), 3);
  assert.match(ruleSet.fingerprint ?? '', /^[0-9a-f]{64}$/);
  assert.equal((await loadRules(dir)).fingerprint, ruleSet.fingerprint, 'same sources, same fingerprint');
  await writeFile(join(dir, 'b.yml'), rules('b', 20));
  assert.notEqual((await loadRules(dir)).fingerprint, ruleSet.fingerprint);
});

void test('read errors: missing path, empty directory, file over the size bound', async (t) => {
  const dir = await tempDir(t);
  const missing = join(dir, 'missing.yaml');
  await assert.rejects(
    loadRules(missing),
    (e: unknown) =>
      e instanceof RulesError &&
      e.code === RULES_ERROR_CODES.READ_FAILED &&
      e.message === `${missing}: cannot read rules: ENOENT: no such file or directory, stat '${missing}'`,
  );
  await assert.rejects(
    loadRules(dir),
    (e: unknown) =>
      e instanceof RulesError &&
      e.code === RULES_ERROR_CODES.NO_FILES &&
      e.message === `${dir}: no rules files (*.yaml, *.yml) in the directory`,
  );
  const big = join(dir, 'big.yaml');
  await writeFile(big, `${rules('api', 1)}# ${'x'.repeat(200)}\n`);
  await assert.rejects(
    loadRules(big, { maxFileBytes: 100 }),
    (e: unknown) =>
      e instanceof RulesError &&
      e.code === RULES_ERROR_CODES.FILE_TOO_LARGE &&
      e.message === `${big}: file is larger than 100 bytes`,
  );
  assert.equal(limitOf(await loadRules(big)), 1);
});

/** Collects watcher callbacks; next() resolves with the next one (or fails after a timeout). */
function recorder() {
  type Event = { kind: 'change'; ruleSet: RuleSet } | { kind: 'error'; error: RulesError; lastGood: RuleSet | null };
  const events: Event[] = [];
  let waiting: ((event: Event) => void) | null = null;
  const push = (event: Event) => {
    if (waiting !== null) {
      const resolve = waiting;
      waiting = null;
      resolve(event);
    } else {
      events.push(event);
    }
  };
  return {
    onChange: (ruleSet: RuleSet) => push({ kind: 'change', ruleSet }),
    onError: (error: RulesError, lastGood: RuleSet | null) => push({ kind: 'error', error, lastGood }),
    next: (timeoutMs = 5_000): Promise<Event> => {
      const queued = events.shift();
      if (queued !== undefined) return Promise.resolve(queued);
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error('no watcher event')), timeoutMs);
        waiting = (event) => {
          clearTimeout(timer);
          resolve(event);
        };
      });
    },
    pending: () => events.length,
  };
}

void test('watchRules on a directory: reloads, keeps the last good RuleSet on a bad edit, recovers', async (t) => {
  const dir = await tempDir(t);
  await writeFile(join(dir, 'api.yaml'), rules('api', 1));
  const initial = await loadRules(dir);
  const seen = recorder();
  const close = watchRules(dir, seen.onChange, seen.onError, { initial, debounceMs: 20 });
  t.after(close);

  await replaceFile(join(dir, 'api.yaml'), rules('api', 2));
  const changed = await seen.next();
  assert.equal(changed.kind, 'change');
  const second = changed.kind === 'change' ? changed.ruleSet : null;
  assert.equal(limitOf(second), 2);

  await replaceFile(join(dir, 'api.yaml'), rules('api', 3).replace('second', 'fortnight'));
  const failed = await seen.next();
  assert.equal(failed.kind, 'error');
  if (failed.kind === 'error') {
    assert.equal(failed.error.code, RULES_ERROR_CODES.INVALID_UNIT);
    assert.equal(failed.error.message, `${join(dir, 'api.yaml')}:4:24: invalid rate limit unit 'fortnight'`);
    assert.equal(failed.lastGood, second, 'the RuleSet in force is the last good one');
  }

  // A second file in the directory that is valid does not hide the first one's error...
  await replaceFile(join(dir, 'other.yaml'), rules('other', 9));
  const stillBad = await seen.next();
  assert.equal(stillBad.kind, 'error');
  // ...and fixing the bad file brings both in.
  await replaceFile(join(dir, 'api.yaml'), rules('api', 4));
  const fixed = await seen.next();
  assert.equal(fixed.kind, 'change');
  if (fixed.kind === 'change') {
    assert.equal(limitOf(fixed.ruleSet), 4);
    assert.equal(limitOf(fixed.ruleSet, 'other'), 9);
  }
});

void test('watchRules on a file replaced by rename (as editors and ConfigMaps do); identical content is not a change', async (t) => {
  const dir = await tempDir(t);
  const file = join(dir, 'rules.yaml');
  await writeFile(file, rules('api', 1));
  const seen = recorder();
  const close = watchRules(file, seen.onChange, seen.onError, { debounceMs: 20 });
  t.after(close);
  // Without `initial`, the watcher loads at once.
  const first = await seen.next();
  assert.equal(first.kind === 'change' ? limitOf(first.ruleSet) : null, 1);

  await replaceFile(file, rules('api', 5));
  const replaced = await seen.next();
  assert.equal(replaced.kind === 'change' ? limitOf(replaced.ruleSet) : null, 5);

  // Rewriting the same bytes fires file events but no onChange; an unrelated file fires nothing.
  await replaceFile(file, rules('api', 5));
  await writeFile(join(dir, 'unrelated.txt'), 'x');
  await new Promise((resolve) => setTimeout(resolve, 200));
  assert.equal(seen.pending(), 0);
});

void test('watchRules: nothing is reported after close; a path that cannot be watched throws', async (t) => {
  const dir = await tempDir(t);
  await writeFile(join(dir, 'api.yaml'), rules('api', 1));
  const seen = recorder();
  const close = watchRules(dir, seen.onChange, seen.onError, { initial: await loadRules(dir), debounceMs: 20 });
  close();
  close();
  await replaceFile(join(dir, 'api.yaml'), rules('api', 2));
  await new Promise((resolve) => setTimeout(resolve, 150));
  assert.equal(seen.pending(), 0);
  assert.throws(
    () =>
      watchRules(
        join(dir, 'nope', 'x.yaml'),
        () => undefined,
        () => undefined,
      ),
    (e: unknown) => e instanceof RulesError && e.code === RULES_ERROR_CODES.WATCH_FAILED,
  );
});

void test('watchRules: an exception from onChange is reported, and the same sources are offered again', async (t) => {
  const dir = await tempDir(t);
  await writeFile(join(dir, 'api.yaml'), rules('api', 1));
  const initial = await loadRules(dir);
  const seen = recorder();
  let refuse = true;
  const close = watchRules(
    dir,
    (ruleSet) => {
      if (refuse) throw new Error('caller refused');
      seen.onChange(ruleSet);
    },
    seen.onError,
    { initial, debounceMs: 20 },
  );
  t.after(close);
  await replaceFile(join(dir, 'api.yaml'), rules('api', 2));
  const refused = await seen.next();
  assert.equal(refused.kind, 'error');
  if (refused.kind === 'error') {
    assert.equal(refused.error.code, RULES_ERROR_CODES.INTERNAL);
    assert.equal(refused.lastGood, initial);
  }
  refuse = false;
  await replaceFile(join(dir, 'api.yaml'), rules('api', 2));
  const taken = await seen.next();
  assert.equal(taken.kind === 'change' ? limitOf(taken.ruleSet) : null, 2);
});
