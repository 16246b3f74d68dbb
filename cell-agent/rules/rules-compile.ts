// Compiles parsed rules files into an immutable RuleSet: per domain a tree whose levels correspond to
// the entries of a request descriptor (level i matches entry i). Each level holds three indexes, in
// the order rules-match.ts consults them (docs/envoy-ratelimit-rules.md §2):
//
//   exact     key → value → node     a descriptor with a literal value
//   wildcards key → [node, ...]      a descriptor whose value contains `*`, in YAML order, each with
//                                    its precompiled glob (rules-glob.ts)
//   keyOnly   key → node             a descriptor without a value (counted per distinct request value)
//
// envoyproxy/ratelimit keys its maps by the string `key + "_" + value`. We index by key, then value,
// so that matching cannot confuse key `a_b` with key `a` and a value starting `b_` (its wildcard test
// runs on the concatenation and can); but the duplicate check stays on the composite string, exactly
// as there — key `a_b` value `c` next to key `a` value `b_c` is `duplicate descriptor composite key
// 'domain.a_b_c'` — which also keeps rule ids (RuleNode.id) unique within a level.
//
// All of envoyproxy/ratelimit's load-time checks happen here, in its order per descriptor (empty
// key, duplicate, unit / unlimited, replaces, share_threshold), followed by ours (`global`), so a
// RulesFile built in code is held to the same rules as one parsed from YAML.
//
// Global rules, across the whole rule set (checkGlobalRules): the agent keeps ONE bucket per quota
// key (`tenant/<value>`), whatever domain, file or rule path reaches it, and every global rule's
// value names a tenant. A rule set that would need that one bucket enforced differently depending
// on the path is refused, naming the file and the rule:
//   - `quota_mode` on a global rule: another descriptor's verdict could overrule the quota;
//   - a global rule nested under another global rule: one descriptor would charge two tenants;
//   - `shadow_mode` on some global rules and not on others: one tenant quota enforced on one path
//     and only observed on another.
import { RULES_ERROR_CODES, RulesError } from './rules-errors.js';
import type { SourcePos } from './rules-errors.js';
import { compileGlob, isGlobPattern } from './rules-glob.js';
import { escapeKeyPart } from './rules-match.js';
import type { GlobMatcher } from './rules-glob.js';
import { MAX_WINDOW_NS } from '../buckets/gcra.js';
import { RATE_LIMIT_UNITS, MAX_RULES_DEPTH, checkGlobalDescriptor, parseRateLimitUnit } from './rules-schema.js';
import type { JsonObject, RateLimitUnit, RulesDescriptor, RulesFile } from './rules-schema.js';

// ---- The compiled shape -------------------------------------------------------------------------

/** What a matched rule limits to. */
export type RuleLimit =
  /** `rate_limit: {unit, requests_per_unit}`; requestsPerUnit 0 means every request is over the limit.
   * `burst` (ours, only when given): the bucket depth instead of requests_per_unit. */
  | {
      readonly kind: 'rate';
      readonly requestsPerUnit: number;
      readonly unit: RateLimitUnit;
      readonly unitSeconds: number;
      readonly burst?: number;
    }
  /** `rate_limit: {unlimited: true}`: always OK, never counted. */
  | { readonly kind: 'unlimited' }
  /** `global: true`: the limit is a quota leased from the coordinator (for key `tenant`, the tier's). */
  | { readonly kind: 'global' };

/** How a node is matched against a request entry. */
export type RuleNodeKind = 'exact' | 'wildcard' | 'key';

export interface RuleLevel {
  readonly exact: ReadonlyMap<string, ReadonlyMap<string, RuleNode>>;
  readonly wildcards: ReadonlyMap<string, readonly RuleNode[]>;
  readonly keyOnly: ReadonlyMap<string, RuleNode>;
  /** Number of nodes at this level. */
  readonly size: number;
}

export interface RuleNode {
  /**
   * Stable id, envoyproxy/ratelimit's stats key: `domain.key[_value].key2[_value2]…` with the config's
   * values (a wildcard's pattern, nothing for a key-only node), e.g. `api.tenant.remote_address`.
   */
  readonly id: string;
  readonly domain: string;
  /** The index of the request entry this node matches (0 for a top-level descriptor). */
  readonly depth: number;
  readonly key: string;
  /** The literal value or the wildcard pattern; null for a key-only node. */
  readonly value: string | null;
  readonly kind: RuleNodeKind;
  readonly matcher: GlobMatcher | null;
  /** null: no limit of its own (a branch, or "effectively whitelisted"). */
  readonly limit: RuleLimit | null;
  /** rate_limit.name, or null. */
  readonly name: string | null;
  readonly replaces: readonly string[];
  readonly shadowMode: boolean;
  readonly detailedMetric: boolean;
  readonly valueToMetric: boolean;
  readonly shareThreshold: boolean;
  readonly quotaMode: boolean;
  readonly global: boolean;
  readonly metadata: JsonObject | null;
  /**
   * Whether the stats key uses request values: detailed_metric here, or value_to_metric on a non-exact node of the
   * path.
   */
  readonly metricKeyFromRequest: boolean;
  /**
   * This node's part of a bucket key before the request's value (rules-match.ts's format): at depth 0
   * `domain|key=` (`~` for a share_threshold wildcard), deeper `|key=`, escaped. The same for every
   * request: the key hash of the hot path keeps its state after a depth-0 head.
   */
  readonly keyHead: string;
  readonly children: RuleLevel;
  readonly file: string;
  readonly pos: SourcePos | undefined;
}

export interface RuleDomain {
  readonly domain: string;
  readonly root: RuleLevel;
  /** The files that contributed descriptors (more than one only with mergeDomains). */
  readonly files: readonly string[];
}

export interface RuleSet {
  readonly domains: ReadonlyMap<string, RuleDomain>;
  /** The compiled files, in the order given. */
  readonly files: readonly string[];
  /** Every node, file by file, depth first in YAML order. */
  readonly rules: readonly RuleNode[];
  /** An opaque digest of the sources when the loader supplied one (rules-load.ts), else null. */
  readonly fingerprint: string | null;
  /** Compiled with CompileOptions.mergeDomains (a worker recompiling the sources must do the same). */
  readonly mergeDomains: boolean;
}

export interface CompileOptions {
  /**
   * Merge files that name the same domain instead of rejecting them (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG).
   * Default false.
   */
  readonly mergeDomains?: boolean | undefined;
  /** Stored as RuleSet.fingerprint. */
  readonly fingerprint?: string | undefined;
}

// ---- Immutable maps -----------------------------------------------------------------------------

/** A Map whose contents are fixed at construction: set, delete and clear throw. */
class ImmutableMap<K, V> extends Map<K, V> {
  constructor(entries: Iterable<readonly [K, V]>) {
    super();
    for (const [k, v] of entries) super.set(k, v);
  }

  override set(_key: K, _value: V): this {
    throw new TypeError('a compiled RuleSet is immutable');
  }

  override delete(_key: K): boolean {
    throw new TypeError('a compiled RuleSet is immutable');
  }

  override clear(): void {
    throw new TypeError('a compiled RuleSet is immutable');
  }
}

// ---- Compile ------------------------------------------------------------------------------------

/** Compiles files, in order, into one RuleSet. Throws RulesError naming the file at fault. */
export function compileRules(files: readonly RulesFile[], options: CompileOptions = {}): RuleSet {
  const domains = new Map<string, { root: LevelBuilder; files: string[] }>();
  const rules: RuleNode[] = [];
  const finish: (() => void)[] = [];
  for (const rulesFile of files) {
    const { file, domain } = rulesFile;
    if (domain === '') {
      throw new RulesError(RULES_ERROR_CODES.EMPTY_DOMAIN, file, 'config file cannot have empty domain', rulesFile.pos);
    }
    let target = domains.get(domain);
    if (target !== undefined) {
      if (options.mergeDomains !== true) {
        throw new RulesError(
          RULES_ERROR_CODES.DUPLICATE_DOMAIN,
          file,
          `duplicate domain '${domain}' in config file`,
          rulesFile.pos,
        );
      }
      if (!target.files.includes(file)) target.files.push(file);
    } else {
      target = { root: newLevel(), files: [file] };
      domains.set(domain, target);
    }
    loadDescriptors(target.root, rulesFile.descriptors, {
      file,
      domain,
      parentId: domain,
      depth: 0,
      pathValueToMetric: false,
      rules,
      finish,
    });
  }
  // Levels are sealed only once every file has been loaded, because merged domains add to them.
  for (const seal of finish) seal();
  checkGlobalRules(rules);
  const sealedDomains = new Map<string, RuleDomain>();
  for (const [domain, { root, files: domainFiles }] of domains) {
    sealedDomains.set(domain, Object.freeze({ domain, root: root.sealed(), files: Object.freeze([...domainFiles]) }));
  }
  return Object.freeze({
    domains: new ImmutableMap(sealedDomains),
    files: Object.freeze(files.map((f) => f.file)),
    rules: Object.freeze(rules),
    fingerprint: options.fingerprint ?? null,
    mergeDomains: options.mergeDomains === true,
  });
}

interface LoadContext {
  readonly file: string;
  readonly domain: string;
  readonly parentId: string;
  readonly depth: number;
  readonly pathValueToMetric: boolean;
  readonly rules: RuleNode[];
  readonly finish: (() => void)[];
}

/** A level while it is being filled; `sealed()` returns the frozen view (the same object every time). */
interface LevelBuilder {
  readonly exact: Map<string, Map<string, RuleNode>>;
  readonly wildcards: Map<string, RuleNode[]>;
  readonly keyOnly: Map<string, RuleNode>;
  /** envoyproxy/ratelimit's `key` / `key_value` strings of this level, for its duplicate check. */
  readonly composites: Set<string>;
  readonly sealed: () => RuleLevel;
}

function loadDescriptors(level: LevelBuilder, descriptors: readonly RulesDescriptor[], ctx: LoadContext): void {
  if (descriptors.length > 0 && ctx.depth >= MAX_RULES_DEPTH) {
    throw new RulesError(
      RULES_ERROR_CODES.BOUND_EXCEEDED,
      ctx.file,
      `descriptors are nested deeper than ${MAX_RULES_DEPTH} levels`,
      descriptors[0]?.pos,
    );
  }
  for (const descriptor of descriptors) {
    const { file } = ctx;
    const { key, value } = descriptor;
    if (key === '') throw new RulesError(RULES_ERROR_CODES.EMPTY_KEY, file, 'descriptor has empty key', descriptor.pos);

    const compositeKey = value === '' ? key : `${key}_${value}`;
    const id = `${ctx.parentId}.${compositeKey}`;
    const kind: RuleNodeKind = value === '' ? 'key' : isGlobPattern(value) ? 'wildcard' : 'exact';
    if (level.composites.has(compositeKey)) {
      throw new RulesError(
        RULES_ERROR_CODES.DUPLICATE_KEY,
        file,
        `duplicate descriptor composite key '${id}'`,
        descriptor.pos,
      );
    }

    let limit: RuleLimit | null = null;
    let name: string | null = null;
    let replaces: readonly string[] = [];
    const rateLimit = descriptor.rateLimit;
    if (rateLimit !== null) {
      const unit = parseRateLimitUnit(rateLimit.unit);
      if (rateLimit.unlimited) {
        // envoyproxy/ratelimit only rejects a *valid* unit here; any unit next to unlimited is an error for us.
        if (rateLimit.unit !== '') {
          throw new RulesError(
            RULES_ERROR_CODES.UNLIMITED_WITH_UNIT,
            file,
            'should not specify rate limit unit when unlimited',
            rateLimit.unitPos ?? rateLimit.pos,
          );
        }
        if (rateLimit.burst !== undefined) {
          throw new RulesError(
            RULES_ERROR_CODES.UNLIMITED_WITH_UNIT,
            file,
            'should not specify burst when unlimited',
            rateLimit.pos,
          );
        }
        limit = Object.freeze({ kind: 'unlimited' });
      } else if (unit === null) {
        throw new RulesError(
          RULES_ERROR_CODES.INVALID_UNIT,
          file,
          `invalid rate limit unit '${rateLimit.unit}'`,
          rateLimit.unitPos ?? rateLimit.pos,
        );
      } else {
        const base = {
          kind: 'rate',
          requestsPerUnit: rateLimit.requestsPerUnit,
          unit,
          unitSeconds: RATE_LIMIT_UNITS[unit].seconds,
        } as const;
        if (rateLimit.burst !== undefined && rateLimit.requestsPerUnit > 0) {
          // The bucket's window T·burst must fit the table's bound (gcra.ts MAX_WINDOW_NS).
          const intervalNs =
            (BigInt(RATE_LIMIT_UNITS[unit].seconds) * 1_000_000_000n + BigInt(rateLimit.requestsPerUnit) - 1n) /
            BigInt(rateLimit.requestsPerUnit);
          if (intervalNs * BigInt(rateLimit.burst) > MAX_WINDOW_NS) {
            throw new RulesError(
              RULES_ERROR_CODES.BOUND_EXCEEDED,
              file,
              `burst ${rateLimit.burst} at ${rateLimit.requestsPerUnit} per ${unit.toLowerCase()} takes longer ` +
                `than ${MAX_WINDOW_NS / 1_000_000_000n} s to refill`,
              rateLimit.pos,
            );
          }
        }
        limit = Object.freeze(rateLimit.burst === undefined ? base : { ...base, burst: rateLimit.burst });
      }
      for (const replace of rateLimit.replaces) {
        if (replace.name === '') {
          throw new RulesError(
            RULES_ERROR_CODES.EMPTY_REPLACES,
            file,
            'should not have an empty replaces entry',
            replace.pos,
          );
        }
        if (replace.name === rateLimit.name) {
          throw new RulesError(
            RULES_ERROR_CODES.REPLACES_SELF,
            file,
            'replaces should not contain name of same descriptor',
            replace.pos,
          );
        }
      }
      name = rateLimit.name === '' ? null : rateLimit.name;
      replaces = Object.freeze(rateLimit.replaces.map((r) => r.name));
    }

    if (descriptor.shareThreshold && kind !== 'wildcard') {
      throw new RulesError(
        RULES_ERROR_CODES.SHARE_THRESHOLD_WITHOUT_WILDCARD,
        file,
        `share_threshold can only be used with wildcard values (containing '*'), but found key '${compositeKey}'`,
        descriptor.pos,
      );
    }
    checkGlobalDescriptor(descriptor, file);
    if (descriptor.global) limit = GLOBAL_LIMIT;

    const pathValueToMetric = ctx.pathValueToMetric || (descriptor.valueToMetric && kind !== 'exact');
    const children = newLevel();
    const node: Mutable<RuleNode> = {
      id,
      domain: ctx.domain,
      depth: ctx.depth,
      key,
      value: kind === 'key' ? null : value,
      kind,
      matcher: kind === 'wildcard' ? compileGlob(value) : null,
      limit,
      name,
      replaces,
      shadowMode: descriptor.shadowMode,
      detailedMetric: descriptor.detailedMetric,
      valueToMetric: descriptor.valueToMetric,
      shareThreshold: descriptor.shareThreshold,
      quotaMode: descriptor.quotaMode,
      global: descriptor.global,
      metadata: descriptor.metadata,
      metricKeyFromRequest: descriptor.detailedMetric || pathValueToMetric,
      keyHead:
        (ctx.depth === 0 ? escapeKeyPart(ctx.domain) : '') +
        `|${escapeKeyPart(key)}${kind === 'wildcard' && descriptor.shareThreshold ? '~' : '='}`,
      children: EMPTY_LEVEL, // replaced by the sealed level once every file is loaded
      file,
      pos: descriptor.pos,
    };
    level.composites.add(compositeKey);
    insert(level, node);
    ctx.rules.push(node);
    ctx.finish.push(() => {
      node.children = children.sealed();
      Object.freeze(node);
    });
    loadDescriptors(children, descriptor.descriptors, {
      ...ctx,
      parentId: id,
      depth: ctx.depth + 1,
      pathValueToMetric,
    });
  }
}

type Mutable<T> = { -readonly [P in keyof T]: T[P] };

/** "rule 'api.tenant' (a.yaml:3:5)" */
function describeRule(node: RuleNode): string {
  return `rule '${node.id}' (${node.file}${node.pos === undefined ? '' : `:${node.pos.line}:${node.pos.column}`})`;
}

/** The rule-set-wide checks of global rules (see the header). */
function checkGlobalRules(rules: readonly RuleNode[]): void {
  let first: RuleNode | null = null;
  for (const node of rules) {
    if (!node.global) continue;
    if (node.quotaMode) {
      throw new RulesError(
        RULES_ERROR_CODES.GLOBAL_QUOTA_MODE,
        node.file,
        `rule '${node.id}' has global: true and quota_mode: true; a global quota is enforced on every path, ` +
          'and quota_mode would let other descriptors overrule it, so remove quota_mode',
        node.pos,
      );
    }
    for (const child of globalDescendants(node)) {
      throw new RulesError(
        RULES_ERROR_CODES.GLOBAL_NESTED,
        child.file,
        `rule '${child.id}' has global: true under the global ${describeRule(node)}; every global rule's value ` +
          'names a tenant quota, so one descriptor would be charged to two tenants: keep one global rule per path',
        child.pos,
      );
    }
    if (first === null) first = node;
    else if (node.shadowMode !== first.shadowMode) {
      throw new RulesError(
        RULES_ERROR_CODES.GLOBAL_SHADOW_MIXED,
        node.file,
        `rule '${node.id}' has global: true with shadow_mode ${node.shadowMode}, but the global ` +
          `${describeRule(first)} has shadow_mode ${first.shadowMode}; both can reach the same tenant quota, ` +
          'whose one bucket per cell cannot be enforced on one path and only observed on the other: give every ' +
          'global rule the same shadow_mode',
        node.pos,
      );
    }
  }
}

/** The global rules below `node` (depth first). */
function* globalDescendants(node: RuleNode): Generator<RuleNode> {
  const level = node.children;
  const nodes: RuleNode[] = [...level.keyOnly.values()];
  for (const byValue of level.exact.values()) nodes.push(...byValue.values());
  for (const list of level.wildcards.values()) nodes.push(...list);
  for (const child of nodes) {
    if (child.global) yield child;
    yield* globalDescendants(child);
  }
}

const GLOBAL_LIMIT: RuleLimit = Object.freeze({ kind: 'global' });

function insert(level: LevelBuilder, node: RuleNode): void {
  switch (node.kind) {
    case 'exact': {
      let byValue = level.exact.get(node.key);
      if (byValue === undefined) level.exact.set(node.key, (byValue = new Map<string, RuleNode>()));
      byValue.set(node.value ?? '', node);
      return;
    }
    case 'wildcard': {
      const list = level.wildcards.get(node.key);
      if (list === undefined) level.wildcards.set(node.key, [node]);
      else list.push(node);
      return;
    }
    case 'key':
      level.keyOnly.set(node.key, node);
      return;
  }
}

const EMPTY_LEVEL: RuleLevel = Object.freeze({
  exact: new ImmutableMap<string, ReadonlyMap<string, RuleNode>>([]),
  wildcards: new ImmutableMap<string, readonly RuleNode[]>([]),
  keyOnly: new ImmutableMap<string, RuleNode>([]),
  size: 0,
});

function newLevel(): LevelBuilder {
  const exact = new Map<string, Map<string, RuleNode>>();
  const wildcards = new Map<string, RuleNode[]>();
  const keyOnly = new Map<string, RuleNode>();
  let sealed: RuleLevel | null = null;
  return {
    exact,
    wildcards,
    keyOnly,
    composites: new Set(),
    sealed: () => {
      if (sealed !== null) return sealed;
      let size = keyOnly.size;
      for (const byValue of exact.values()) size += byValue.size;
      for (const list of wildcards.values()) size += list.length;
      sealed =
        size === 0
          ? EMPTY_LEVEL
          : Object.freeze({
              exact: new ImmutableMap([...exact].map(([k, byValue]) => [k, new ImmutableMap(byValue)] as const)),
              wildcards: new ImmutableMap([...wildcards].map(([k, list]) => [k, Object.freeze([...list])] as const)),
              keyOnly: new ImmutableMap(keyOnly),
              size,
            });
      return sealed;
    },
  };
}
