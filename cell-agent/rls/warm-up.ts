// Warm-up before serving: a fresh thread runs its hot path interpreted and unoptimised, and its
// first checks take hundreds of microseconds each — long enough, under steady load, to put the
// thread behind and onto the overload path in its first seconds (issue 15 measured 7 to 70 fail-open
// answers in the first 5 s of a fresh agent under the open policy). So every serving thread first
// runs checks made from its own rules through the whole path — decode, match, buckets, the overload
// path, encode — on a scratch bucket table of its own (the shared buckets, the velocity window, the
// statistics and the throttling log are never touched), and only then binds its sockets and reports
// serving (gRPC health, /healthz): a client that connects gets decisions from the first check.
// `warmUpTransport` (warm-up-transport.ts) adds the same for the lean server's HTTP/2 path.
import { performance } from 'node:perf_hooks';
import type { Logger } from '../../shared/logging.js';
import { HrtimeClock } from '../buckets/elapsed-clock.js';
import { BucketTable } from '../buckets/bucket-table.js';
import type { OverloadSignal } from '../observe/lag-guard.js';
import { StatsWriter, createStatsShared } from '../observe/stats.js';
import type { RuleLevel, RuleNode, RuleSet } from '../rules/rules-compile.js';
import type { RlsEntry, RlsRequest, RlsResponse } from '../messages/rls-messages.js';
import { CheckService, overloadAllowances } from '../decide/check-service.js';
import { Decider } from '../decide/decide.js';
import type { DeciderDeps, DeciderOptions } from '../decide/decide.js';
import type { OverloadOptions } from '../decide/overload.js';
import { decodeRateLimitRequest, encodeRateLimitRequest, encodeRateLimitResponse } from './rls-codec.js';

export interface WarmUpOptions {
  /** Rounds over the requests made from the rules (default 3000 checks in all, at least 2 rounds). */
  readonly checks?: number;
  /** Stop early after this long (ms; default 1500): a huge rule set must not delay the start for long. */
  readonly budgetMs?: number;
}

export interface WarmUpResult {
  readonly checks: number;
  readonly ms: number;
  /** The requests used (also what the transport warm-up sends). */
  readonly requests: readonly RlsRequest[];
  /** The scratch check service (scratch table, statistics of its own): what the transport warm-up serves. */
  readonly service: CheckService;
}

const MAX_REQUESTS = 64;
const SCRATCH_KEYS = 4096;

/** Requests that reach the rules: every rule path (up to MAX_REQUESTS), one value per key, plus an unknown domain. */
export function warmUpRequests(rules: RuleSet): RlsRequest[] {
  const out: RlsRequest[] = [];
  const walk = (domain: string, level: RuleLevel, path: RlsEntry[]): void => {
    const nodes: RuleNode[] = [];
    for (const byValue of level.exact.values()) for (const n of byValue.values()) nodes.push(n);
    for (const list of level.wildcards.values()) nodes.push(...list);
    for (const n of level.keyOnly.values()) nodes.push(n);
    for (const n of nodes) {
      if (out.length >= MAX_REQUESTS) return;
      const value = n.value === null ? 'warm-up' : n.value.replace(/\*/g, 'w');
      const entries = [...path, { key: n.key, value }];
      out.push({ domain, hitsAddend: 0, descriptors: [{ entries, limit: null, hitsAddend: null }] });
      walk(domain, n.children, entries);
    }
  };
  for (const [domain, d] of rules.domains) walk(domain, d.root, []);
  out.push({
    domain: '~warm-up',
    hitsAddend: 0,
    descriptors: [{ entries: [{ key: 'k', value: 'v' }], limit: null, hitsAddend: null }],
  });
  return out;
}

/**
 * Runs checks made from `rules` through decode → check (normal and overload path) → encode, on a
 * scratch table, with the thread's own decision settings. Synchronous by design: nothing else is
 * served meanwhile (the caller binds its sockets afterwards).
 */
export function warmUp(
  rules: RuleSet,
  deps: Pick<DeciderDeps, 'quotas' | 'overrides'>,
  options: DeciderOptions,
  overload: OverloadOptions,
  logger: Logger,
  opts: WarmUpOptions = {},
): WarmUpResult {
  // Its errors (there should be none) are the warm-up's, logged at debug: the real service logs its own.
  const started = performance.now();
  const budget = opts.budgetMs ?? 1500;
  const total = opts.checks ?? 3000;
  const table = new BucketTable({ capacity: SCRATCH_KEYS, startNs: process.hrtime.bigint() });
  const decider = new Decider(
    {
      table,
      quotas: deps.quotas,
      overrides: deps.overrides ?? null,
      clock: () => process.hrtime.bigint(),
      elapsed: new HrtimeClock(table.startNs),
    },
    options,
  );
  decider.setRules(rules);
  const stats = new StatsWriter(createStatsShared(1), 0);
  const encode = (response: RlsResponse): Buffer => encodeRateLimitResponse(response, true);
  const normal = new CheckService(decider, stats, null, logger, { encode });
  // The overload path too, under a signal that always says overloaded.
  const forced: OverloadSignal = { overloaded: () => true, overloadedAt: () => true };
  const overloaded =
    overload.policy === 'bounded' && overload.allowance > 0
      ? new CheckService(decider, stats, forced, logger, {
          overload,
          allowances: overloadAllowances(overload.allowance, table, null),
          encode,
        })
      : new CheckService(decider, stats, forced, logger, { overload, encode });
  const requests = warmUpRequests(rules);
  const encoded = requests.map((r) => encodeRateLimitRequest(r));
  let checks = 0;
  let rounds = 0;
  while (checks < total && (rounds < 2 || performance.now() - started < budget)) {
    for (const bytes of encoded) {
      const decoded = decodeRateLimitRequest(bytes); // the lean server's reused decoding, then a copy
      if (!decoded.ok) continue;
      const service = (checks & 7) === 7 ? overloaded : normal;
      // Both ways a transport checks: the lean server's in place, grpc-js's into fresh objects.
      const out = (checks & 1) === 0 ? service.checkInPlace(decoded.value) : service.check(decoded.value);
      if (out.kind === 'answer') encodeRateLimitResponse(out.response, true);
      checks++;
    }
    rounds++;
  }
  return { checks, ms: performance.now() - started, requests, service: normal };
}
