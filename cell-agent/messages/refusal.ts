// Why a check was refused: the level and limit that refused it and what that level decided on. The
// answer carries it in its x-ratelimit-* provenance headers (decide/decide.ts) and the throttling
// log counts refusals by it (observe/throttle-log.ts).

/** The levels that refuse a request (x-ratelimit-refused-by). */
export const REFUSING_LEVELS = [
  'local-rule',
  'limit-override',
  'tenant-quota',
  'tier-cap',
  'domain-cap',
  'unknown-tenant',
] as const;
/** The level that refused a request. */
export type RefusingLevel = (typeof REFUSING_LEVELS)[number];

export interface Refusal {
  readonly level: RefusingLevel;
  /** The local rule's name (its bucket key when unnamed) or the global quota's key. */
  readonly limit: string;
  /**
   * Global levels: 'lease' (a live grant, with its epoch), 'floor' (the grant's floor, lease lost), 'static-share'
   * (no grant yet).
   */
  readonly decidedOn: 'lease' | 'floor' | 'static-share' | null;
  readonly epoch: number | null;
  readonly cell: string | null;
}

/** `lease epoch=7`, `floor epoch=7`, `static-share`; null for a local level. */
export function decidedOnText(r: Refusal): string | null {
  if (r.decidedOn === null) return null;
  return r.epoch === null ? r.decidedOn : `${r.decidedOn} epoch=${r.epoch}`;
}
