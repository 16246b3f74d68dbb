// Rules as a snapshot that can cross to worker threads. A compiled RuleSet holds functions (glob
// matchers) and cannot be posted to a worker, so the main thread loads and validates the rules with
// cell-agent/rules (loadRules at start, watchRules for hot reload), then re-reads the very files of
// that RuleSet and posts their texts; every worker compiles the same texts into the same rules.
//
// The re-read is checked against the RuleSet's fingerprint (the same digest loadRules computes: per
// file its path, length and bytes, in order). If a file changed between the two reads, snapshotOf
// throws RulesChangedError: the watcher then keeps its previous state and the change that caused the
// difference triggers another reload, so workers never run rules that the main thread did not
// validate.
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { compileRules } from './rules/rules-compile.js';
import type { RuleSet } from './rules/rules-compile.js';
import { parseRulesYaml } from './rules/rules-schema.js';
import { CellquotaError } from '../shared/errors.js';

export interface RulesSource {
  readonly file: string;
  readonly text: string;
}

/** Structured-cloneable: posted to the workers. */
export interface RulesSnapshot {
  readonly sources: readonly RulesSource[];
  readonly fingerprint: string;
  /** --merge-domains: compile as the main thread did. */
  readonly mergeDomains: boolean;
}

export class RulesChangedError extends CellquotaError {
  readonly code = 'RULES_CHANGED_WHILE_READING';
  constructor(message: string) {
    super(message);
    this.name = 'RulesChangedError';
  }
}

/** Re-reads the files of `ruleSet` (synchronously) into a snapshot. Throws RulesChangedError. */
export function snapshotOf(ruleSet: RuleSet): RulesSnapshot {
  const hash = createHash('sha256');
  const sources: RulesSource[] = [];
  for (const file of ruleSet.files) {
    let bytes: Buffer;
    try {
      bytes = readFileSync(file);
    } catch (error) {
      throw new RulesChangedError(
        `${file}: cannot re-read rules: ${error instanceof Error ? error.message : String(error)}`,
      );
    }
    hash.update(`${file}\0${bytes.length}\0`).update(bytes);
    sources.push({ file, text: bytes.toString('utf8').replace(/^\uFEFF/, '') });
  }
  const fingerprint = hash.digest('hex');
  if (ruleSet.fingerprint !== null && fingerprint !== ruleSet.fingerprint) {
    throw new RulesChangedError('rules files changed while they were being read');
  }
  return { sources, fingerprint, mergeDomains: ruleSet.mergeDomains };
}

/** Compiles a snapshot (in a worker). Throws RulesError. */
export function compileSnapshot(snapshot: RulesSnapshot): RuleSet {
  return compileRules(
    snapshot.sources.map((s) => parseRulesYaml(s.text, s.file)),
    { fingerprint: snapshot.fingerprint, mergeDomains: snapshot.mergeDomains },
  );
}
