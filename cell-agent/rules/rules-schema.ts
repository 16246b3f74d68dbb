// The shape of a rules file: envoyproxy/ratelimit's YAML format plus our `global: true` extension
// (see cell-agent/rules/README.md and docs/envoy-ratelimit-rules.md §1).
//
//   domain: api
//   descriptors:
//     - key: tenant
//       global: true                 # ours: the limit is the tenant's tier quota, from the coordinator
//       descriptors:
//         - key: remote_address
//           rate_limit: {unit: second, requests_per_unit: 50}
//
// This module turns YAML text (or a plain object) into a typed, position-annotated `RulesFile`. It is
// a hand walk over the `yaml` library's syntax tree rather than a zod schema, for three reasons: every
// error can carry the line and column of the offending node, the wording can stay that of
// envoyproxy/ratelimit (`config error, unknown key 'x'`), and scalar strings can keep their source
// text the way Go's yaml.v2 does for string fields (`value: 0123` is the string "0123", not 83).
//
// What is checked here: YAML syntax, key types and names (per level: a key that envoyproxy/ratelimit
// would silently ignore because it belongs to another level is an error here), value types, the
// bounds below, and the rules of `global`. What is left to rules-compile.ts: the load-time errors of
// envoyproxy/ratelimit (empty domain, duplicate domain, empty key, duplicate composite key, invalid
// unit, unlimited with a unit, bad replaces, share_threshold without `*`), so that configs built in
// code go through the same checks.
//
// YAML dialect: YAML 1.1 scalars (as Go's yaml.v2 reads them), so `shadow_mode: yes` is true. Merge
// keys (`<<`) and multiple documents in one file are rejected; anchors and aliases work, bounded by
// the descriptor and metadata counts.
import assert from 'node:assert/strict';
import { Document, LineCounter, isAlias, isMap, isScalar, isSeq, parseAllDocuments } from 'yaml';
import type { Node as YamlNode, Scalar, YAMLMap, YAMLSeq } from 'yaml';
import { RULES_ERROR_CODES, RulesError } from './rules-errors.js';
import type { SourcePos } from './rules-errors.js';

// ---- Bounds -------------------------------------------------------------------------------------

/** Deepest nesting of descriptors (a request descriptor has at most this many entries that can match). */
export const MAX_RULES_DEPTH = 8;
/** Descriptors in one file, at all levels, counting every expansion of an alias. */
export const MAX_RULES_DESCRIPTORS_PER_FILE = 10_000;
/** Size of one rules file in bytes (UTF-8). */
export const MAX_RULES_FILE_BYTES = 4 * 1024 * 1024;
/** Lengths, in UTF-16 code units. */
export const MAX_RULES_DOMAIN_LENGTH = 256;
export const MAX_RULES_KEY_LENGTH = 256;
export const MAX_RULES_VALUE_LENGTH = 1024;
export const MAX_RULES_NAME_LENGTH = 256;
/** Entries in one rate_limit's `replaces` list. */
export const MAX_RULES_REPLACES_PER_RULE = 64;
/** Nodes (maps, lists and scalars) in all `metadata` of one file, and nesting of one metadata value. */
export const MAX_RULES_METADATA_NODES_PER_FILE = 65_536;
export const MAX_RULES_METADATA_DEPTH = 16;

assert(MAX_RULES_DEPTH >= 1 && MAX_RULES_DESCRIPTORS_PER_FILE >= MAX_RULES_DEPTH);
assert(MAX_RULES_VALUE_LENGTH >= MAX_RULES_KEY_LENGTH, 'a wildcard value is at least as long as a key');
assert(MAX_RULES_FILE_BYTES <= 64 * 1024 * 1024, 'a rules file is read into memory whole');

// ---- Units --------------------------------------------------------------------------------------

/**
 * Units of `rate_limit.unit`, by the upper-cased name of Envoy's RateLimitResponse.RateLimit.Unit
 * (`proto` is that enum's number; UNKNOWN = 0 is not a unit). Seconds as envoyproxy/ratelimit counts
 * them: a month is 30 days, a year 365 days.
 */
export const RATE_LIMIT_UNITS = Object.freeze({
  SECOND: Object.freeze({ seconds: 1, proto: 1 }),
  MINUTE: Object.freeze({ seconds: 60, proto: 2 }),
  HOUR: Object.freeze({ seconds: 3_600, proto: 3 }),
  DAY: Object.freeze({ seconds: 86_400, proto: 4 }),
  MONTH: Object.freeze({ seconds: 2_592_000, proto: 5 }),
  YEAR: Object.freeze({ seconds: 31_536_000, proto: 6 }),
  WEEK: Object.freeze({ seconds: 604_800, proto: 7 }),
});
export type RateLimitUnit = keyof typeof RATE_LIMIT_UNITS;

/** `second`, `Second`, `SECOND` → 'SECOND'; anything else → null. */
export function parseRateLimitUnit(raw: string): RateLimitUnit | null {
  const upper = raw.toUpperCase();
  return Object.hasOwn(RATE_LIMIT_UNITS, upper) ? (upper as RateLimitUnit) : null;
}

/** The largest uint32: the bound of envoyproxy/ratelimit's requests_per_unit and of the RLS answer's counts. */
export const MAX_UINT32 = 4_294_967_295;

// ---- The parsed shape ---------------------------------------------------------------------------

export type JsonValue = null | boolean | number | string | readonly JsonValue[] | JsonObject;
export interface JsonObject {
  readonly [key: string]: JsonValue;
}

export interface RulesReplace {
  readonly name: string;
  readonly pos?: SourcePos | undefined;
}

export interface RulesRateLimit {
  /** As written ('' when absent); rules-compile.ts checks it against RATE_LIMIT_UNITS. */
  readonly unit: string;
  /** uint32; 0 when absent (then every request is over the limit, as in envoyproxy/ratelimit). */
  readonly requestsPerUnit: number;
  /** Ours: the bucket depth in tokens (absent: requests_per_unit, one unit's worth). */
  readonly burst?: number | undefined;
  readonly unlimited: boolean;
  /** '' when absent. */
  readonly name: string;
  readonly replaces: readonly RulesReplace[];
  readonly pos?: SourcePos | undefined;
  readonly unitPos?: SourcePos | undefined;
}

export interface RulesDescriptor {
  /** '' when absent (rules-compile.ts rejects it). */
  readonly key: string;
  /** '' when absent: a key-only descriptor. A value containing `*` is a wildcard. */
  readonly value: string;
  readonly rateLimit: RulesRateLimit | null;
  readonly descriptors: readonly RulesDescriptor[];
  readonly shadowMode: boolean;
  readonly detailedMetric: boolean;
  readonly valueToMetric: boolean;
  readonly shareThreshold: boolean;
  readonly quotaMode: boolean;
  /** Ours: a quota coordinated across cells; only on a key-only descriptor without rate_limit. */
  readonly global: boolean;
  readonly metadata: JsonObject | null;
  readonly pos?: SourcePos | undefined;
}

export interface RulesFile {
  /** The file name used in errors and in RuleSet.files. */
  readonly file: string;
  /** '' when absent (rules-compile.ts rejects it). */
  readonly domain: string;
  readonly descriptors: readonly RulesDescriptor[];
  /** Where the domain is (or the document starts). */
  readonly pos?: SourcePos | undefined;
}

// ---- Keys per level ------------------------------------------------------------------------------

const ROOT_KEYS = ['domain', 'descriptors'] as const;
const DESCRIPTOR_KEYS = [
  'key',
  'value',
  'rate_limit',
  'descriptors',
  'shadow_mode',
  'detailed_metric',
  'value_to_metric',
  'share_threshold',
  'quota_mode',
  'metadata',
  'global',
] as const;
const RATE_LIMIT_KEYS = ['unit', 'requests_per_unit', 'burst', 'unlimited', 'name', 'replaces'] as const;
const REPLACES_KEYS = ['name'] as const;
/** Every key envoyproxy/ratelimit knows (its `validKeys`) plus ours; used to word the error. */
const KNOWN_KEYS: ReadonlySet<string> = new Set<string>([...ROOT_KEYS, ...DESCRIPTOR_KEYS, ...RATE_LIMIT_KEYS]);

// ---- Entry points -------------------------------------------------------------------------------

/** Parses the text of one rules file. Throws RulesError. */
export function parseRulesYaml(text: string, file: string): RulesFile {
  if (text.length > MAX_RULES_FILE_BYTES) {
    throw new RulesError(RULES_ERROR_CODES.FILE_TOO_LARGE, file, `file is larger than ${MAX_RULES_FILE_BYTES} bytes`);
  }
  const lineCounter = new LineCounter();
  const docs = parseAllDocuments(text, { version: '1.1', lineCounter, prettyErrors: true, uniqueKeys: true });
  const list = Array.isArray(docs) ? docs : [];
  for (const doc of list) {
    const error = doc.errors[0];
    if (error !== undefined) {
      const at = error.linePos?.[0];
      const pos = at === undefined ? undefined : { line: at.line, column: at.col };
      throw new RulesError(
        RULES_ERROR_CODES.YAML_INVALID,
        file,
        `error loading config file: ${yamlErrorText(error.message)}`,
        pos,
      );
    }
  }
  if (list.length > 1) {
    const second = list[1];
    const pos = second === undefined ? undefined : toPos(lineCounter, second.range[0]);
    throw new RulesError(
      RULES_ERROR_CODES.YAML_INVALID,
      file,
      'error loading config file: more than one YAML document in a file',
      pos,
    );
  }
  const doc = list[0];
  if (doc === undefined) return Object.freeze({ file, domain: '', descriptors: Object.freeze([]) });
  return walkRoot({ file, doc, lineCounter, descriptors: 0, metadataNodes: 0 }, doc.contents);
}

/** Validates a plain object of the same shape (e.g. from JSON or built in code). Throws RulesError. */
export function parseRulesObject(value: unknown, file: string): RulesFile {
  const doc = new Document(value);
  return walkRoot({ file, doc, lineCounter: null, descriptors: 0, metadataNodes: 0 }, doc.contents);
}

/**
 * The rules of our `global: true` extension, shared by the walker here and by rules-compile.ts (so a
 * RulesFile built in code is held to them too).
 */
export function checkGlobalDescriptor(descriptor: RulesDescriptor, file: string): void {
  if (!descriptor.global) return;
  if (descriptor.value !== '') {
    throw new RulesError(
      RULES_ERROR_CODES.GLOBAL_WITH_VALUE,
      file,
      `descriptor '${descriptor.key}' has global: true and value '${descriptor.value}'; global goes on a ` +
        'key-only descriptor (one global quota per distinct value of the key)',
      descriptor.pos,
    );
  }
  if (descriptor.rateLimit !== null) {
    throw new RulesError(
      RULES_ERROR_CODES.GLOBAL_WITH_RATE_LIMIT,
      file,
      `descriptor '${descriptor.key}' has global: true and its own rate_limit; a global descriptor's limit ` +
        `comes from the coordinator (for key 'tenant', the tenant's tier quota), so remove rate_limit`,
      descriptor.rateLimit.pos ?? descriptor.pos,
    );
  }
}

// ---- The walk -----------------------------------------------------------------------------------

interface WalkContext {
  readonly file: string;
  readonly doc: Document;
  readonly lineCounter: LineCounter | null;
  descriptors: number;
  metadataNodes: number;
}

type Entries = Map<string, { readonly value: YamlNode | null; readonly keyPos: SourcePos | undefined }>;

function walkRoot(ctx: WalkContext, contents: unknown): RulesFile {
  const root = deref(ctx, contents);
  if (root === null) return Object.freeze({ file: ctx.file, domain: '', descriptors: Object.freeze([]) });
  if (!isMap(root)) {
    throw new RulesError(
      RULES_ERROR_CODES.INVALID_TYPE,
      ctx.file,
      `config error, a rules file must be a map with 'domain' and 'descriptors', found ${describeNode(root)}`,
      nodePos(ctx, root),
    );
  }
  const entries = readEntries(ctx, root, ROOT_KEYS, 'the top level');
  const domainEntry = entries.get('domain');
  const domain = readString(ctx, entries, 'domain', MAX_RULES_DOMAIN_LENGTH);
  const descriptors = readDescriptorList(ctx, entries, 1);
  return Object.freeze({
    file: ctx.file,
    domain,
    descriptors,
    pos:
      (domainEntry === undefined ? undefined : (nodePos(ctx, domainEntry.value) ?? domainEntry.keyPos)) ??
      nodePos(ctx, root),
  });
}

function readDescriptorList(ctx: WalkContext, entries: Entries, depth: number): readonly RulesDescriptor[] {
  const items = readMapList(ctx, entries, 'descriptors');
  if (items.length === 0) return Object.freeze([]);
  if (depth > MAX_RULES_DEPTH) {
    throw new RulesError(
      RULES_ERROR_CODES.BOUND_EXCEEDED,
      ctx.file,
      `descriptors are nested deeper than ${MAX_RULES_DEPTH} levels`,
      nodePos(ctx, items[0] ?? null),
    );
  }
  return Object.freeze(items.map((item) => walkDescriptor(ctx, item, depth)));
}

function walkDescriptor(ctx: WalkContext, node: YAMLMap, depth: number): RulesDescriptor {
  ctx.descriptors += 1;
  const pos = nodePos(ctx, node);
  if (ctx.descriptors > MAX_RULES_DESCRIPTORS_PER_FILE) {
    throw new RulesError(
      RULES_ERROR_CODES.BOUND_EXCEEDED,
      ctx.file,
      `more than ${MAX_RULES_DESCRIPTORS_PER_FILE} descriptors in one file`,
      pos,
    );
  }
  const entries = readEntries(ctx, node, DESCRIPTOR_KEYS, 'a descriptor');
  const key = readString(ctx, entries, 'key', MAX_RULES_KEY_LENGTH);
  const value = readString(ctx, entries, 'value', MAX_RULES_VALUE_LENGTH);
  const rateLimit = readRateLimit(ctx, entries);
  const shadowMode = readBool(ctx, entries, 'shadow_mode');
  const detailedMetric = readBool(ctx, entries, 'detailed_metric');
  const valueToMetric = readBool(ctx, entries, 'value_to_metric');
  const shareThreshold = readBool(ctx, entries, 'share_threshold');
  const quotaMode = readBool(ctx, entries, 'quota_mode');
  const global = readBool(ctx, entries, 'global');
  const metadata = readMetadata(ctx, entries);
  // The rules of `global` are checked before the children are walked, so the error points here.
  const head: RulesDescriptor = {
    key,
    value,
    rateLimit,
    descriptors: [],
    shadowMode,
    detailedMetric,
    valueToMetric,
    shareThreshold,
    quotaMode,
    global,
    metadata,
    pos,
  };
  checkGlobalDescriptor(head, ctx.file);
  const descriptors = readDescriptorList(ctx, entries, depth + 1);
  return Object.freeze({ ...head, descriptors });
}

function readRateLimit(ctx: WalkContext, entries: Entries): RulesRateLimit | null {
  const entry = entries.get('rate_limit');
  const node = deref(ctx, entry?.value ?? null);
  if (node === null) return null;
  if (!isMap(node)) {
    throw new RulesError(
      RULES_ERROR_CODES.INVALID_TYPE,
      ctx.file,
      `config error, 'rate_limit' must be a map, found ${describeNode(node)}`,
      nodePos(ctx, node),
    );
  }
  const fields = readEntries(ctx, node, RATE_LIMIT_KEYS, 'rate_limit');
  const unitEntry = fields.get('unit');
  const replaces = readMapList(ctx, fields, 'replaces');
  if (replaces.length > MAX_RULES_REPLACES_PER_RULE) {
    throw new RulesError(
      RULES_ERROR_CODES.BOUND_EXCEEDED,
      ctx.file,
      `more than ${MAX_RULES_REPLACES_PER_RULE} entries in 'replaces'`,
      nodePos(ctx, replaces[MAX_RULES_REPLACES_PER_RULE] ?? null),
    );
  }
  const burst = readBurst(ctx, fields);
  return Object.freeze({
    unit: readString(ctx, fields, 'unit', MAX_RULES_NAME_LENGTH),
    requestsPerUnit: readUint32(ctx, fields, 'requests_per_unit'),
    ...(burst === null ? {} : { burst }),
    unlimited: readBool(ctx, fields, 'unlimited'),
    name: readString(ctx, fields, 'name', MAX_RULES_NAME_LENGTH),
    replaces: Object.freeze(
      replaces.map((item) => {
        const replace = readEntries(ctx, item, REPLACES_KEYS, 'a replaces entry');
        return Object.freeze({
          name: readString(ctx, replace, 'name', MAX_RULES_NAME_LENGTH),
          pos: nodePos(ctx, item),
        });
      }),
    ),
    pos: nodePos(ctx, node),
    unitPos: unitEntry === undefined ? undefined : (nodePos(ctx, unitEntry.value) ?? unitEntry.keyPos),
  });
}

function readMetadata(ctx: WalkContext, entries: Entries): JsonObject | null {
  const entry = entries.get('metadata');
  const node = deref(ctx, entry?.value ?? null);
  if (node === null) return null;
  if (!isMap(node)) {
    throw new RulesError(
      RULES_ERROR_CODES.INVALID_TYPE,
      ctx.file,
      `config error, 'metadata' must be a map, found ${describeNode(node)}`,
      nodePos(ctx, node),
    );
  }
  return toJson(ctx, node, 1) as JsonObject;
}

/** Metadata values as JSON: scalars other than strings, numbers, booleans and null keep their source text. */
function toJson(ctx: WalkContext, raw: unknown, depth: number): JsonValue {
  const node = deref(ctx, raw);
  ctx.metadataNodes += 1;
  if (ctx.metadataNodes > MAX_RULES_METADATA_NODES_PER_FILE) {
    throw new RulesError(
      RULES_ERROR_CODES.BOUND_EXCEEDED,
      ctx.file,
      `more than ${MAX_RULES_METADATA_NODES_PER_FILE} metadata nodes in one file`,
      nodePos(ctx, node),
    );
  }
  if (depth > MAX_RULES_METADATA_DEPTH) {
    throw new RulesError(
      RULES_ERROR_CODES.BOUND_EXCEEDED,
      ctx.file,
      `metadata nested deeper than ${MAX_RULES_METADATA_DEPTH} levels`,
      nodePos(ctx, node),
    );
  }
  if (node === null) return null;
  if (isMap(node)) {
    const out: Record<string, JsonValue> = {};
    for (const pair of node.items) {
      const key = deref(ctx, pair.key);
      if (!isScalar(key) || typeof key.value !== 'string') {
        throw new RulesError(
          RULES_ERROR_CODES.KEY_NOT_STRING,
          ctx.file,
          `config error, key is not of type string: ${describeScalar(key)}`,
          nodePos(ctx, key),
        );
      }
      Object.defineProperty(out, key.value, { value: toJson(ctx, pair.value, depth + 1), enumerable: true });
    }
    return Object.freeze(out);
  }
  if (isSeq(node)) return Object.freeze(node.items.map((item) => toJson(ctx, item, depth + 1)));
  if (isScalar(node)) {
    const value = node.value;
    if (value === null || typeof value === 'string' || typeof value === 'boolean') return value;
    if (typeof value === 'number' && Number.isFinite(value)) return value;
    return scalarText(node);
  }
  return null;
}

// ---- Scalars ------------------------------------------------------------------------------------

/** A string field; YAML null or absent → ''. Non-string scalars keep their source text (as yaml.v2). */
function readString(ctx: WalkContext, entries: Entries, field: string, maxLength: number): string {
  const node = deref(ctx, entries.get(field)?.value ?? null);
  if (node === null) return '';
  if (!isScalar(node)) {
    throw new RulesError(
      RULES_ERROR_CODES.INVALID_TYPE,
      ctx.file,
      `config error, '${field}' must be a string, found ${describeNode(node)}`,
      nodePos(ctx, node),
    );
  }
  const text = scalarText(node);
  if (text.length > maxLength) {
    throw new RulesError(
      RULES_ERROR_CODES.BOUND_EXCEEDED,
      ctx.file,
      `config error, '${field}' is longer than ${maxLength} characters`,
      nodePos(ctx, node),
    );
  }
  return text;
}

function readBool(ctx: WalkContext, entries: Entries, field: string): boolean {
  const node = deref(ctx, entries.get(field)?.value ?? null);
  if (node === null) return false;
  if (isScalar(node) && (node.value === null || typeof node.value === 'boolean')) return node.value === true;
  throw new RulesError(
    RULES_ERROR_CODES.INVALID_TYPE,
    ctx.file,
    `config error, '${field}' must be true or false, found ${describeNode(node)}`,
    nodePos(ctx, node),
  );
}

/** Ours: `burst`, a whole number of tokens ≥ 1; null when absent. */
function readBurst(ctx: WalkContext, entries: Entries): number | null {
  const entry = entries.get('burst');
  if (entry === undefined) return null;
  const burst = readUint32(ctx, entries, 'burst');
  if (burst < 1) {
    throw new RulesError(
      RULES_ERROR_CODES.INVALID_TYPE,
      ctx.file,
      "config error, 'burst' must be at least 1",
      nodePos(ctx, deref(ctx, entry.value)) ?? entry.keyPos,
    );
  }
  return burst;
}

function readUint32(ctx: WalkContext, entries: Entries, field: string): number {
  const node = deref(ctx, entries.get(field)?.value ?? null);
  if (node === null) return 0;
  if (isScalar(node)) {
    if (node.value === null) return 0;
    if (typeof node.value === 'number' && Number.isInteger(node.value) && node.value >= 0 && node.value <= MAX_UINT32) {
      return node.value;
    }
  }
  throw new RulesError(
    RULES_ERROR_CODES.INVALID_TYPE,
    ctx.file,
    `config error, '${field}' must be an integer from 0 to ${MAX_UINT32}, found ${describeNode(node)}`,
    nodePos(ctx, node),
  );
}

// ---- Maps and lists ------------------------------------------------------------------------------

/** The pairs of a map, checking that every key is a string allowed at this level. */
function readEntries(ctx: WalkContext, map: YAMLMap, allowed: readonly string[], where: string): Entries {
  const entries: Entries = new Map();
  for (const pair of map.items) {
    const keyNode = deref(ctx, pair.key);
    const keyPos = nodePos(ctx, keyNode);
    if (!isScalar(keyNode) || typeof keyNode.value !== 'string') {
      if (isScalar(keyNode) && typeof keyNode.value === 'symbol') {
        throw new RulesError(
          RULES_ERROR_CODES.UNKNOWN_KEY,
          ctx.file,
          "config error, YAML merge keys ('<<') are not supported",
          keyPos,
        );
      }
      throw new RulesError(
        RULES_ERROR_CODES.KEY_NOT_STRING,
        ctx.file,
        `config error, key is not of type string: ${describeScalar(keyNode)}`,
        keyPos,
      );
    }
    const key = keyNode.value;
    if (!allowed.includes(key)) {
      const detail = KNOWN_KEYS.has(key)
        ? `config error, unknown key '${key}' in ${where} (allowed here: ${allowed.join(', ')})`
        : `config error, unknown key '${key}'`;
      throw new RulesError(RULES_ERROR_CODES.UNKNOWN_KEY, ctx.file, detail, keyPos);
    }
    // Duplicate keys are rejected by the YAML parser (uniqueKeys); a Document built from an object has none.
    entries.set(key, { value: isNode(pair.value) ? pair.value : null, keyPos });
  }
  return entries;
}

/** A list of maps (`descriptors`, `replaces`); YAML null or absent → []. */
function readMapList(ctx: WalkContext, entries: Entries, field: string): YAMLMap[] {
  const node = deref(ctx, entries.get(field)?.value ?? null);
  if (node === null) return [];
  if (!isSeq(node)) {
    throw new RulesError(
      RULES_ERROR_CODES.INVALID_TYPE,
      ctx.file,
      `config error, '${field}' must be a list of maps, found ${describeNode(node)}`,
      nodePos(ctx, node),
    );
  }
  return node.items.map((raw) => {
    const item = deref(ctx, raw);
    if (!isMap(item)) {
      throw new RulesError(
        RULES_ERROR_CODES.LIST_NOT_MAP,
        ctx.file,
        `config error, yaml file contains list of type other than map: ${describeScalar(item)}`,
        nodePos(ctx, item ?? raw),
      );
    }
    return item;
  });
}

// ---- Helpers ------------------------------------------------------------------------------------

function isNode(value: unknown): value is YamlNode {
  return isScalar(value) || isMap(value) || isSeq(value) || isAlias(value);
}

/** Follows aliases; a missing node and a YAML null (`~`, empty) are both null. */
function deref(ctx: WalkContext, raw: unknown): Scalar | YAMLMap | YAMLSeq | null {
  let node: unknown = raw;
  for (let hops = 0; isAlias(node); hops += 1) {
    // An alias of an alias resolves in one step in practice; the bound only guards against a cycle.
    if (hops > MAX_RULES_DEPTH) return null;
    node = node.resolve(ctx.doc);
  }
  if (isScalar(node)) return node.value === null || node.value === undefined ? null : node;
  if (isMap(node) || isSeq(node)) return node;
  return null;
}

function nodePos(ctx: WalkContext, node: unknown): SourcePos | undefined {
  if (ctx.lineCounter === null || !isNode(node) || node.range === undefined || node.range === null) return undefined;
  return toPos(ctx.lineCounter, node.range[0]);
}

function toPos(lineCounter: LineCounter, offset: number): SourcePos {
  const { line, col } = lineCounter.linePos(offset);
  return { line, column: col };
}

function describeNode(node: unknown): string {
  if (isMap(node)) return 'a map';
  if (isSeq(node)) return 'a list';
  if (isScalar(node) && typeof node.value === 'string') return `the string '${describeScalar(node)}'`;
  return `'${describeScalar(node)}'`;
}

/** A short printable form of a scalar (or of a collection) for an error message. */
function describeScalar(node: unknown): string {
  let text: string;
  if (isScalar(node)) {
    text = scalarText(node);
  } else if (isMap(node) || isSeq(node)) {
    text = JSON.stringify(node.toJSON());
  } else {
    text = 'null';
  }
  return text.length > 80 ? `${text.slice(0, 77)}...` : text;
}

/** A scalar as text: a string as is, anything else (number, boolean, timestamp...) as written in the source. */
function scalarText(node: Scalar): string {
  const value = node.value;
  if (typeof value === 'string') return value;
  if (node.source !== undefined) return node.source;
  if (value === null || value === undefined) return '';
  if (typeof value === 'number' || typeof value === 'boolean' || typeof value === 'bigint') return String(value);
  if (typeof value === 'symbol') return value.description ?? '';
  if (value instanceof Date) return value.toISOString();
  return JSON.stringify(value) ?? '';
}

/** The first line of a yaml-library message without its ` at line L, column C:` suffix. */
function yamlErrorText(message: string): string {
  const firstLine = message.split('\n', 1)[0] ?? message;
  return firstLine.replace(/ at line \d+, column \d+:?$/, '');
}
