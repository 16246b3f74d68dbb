// Errors of the rule configuration (cell-agent/rules). Every failure to parse, validate, compile,
// read or watch a rules file is a RulesError with a stable `code` (listed below, documented in
// cell-agent/rules/README.md and checked by a test) and a message that names the file, and the
// line and column when they are known:
//
//   rules.yaml:4:11: invalid rate limit unit 'foo'
//
// The text after the position keeps envoyproxy/ratelimit's wording where an equivalent error exists
// there (e.g. "duplicate descriptor composite key 'd.k_v'"), so users migrating from it recognise it.
import { CellquotaError } from '../../shared/errors.js';

/** The stable error codes. Never rename one; add new ones at the end of their group. */
export const RULES_ERROR_CODES = {
  // Reading files (rules-load.ts).
  READ_FAILED: 'RULES_READ_FAILED',
  FILE_TOO_LARGE: 'RULES_FILE_TOO_LARGE',
  NO_FILES: 'RULES_NO_FILES',
  TOO_MANY_FILES: 'RULES_TOO_MANY_FILES',
  WATCH_FAILED: 'RULES_WATCH_FAILED',
  // Parsing and shape (rules-schema.ts).
  YAML_INVALID: 'RULES_YAML_INVALID',
  UNKNOWN_KEY: 'RULES_UNKNOWN_KEY',
  KEY_NOT_STRING: 'RULES_KEY_NOT_STRING',
  LIST_NOT_MAP: 'RULES_LIST_NOT_MAP',
  INVALID_TYPE: 'RULES_INVALID_TYPE',
  BOUND_EXCEEDED: 'RULES_BOUND_EXCEEDED',
  GLOBAL_WITH_VALUE: 'RULES_GLOBAL_WITH_VALUE',
  GLOBAL_WITH_RATE_LIMIT: 'RULES_GLOBAL_WITH_RATE_LIMIT',
  // Global rules a per-quota-key bucket cannot enforce as written (rules-compile.ts).
  GLOBAL_QUOTA_MODE: 'RULES_GLOBAL_QUOTA_MODE',
  GLOBAL_NESTED: 'RULES_GLOBAL_NESTED',
  GLOBAL_SHADOW_MIXED: 'RULES_GLOBAL_SHADOW_MIXED',
  // envoyproxy/ratelimit's load-time errors (rules-compile.ts).
  EMPTY_DOMAIN: 'RULES_EMPTY_DOMAIN',
  DUPLICATE_DOMAIN: 'RULES_DUPLICATE_DOMAIN',
  EMPTY_KEY: 'RULES_EMPTY_KEY',
  DUPLICATE_KEY: 'RULES_DUPLICATE_KEY',
  INVALID_UNIT: 'RULES_INVALID_UNIT',
  UNLIMITED_WITH_UNIT: 'RULES_UNLIMITED_WITH_UNIT',
  EMPTY_REPLACES: 'RULES_EMPTY_REPLACES',
  REPLACES_SELF: 'RULES_REPLACES_SELF',
  SHARE_THRESHOLD_WITHOUT_WILDCARD: 'RULES_SHARE_THRESHOLD_WITHOUT_WILDCARD',
  // A bug, not an operating error: something other than a RulesError escaped while reloading.
  INTERNAL: 'RULES_INTERNAL',
} as const;

export type RulesErrorCode = (typeof RULES_ERROR_CODES)[keyof typeof RULES_ERROR_CODES];

/** A 1-based position in a source file. */
export interface SourcePos {
  readonly line: number;
  readonly column: number;
}

export class RulesError extends CellquotaError {
  override readonly name = 'RulesError';
  readonly code: RulesErrorCode;
  /** The file (as the caller named it) the error is about. */
  readonly file: string;
  /** 1-based line and column, when known. */
  readonly pos: SourcePos | undefined;
  /** The message without the file and position prefix. */
  readonly detail: string;

  constructor(code: RulesErrorCode, file: string, detail: string, pos?: SourcePos, options?: { cause?: unknown }) {
    super(`${file}${pos === undefined ? '' : `:${pos.line}:${pos.column}`}: ${detail}`, options);
    this.code = code;
    this.file = file;
    this.pos = pos;
    this.detail = detail;
  }
}

export function isRulesError(error: unknown): error is RulesError {
  return error instanceof RulesError;
}
