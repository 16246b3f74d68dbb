// Matching a request descriptor against a compiled RuleSet, exactly as envoyproxy/ratelimit's
// GetLimit does (docs/envoy-ratelimit-rules.md §2), plus our `global: true` rules.
//
// A request descriptor is a list of entries [{key, value}, ...]. Entry i is matched against level i
// of the domain's tree; at each level, in this order:
//   1. the exact node for (key, value);
//   2. else the wildcard nodes for key, in YAML order, the first whose glob matches value;
//   3. else the key-only node for key.
// No match at a level ends the walk with "no limit". There is no backtracking: once a level has
// chosen a node, a sibling that would have matched the deeper entries is never tried. A limit is
// returned only when the walk consumed every entry and the node matched at the last entry has a
// limit (rate_limit, unlimited, or global); a limit on a shallower node is not used for a longer
// request ("request depth does not match config depth"), and a node without children stops a
// longer request with no limit. An unknown domain or an empty descriptor → no limit.
//
// Counting (bucketKey): one counter per domain and per request entry values, as envoyproxy/ratelimit
// builds its cache key from the *request's* values — a key-only or wildcard node is counted per
// distinct value, except that a wildcard node with share_threshold counts every value it matches in
// one counter, keyed by its pattern. Format, with `\`, `|`, `=` and `~` escaped by a backslash:
//
//   api|tenant=acme|remote_address=1.2.3.4      per value
//   api|path~/files/*                           share_threshold: the pattern, after `~`
//
// The window, the unit and the rule's id are not part of the key: a caller that keeps counters
// across a reload which changes a limit decides itself whether to reset them.
//
// Global rules and "every level it belongs to": envoyproxy/ratelimit applies only the node matched at
// the last entry, so with the example in docs/interfaces.md
//
//   - key: tenant
//     global: true
//     descriptors:
//       - key: remote_address
//         rate_limit: {unit: second, requests_per_unit: 50}
//
// [tenant=acme] matches the global rule and [tenant=acme, remote_address=1.2.3.4] matches only the
// nested local rule. The quota model says a request must pass every level it belongs to, so the
// tenant's global quota must apply to the deeper request too. matchWithAncestors therefore returns,
// besides the deepest match, every `global: true` node the walk passed through on the way (each with
// its own bucket key: the domain and the entries up to that node). Only global nodes are added this
// way; a shallower local rate_limit keeps envoyproxy/ratelimit's depth rule. Envoy usually sends both
// descriptors in one request ([tenant] and [tenant, remote_address]); a request must then take one
// token from the tenant's quota, not two, so matchRequest removes an ancestor whose bucket key is
// already a descriptor's own match, or an earlier ancestor.
import type { RuleDomain, RuleLevel, RuleLimit, RuleNode, RuleSet } from './rules-compile.js';
import { MAX_RULES_DEPTH } from './rules-schema.js';

export interface DescriptorEntry {
  readonly key: string;
  readonly value: string;
}

/** For a global rule: the request entry whose value selects the quota (for key `tenant`, the tenant id). */
export interface GlobalTarget {
  readonly entryIndex: number;
  readonly key: string;
  readonly value: string;
}

export interface RuleMatch {
  /** The matched node of the compiled tree. */
  readonly rule: RuleNode;
  /** The rule's stable id, e.g. `api.tenant.remote_address` (see RuleNode.id). */
  readonly ruleId: string;
  readonly domain: string;
  /** The counter this request descriptor is counted in (see the header comment). */
  readonly bucketKey: string;
  readonly limit: RuleLimit;
  /** Set iff limit.kind === 'global'. */
  readonly global: GlobalTarget | null;
  readonly name: string | null;
  readonly replaces: readonly string[];
  readonly shadowMode: boolean;
  readonly detailedMetric: boolean;
  readonly quotaMode: boolean;
  /** envoyproxy/ratelimit's stats key: the rule id, or with request values (detailed_metric, value_to_metric). */
  readonly metricKey: string;
}

export interface MatchWithAncestors {
  /** What matchDescriptor returns. */
  readonly match: RuleMatch | null;
  /** The `global: true` nodes passed on the way, outermost first, not including `match` itself. */
  readonly ancestors: readonly RuleMatch[];
}

export interface RequestMatches {
  /** One per request descriptor, in order, after applyReplaces. */
  readonly matches: readonly (RuleMatch | null)[];
  /** Ancestor global rules not already counted by a descriptor's own match, each once. */
  readonly extraGlobals: readonly { readonly descriptorIndex: number; readonly match: RuleMatch }[];
}

/** The rule that applies to one request descriptor, or null for "no limit" (§2 of the reference). */
export function matchDescriptor(
  ruleSet: RuleSet,
  domain: string,
  entries: readonly DescriptorEntry[],
): RuleMatch | null {
  const reached = walk(ruleSet, domain, entries);
  return reached === entries.length && reached > 0 ? deepestMatch(domain, entries, reached) : null;
}

/** matchDescriptor plus every global rule matched on the way (see the header comment). */
export function matchWithAncestors(
  ruleSet: RuleSet,
  domain: string,
  entries: readonly DescriptorEntry[],
): MatchWithAncestors {
  const reached = walk(ruleSet, domain, entries);
  const match = reached === entries.length && reached > 0 ? deepestMatch(domain, entries, reached) : null;
  const upTo = match === null ? reached : reached - 1;
  let ancestors: RuleMatch[] | null = null;
  for (let i = 0; i < upTo; i += 1) {
    if (scratch[i]?.global === true) (ancestors ??= []).push(buildMatch(domain, entries, i + 1));
  }
  return { match, ancestors: ancestors ?? NONE };
}

/**
 * All descriptors of one request: their matches after applyReplaces, and the ancestor global rules
 * to check once each in addition.
 */
export function matchRequest(
  ruleSet: RuleSet,
  domain: string,
  descriptors: readonly (readonly DescriptorEntry[])[],
): RequestMatches {
  const all = descriptors.map((entries) => matchWithAncestors(ruleSet, domain, entries));
  const matches = applyReplaces(all.map((m) => m.match));
  const counted = new Set<string>();
  for (const m of matches) if (m !== null && m.limit.kind === 'global') counted.add(m.bucketKey);
  const extraGlobals: { descriptorIndex: number; match: RuleMatch }[] = [];
  all.forEach(({ ancestors }, descriptorIndex) => {
    for (const match of ancestors) {
      if (counted.has(match.bucketKey)) continue;
      counted.add(match.bucketKey);
      extraGlobals.push({ descriptorIndex, match });
    }
  });
  return { matches, extraGlobals };
}

/**
 * envoyproxy/ratelimit's `replaces` (§3): every matched limit whose name appears in the `replaces` of
 * any matched limit is dropped (null: "no limit" for that descriptor). Returns a new array, same order.
 */
export function applyReplaces(matches: readonly (RuleMatch | null)[]): (RuleMatch | null)[] {
  let replaced: Set<string> | null = null;
  for (const m of matches) {
    if (m === null) continue;
    for (const name of m.replaces) (replaced ??= new Set()).add(name);
  }
  if (replaced === null) return [...matches];
  const names = replaced;
  return matches.map((m) => (m !== null && m.name !== null && names.has(m.name) ? null : m));
}

/**
 * A bucket key written in parts: raw text, and text escaped as the key format escapes it. The
 * string builder below writes RuleMatch.bucketKey; the bucket table's KeyHashStream hashes the same
 * characters without building the string (the decision's hot path).
 */
export interface KeySink {
  raw(part: string): void;
  escaped(part: string): void;
  /** raw(part) for the first part of a key, a rule's constant head (RuleNode.keyHead): a hash may memoize it. */
  head(part: string): void;
}

class StringKeySink implements KeySink {
  text = '';
  raw(part: string): void {
    this.text += part;
  }
  escaped(part: string): void {
    this.text += escapeKeyPart(part);
  }
  head(part: string): void {
    this.text += part;
  }
}

/** One buildMatch at a time (it never calls out): one builder serves every call. */
const stringSink = new StringKeySink();

/** The bucket key of the walk in scratch over entries[0 .. levels - 1] (format: the header comment). */
function writeBucketKey(sink: KeySink, entries: readonly DescriptorEntry[], levels: number): void {
  // The walk matched each entry on its key (node.key === entry.key) in `domain`: a node's keyHead is
  // `domain|key=` at depth 0, `|key=` deeper (`~` for a share_threshold wildcard), escaped.
  for (let i = 0; i < levels; i += 1) {
    const entry = entries[i] as DescriptorEntry;
    const at = scratch[i] as RuleNode;
    if (i === 0) sink.head(at.keyHead);
    else sink.raw(at.keyHead);
    sink.escaped(at.kind === 'wildcard' && at.shareThreshold ? (at.value ?? '') : entry.value);
  }
}

/**
 * The decision's fast path: the rule of a descriptor that is counted in exactly one local bucket —
 * its deepest match is a plain `rate_limit` (no `replaces`, not shadow or quota mode) and the walk
 * passed no `global: true` rule. Writes that bucket's key (RuleMatch.bucketKey, character for
 * character) to `sink` and returns the rule; null for every other descriptor (then nothing was
 * written: use matchWithAncestors). Allocates nothing.
 */
export function matchLocalRate(
  ruleSet: RuleSet,
  domain: string,
  entries: readonly DescriptorEntry[],
  sink: KeySink,
): RuleNode | null {
  const node = matchAlone(ruleSet, domain, entries, 'rate');
  if (node !== null) writeBucketKey(sink, entries, entries.length);
  return node;
}

/**
 * The decision's global fast path: the `global: true` rule a descriptor is counted in alone — its
 * deepest match is that rule (no `replaces`, not shadow or quota mode) and the walk passed no other
 * global rule (each would be a level of its own). Its tenant is the last entry's value (the match's
 * RuleMatch.global.value). Null for every other descriptor: use matchWithAncestors. Allocates nothing.
 */
export function matchGlobalAlone(
  ruleSet: RuleSet,
  domain: string,
  entries: readonly DescriptorEntry[],
): RuleNode | null {
  return matchAlone(ruleSet, domain, entries, 'global');
}

/**
 * The rule a descriptor's every entry walked to, when it is of `kind`, is counted alone (no
 * `replaces`, not shadow or quota mode) and no `global: true` rule was passed on the way (each would
 * be a level of its own); else null.
 */
function matchAlone(
  ruleSet: RuleSet,
  domain: string,
  entries: readonly DescriptorEntry[],
  kind: 'rate' | 'global',
): RuleNode | null {
  const reached = walk(ruleSet, domain, entries);
  if (reached === 0 || reached !== entries.length) return null;
  const node = scratch[reached - 1] as RuleNode;
  const limit = node.limit;
  if (limit === null || limit.kind !== kind || node.replaces.length > 0 || node.shadowMode || node.quotaMode)
    return null;
  for (let i = 0; i < reached - 1; i += 1) if ((scratch[i] as RuleNode).global) return null;
  return node;
}

/** RuleMatch.bucketKey of the descriptor matchLocalRate last accepted (valid until the next match). */
export function lastLocalBucketKey(domain: string, entries: readonly DescriptorEntry[]): string {
  stringSink.text = '';
  writeBucketKey(stringSink, entries, entries.length);
  return stringSink.text;
}

/** RuleMatch.bucketKey of a descriptor matchLocalRate accepts (walked again: for refusals, off the hot path). */
export function localBucketKey(ruleSet: RuleSet, domain: string, entries: readonly DescriptorEntry[]): string {
  const reached = walk(ruleSet, domain, entries);
  stringSink.text = '';
  writeBucketKey(stringSink, entries, reached);
  return stringSink.text;
}

// ---- The walk -----------------------------------------------------------------------------------

const NONE: readonly RuleMatch[] = Object.freeze([]);

/**
 * The nodes matched by the last walk, level by level. JavaScript runs one walk at a time and a walk
 * never calls out, so one module-level array serves every call without allocating.
 */
const scratch: (RuleNode | undefined)[] = new Array<RuleNode | undefined>(MAX_RULES_DEPTH).fill(undefined);

/** What one level holds for one entry key: its literal values' nodes, its wildcards, its key-only node. */
interface KeyNodes {
  readonly exact: ReadonlyMap<string, RuleNode> | undefined;
  readonly wildcards: readonly RuleNode[] | undefined;
  readonly keyOnly: RuleNode | undefined;
}

// The walk's memo (a decision meets the same rule set, domain and keys request after request): the
// domain last looked up, and the KeyNodes of the last few (level, key) pairs, so that matching an
// entry is one lookup (its value among the exact nodes, when the key has any) instead of four
// (domain, exact, wildcards, key-only). A compiled RuleSet is immutable (its maps throw on writes; a
// reload compiles a new one), so a memo entry, found by the identity of the set or level, is never
// stale; it holds at most MEMO_KEYS levels of a replaced rule set alive until overwritten.
const MEMO_KEYS = 4;
let memoRuleSet: RuleSet | null = null;
let memoDomain = '';
let memoRuleDomain: RuleDomain | undefined;
const memoLevels: (RuleLevel | null)[] = new Array<RuleLevel | null>(MEMO_KEYS).fill(null);
const memoKeys: string[] = new Array<string>(MEMO_KEYS).fill('');
const memoNodes: (KeyNodes | null)[] = new Array<KeyNodes | null>(MEMO_KEYS).fill(null);
let memoNext = 0;

function ruleDomainOf(ruleSet: RuleSet, domain: string): RuleDomain | undefined {
  if (ruleSet === memoRuleSet && domain === memoDomain) return memoRuleDomain;
  const found = ruleSet.domains.get(domain);
  memoRuleSet = ruleSet;
  memoDomain = domain;
  memoRuleDomain = found;
  return found;
}

function keyNodesOf(level: RuleLevel, key: string): KeyNodes {
  for (let i = 0; i < MEMO_KEYS; i += 1) {
    if (memoLevels[i] === level && memoKeys[i] === key) return memoNodes[i] as KeyNodes;
  }
  const nodes: KeyNodes = {
    exact: level.exact.get(key),
    wildcards: level.wildcards.get(key),
    keyOnly: level.keyOnly.get(key),
  };
  const i = memoNext;
  memoNext = (i + 1) % MEMO_KEYS;
  memoLevels[i] = level;
  memoKeys[i] = key;
  memoNodes[i] = nodes;
  return nodes;
}

/** Walks the tree; returns how many entries were matched (scratch[0..n-1] holds the nodes). */
function walk(ruleSet: RuleSet, domain: string, entries: readonly DescriptorEntry[]): number {
  const ruleDomain = ruleDomainOf(ruleSet, domain);
  if (ruleDomain === undefined) return 0;
  // A node at the deepest allowed level has no children, so the walk never writes past scratch's end.
  let level = ruleDomain.root;
  for (let i = 0; i < entries.length; i += 1) {
    const entry = entries[i] as DescriptorEntry;
    const byKey = keyNodesOf(level, entry.key);
    let node = byKey.exact?.get(entry.value);
    if (node === undefined) {
      const wildcards = byKey.wildcards;
      if (wildcards !== undefined) {
        for (const candidate of wildcards) {
          if (candidate.matcher?.test(entry.value) === true) {
            node = candidate;
            break;
          }
        }
      }
      node ??= byKey.keyOnly;
    }
    if (node === undefined) return i;
    scratch[i] = node;
    if (i === entries.length - 1 || node.children.size === 0) return i + 1;
    level = node.children;
  }
  return entries.length;
}

function deepestMatch(domain: string, entries: readonly DescriptorEntry[], reached: number): RuleMatch | null {
  const node = scratch[reached - 1];
  return node === undefined || node.limit === null ? null : buildMatch(domain, entries, reached);
}

/** The match for the node scratch[levels - 1], counted over entries[0 .. levels - 1]. */
function buildMatch(domain: string, entries: readonly DescriptorEntry[], levels: number): RuleMatch {
  const node = scratch[levels - 1] as RuleNode;
  const limit = node.limit as RuleLimit;
  stringSink.text = '';
  writeBucketKey(stringSink, entries, levels);
  const bucketKey = stringSink.text;
  const last = entries[levels - 1] as DescriptorEntry;
  return {
    rule: node,
    ruleId: node.id,
    domain,
    bucketKey,
    limit,
    global: limit.kind === 'global' ? { entryIndex: levels - 1, key: last.key, value: last.value } : null,
    name: node.name,
    replaces: node.replaces,
    shadowMode: node.shadowMode,
    detailedMetric: node.detailedMetric,
    quotaMode: node.quotaMode,
    metricKey: node.metricKeyFromRequest ? metricKey(domain, entries, levels, node.detailedMetric) : node.id,
  };
}

/**
 * envoyproxy/ratelimit's stats key with request values (detailed_metric on the leaf, or value_to_metric on a level).
 */
function metricKey(domain: string, entries: readonly DescriptorEntry[], levels: number, detailed: boolean): string {
  let key = domain;
  for (let i = 0; i < levels; i += 1) {
    const entry = entries[i] as DescriptorEntry;
    const at = scratch[i] as RuleNode;
    if (at.kind === 'wildcard' && at.shareThreshold) key += `.${entry.key}_${at.value ?? ''}`;
    else if (detailed) key += `.${entry.key}_${entry.value}`;
    else if (at.kind === 'exact' || !at.valueToMetric)
      key += `.${at.value === null ? at.key : `${at.key}_${at.value}`}`;
    else key += entry.value === '' ? `.${entry.key}` : `.${entry.key}_${entry.value}`;
  }
  return key;
}

const KEY_SPECIAL = /[\\|=~]/;
const KEY_SPECIAL_ALL = /[\\|=~]/g;

/** The key format's escaping of a part (`\\`, `|`, `=`, `~` get a backslash). */
export function escapeKeyPart(text: string): string {
  return KEY_SPECIAL.test(text) ? text.replace(KEY_SPECIAL_ALL, '\\$&') : text;
}
