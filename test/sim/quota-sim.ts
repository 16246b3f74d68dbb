// The deterministic whole-system quota simulation: three coordinator replicas and three cell agents
// in simulated time, every source of nondeterminism (network, commits, elections, clocks, stalls,
// load, faults) drawn from one seed, so a seed replays a run exactly.
//
// Real code, nothing of it copied here:
//   coordinators  one LeaseService per replica (its own monotonic clock and wall clock, its round
//                 and expiry driven on that clock as its timers would), over the real Ledger and the
//                 real allocator (the default grant policy); a new LeaseService after a restart.
//   agents        the real LeaseClient (transport, timers, clocks and randomness given by the
//                 simulation), one BucketTable, VelocityTable and LeaseDeadline per agent process,
//                 and a Decider with its own QuotaOverrides per thread (the main thread's HTTP
//                 checks and each worker's), fed the way agent-main.ts feeds them: the main thread
//                 applies the lease client's entries, posts them to every worker, and acknowledges
//                 them once every worker confirmed.
// Modelled: Raft as "an entry commits after a random delay, in order, while its proposer leads its
// term" (a crashed leader's entry is lost or committed by the next leader unanswered; a read barrier
// completes after a delay), the network (delays, drops, duplicates, reordering, partitions), and
// the scheduling of each agent thread (a stalled thread runs its queued work when it resumes).
//
// Faults drawn per seed: leader crashes and transfers with wall-clock offsets up to seconds between
// replicas, clock-rate error up to the documented limit (coordinators and agents), stalled agent
// main threads and workers, SIGSTOP of a whole agent (its workers read their queued requests before
// the main thread's timers run), delayed, dropped, duplicated and reordered reports and answers, a
// partitioned agent, agent restarts and late starts, tier and tenant changes while leases are out,
// tenants reached through two domains and two rule paths, floors, a small bucket table that evicts.
//
// The check: for every global quota (tenant, tier cap, domain cap) and every 1 s window ending at an
// admission, what the deciders admitted under that quota (as they recorded it) is at most
// rate·W·(1 + ρ) + burst, ρ the largest agent clock-rate error of the run and rate and burst the
// largest the quota had over the window and the TTL + margin before it; every admitted request
// consumed its own tenant's quota; the ledger's invariants hold after every committed entry.
import { pino } from 'pino';
import * as grpc from '@grpc/grpc-js';
import { Ledger } from '../../coordinator/ledger/ledger.js';
import type { LedgerResult } from '../../coordinator/ledger/ledger.js';
import type { LedgerCommandInput } from '../../coordinator/ledger/ledger-commands.js';
import { NEWEST_COMMAND_FORMAT } from '../../coordinator/ledger/ledger-commands.js';
import { LeaseService } from '../../coordinator/lease/lease-service.js';
import type { LeaseBackend } from '../../coordinator/lease/lease-service.js';
import { BucketTable } from '../../cell-agent/buckets/bucket-table.js';
import { Decider } from '../../cell-agent/decide/decide.js';
import type { VelocityRecorder } from '../../cell-agent/decide/decide.js';
import { CoordinatedQuotas, StaticQuotas } from '../../cell-agent/decide/quotas.js';
import type { QuotaFile } from '../../cell-agent/decide/quotas.js';
import { DEFAULT_REQUEST_BOUNDS } from '../../cell-agent/decide/request-check.js';
import { LeaseClient, leaseCallError } from '../../cell-agent/lease/lease-client.js';
import type { LeaseCallResult, LeaseTimers, LeaseTransport } from '../../cell-agent/lease/lease-client.js';
import { LeaseDeadline, deadlineWriter } from '../../cell-agent/lease/lease-deadline.js';
import { QuotaOverrides, applyLeaseEntries } from '../../cell-agent/lease/quota-overrides.js';
import type { OverrideEntry } from '../../cell-agent/lease/quota-overrides.js';
import { compileRules } from '../../cell-agent/rules/rules-compile.js';
import type { RuleSet } from '../../cell-agent/rules/rules-compile.js';
import { parseRulesYaml } from '../../cell-agent/rules/rules-schema.js';
import type { RlsRequest } from '../../cell-agent/messages/rls-messages.js';
import { VelocityKeys, VelocityTable } from '../../cell-agent/velocity/velocity-table.js';
import type { ReportRequestMessage } from '../../shared/lease-proto.js';
import { PLANTED_BUGS, plantBug } from '../../shared/planted-bugs.js';
import type { PlantedBug } from '../../shared/planted-bugs.js';
import { EventQueue } from './sim-queue.js';
import { Rng } from '../../testkit/random.js';

export { PLANTED_BUGS };
export type { PlantedBug };

export interface QuotaSimOptions {
  readonly seed: number;
  /** Simulated ms (default 10,000). */
  readonly durationMs?: number;
  /** One planted bug (shared/planted-bugs.ts) for this run; none by default. */
  readonly bug?: PlantedBug | null;
  /** Told, every 250 simulated ms, what every cell holds and admits (replaying a seed). */
  readonly trace?: (line: string) => void;
}

export interface QuotaViolation {
  /** bound: a 1 s window over rate·W + burst; cell-bound: one cell's window over what the ledger
   * counted it at (rate·W + burst, the largest over the window); cell-tokens: one cell admitted
   * more than a bucket refilled at the ledger's counted rate and capped at its counted burst could
   * hold (the tokens the ledger counts the cell as possibly holding); consumed: an admitted request
   * not counted under its tenant's quota; ledger: the ledger's own invariants. */
  readonly kind: 'bound' | 'cell-bound' | 'cell-tokens' | 'consumed' | 'ledger';
  readonly atMs: number;
  readonly message: string;
  readonly evidence: Record<string, unknown>;
}

export interface QuotaSimStats {
  events: number;
  decisions: number;
  admitted: number;
  reports: number;
  rounds: number;
  commits: number;
  leaderChanges: number;
  mainStalls: number;
  workerStalls: number;
  sigstops: number;
  restarts: number;
  definitionChanges: number;
  evictions: number;
  /** Slices the leaders dropped because an agent released them (dropReleasedSlices; runs at the newest format). */
  releasedSlicesDropped: number;
  /** Largest admitted/bound over every quota and window (≤ 1). */
  maxWindowRatio: number;
}

export interface QuotaSimResult {
  readonly ok: boolean;
  readonly seed: number;
  readonly violation?: QuotaViolation;
  readonly stats: QuotaSimStats;
  /** The faults drawn for this seed (for the replay). */
  readonly faults: readonly string[];
}

// ---- the modelled deployment ------------------------------------------------------------------

const CELLS = 3;
const WORKERS = 2;
const LEASE_TTL_MS = 3_000;
const SKEW_MARGIN_MS = 1_000;
const ROUND_MS = 100;
const EXPIRE_EVERY_MS = 1_000;
const REPORT_MS = 500;
const WINDOW_MS = 1_000;
/** How far back a quota's largest definition still bounds a window (TTL + margin, stretched by ρ, plus commits). */
const DEFINITION_HORIZON_MS = 6_000;
/** The documented clock-rate limit the defaults tolerate is 1/7 (leader-clock.ts); runs draw up to this. */
const MAX_RATE_ERROR = 0.12;
const WALL_BASE_MS = 1_800_000_000_000;
/** A resumed thread reads its port this long after the socket reads queued while it was stalled. */
const PORT_AFTER_SOCKETS_MS = 1;

const TIERS = {
  gold: { rate: 200, burst: 100, floorFraction: 0.15 },
  silver: { rate: 120, burst: 40, floorFraction: 0.3 },
} as const;
const GOLD_CAP = { rate: 300, burst: 90, floorFraction: 0.3 };
const WEB_CAP = { rate: 250, burst: 75, floorFraction: 0.3 };
/** A tenant quota with a 20 s window (some runs). */
const LONG_WINDOW = { rate: 30, burst: 600 };
/** --max-lease-keys of the agents in runs at the newest command format: fewer than the quota keys a cell may use. */
const LEASE_KEYS_RAISED = 2;
const TENANTS: readonly { id: string; tier: 'gold' | 'silver' }[] = [
  { id: 'acme', tier: 'gold' },
  { id: 'globex', tier: 'gold' },
  { id: 'initech', tier: 'silver' },
];

const RULES: RuleSet = compileRules([
  parseRulesYaml(
    `
domain: api
descriptors:
  - key: tenant
    global: true
  - key: route
    value: upload
    descriptors:
      - key: tenant
        global: true
  - key: user
    rate_limit: {unit: second, requests_per_unit: 20}
`,
    'api.yaml',
  ),
  parseRulesYaml(
    `
domain: web
descriptors:
  - key: customer
    global: true
`,
    'web.yaml',
  ),
]);

const QUOTA_KEYS: readonly string[] = [
  ...TENANTS.map((t) => `tenant/${t.id}`),
  'tier/gold',
  'tier/silver',
  'domain/web',
  'domain/api',
];
const SILENT = pino({ level: 'silent' });

class Stop extends Error {
  constructor(readonly violation: QuotaViolation) {
    super(violation.message);
  }
}

// ---- the run ----------------------------------------------------------------------------------

export async function runQuotaSimulation(opts: QuotaSimOptions): Promise<QuotaSimResult> {
  plantBug(opts.bug ?? null);
  try {
    return await new Simulation(opts).run();
  } finally {
    plantBug(null);
  }
}

interface Thread {
  readonly name: string;
  stalledUntil: number;
}

interface Definition {
  readonly fromMs: number;
  readonly rate: number;
  readonly burst: number;
}

interface Tokens {
  level: number;
  atMs: number;
  rate: number;
  burst: number;
}

interface Window {
  readonly times: number[];
  readonly hits: number[];
  head: number;
  sum: number;
}

class Simulation {
  readonly q = new EventQueue();
  readonly rng: Rng;
  readonly net: Rng;
  readonly load: Rng;
  readonly fault: Rng;
  readonly duration: number;
  readonly stats: QuotaSimStats = {
    events: 0,
    decisions: 0,
    admitted: 0,
    reports: 0,
    rounds: 0,
    commits: 0,
    leaderChanges: 0,
    mainStalls: 0,
    workerStalls: 0,
    sigstops: 0,
    restarts: 0,
    definitionChanges: 0,
    evictions: 0,
    releasedSlicesDropped: 0,
    maxWindowRatio: 0,
  };
  readonly faults: string[] = [];
  /** Something async may be waiting on this event's work: let the microtasks run before the next. */
  drain = false;

  // coordinators
  readonly ledger = new Ledger({ floorCells: CELLS, skewMarginMs: SKEW_MARGIN_MS });
  index = 0;
  term = 1;
  leader: Replica | null = null;
  lastCommitAt = 0;
  readonly inflight: { term: number; cmd: LedgerCommandInput; done: (r: LedgerResult | Error) => void }[] = [];
  readonly replicas: Replica[] = [];
  /** Every LeaseService of the run, restarted replicas' earlier ones included (their rounds count). */
  readonly services: LeaseService[] = [];
  readonly agents: Agent[] = [];

  // network
  readonly dropP: number;
  readonly dupP: number;
  readonly slowP: number;
  readonly portLagP: number;
  partition: { cell: string; from: number; to: number } | null = null;

  // the load: per tenant, its total demand (req/s) and each cell's share of it, redrawn now and then
  readonly demand: number[] = TENANTS.map(() => 0);
  readonly shares: number[][] = TENANTS.map(() => Array.from({ length: CELLS }, () => 0));

  // the bound
  readonly definitions = new Map<string, Definition[]>();
  readonly windows = new Map<string, Window>();
  /** Per `cell key`: what the ledger counted the cell at, from when. */
  readonly counted = new Map<string, Definition[]>();
  readonly cellWindows = new Map<string, Window>();
  /** Per `cell key`: the tokens the ledger counts the cell as possibly holding (see checkTokens). */
  readonly counters = new Map<string, Tokens>();
  agentRateError = 0;
  /** --max-lease-keys of the agents (undefined: unbounded). */
  leaseKeys: number | undefined = undefined;
  staticFile: QuotaFile = { tiers: {}, tenants: {} };

  constructor(opts: QuotaSimOptions) {
    this.rng = new Rng(opts.seed);
    this.net = this.rng.fork();
    this.load = this.rng.fork();
    this.fault = this.rng.fork();
    this.duration = opts.durationMs ?? 10_000;
    this.dropP = this.fault.chance(0.5) ? this.fault.range(0, 0.05) : 0;
    this.dupP = this.fault.chance(0.4) ? this.fault.range(0, 0.05) : 0;
    this.slowP = this.fault.chance(0.4) ? this.fault.range(0, 0.05) : 0;
    this.portLagP = this.fault.chance(0.6) ? this.fault.range(0, 0.25) : 0;
    this.seed = opts.seed;
    this.trace = opts.trace ?? null;
  }

  readonly trace: ((line: string) => void) | null;
  /** Per cell and quota key, the admissions of the last second (tracing only). */
  readonly perCell = new Map<string, number[]>();

  traceNow(): void {
    const t = this.trace;
    if (t === null) return;
    const now = this.q.now;
    const parts: string[] = [
      `${now.toFixed(0).padStart(6)} ms leader ${this.leader?.id ?? '-'} ledger ${this.ledger.nowMs.toFixed(0)}`,
    ];
    for (const a of this.agents) {
      const st = a.process?.client.status();
      const bits = [`${a.cell} ${st === undefined ? 'down' : `${st.state} ${Math.round(st.leaseRemainingMs)}`}`];
      for (const key of ['tenant/acme', 'tenant/globex', 'tenant/initech']) {
        const sl = this.ledger.getSlice(key, a.cell);
        const xs = (this.perCell.get(`${a.cell} ${key}`) ?? []).filter((x) => x > now - WINDOW_MS);
        this.perCell.set(`${a.cell} ${key}`, xs);
        const ti = TENANTS.findIndex((x) => `tenant/${x.id}` === key);
        const want = (this.demand[ti] as number) * ((this.shares[ti] as number[])[a.index] as number);
        bits.push(
          `${key.slice(7, 10)} d${want.toFixed(0)} g${sl?.rate.toFixed(0) ?? '-'}/c${sl?.countedRate.toFixed(0) ?? '-'} e${sl?.epoch ?? '-'} a${xs.length}`,
        );
      }
      parts.push(bits.join(' '));
    }
    t(parts.join(' | '));
    this.at(now + 250, () => this.traceNow(), false);
  }

  readonly seed: number;

  track(service: LeaseService): LeaseService {
    this.services.push(service);
    return service;
  }

  at(t: number, fn: () => void, async = true): void {
    this.q.schedule(t, () => {
      fn();
      if (async) this.drain = true;
    });
  }

  /**
   * Work of `thread` due at `t`: deferred while the thread is stalled (in order). `late`: read after
   * the socket reads a resumed thread queued meanwhile (a message port's delivery: Port.post).
   */
  on(thread: Thread, t: number, fn: () => void, async = true, late = false): void {
    const run = (): void => {
      if (this.q.now < thread.stalledUntil) {
        this.q.schedule(late ? thread.stalledUntil + PORT_AFTER_SOCKETS_MS : thread.stalledUntil, run);
        return;
      }
      fn();
      if (async) this.drain = true;
    };
    this.q.schedule(t, run);
  }

  // ---- the committed state -----------------------------------------------------------------

  commit(cmd: LedgerCommandInput): LedgerResult {
    const r = this.ledger.apply(cmd, ++this.index);
    this.stats.commits++;
    try {
      this.ledger.checkInvariants();
    } catch (e) {
      throw new Stop({
        kind: 'ledger',
        atMs: this.q.now,
        message: `ledger invariant: ${e instanceof Error ? e.message : String(e)}`,
        evidence: { index: this.index, cmd: cmd.type },
      });
    }
    this.recordCounted();
    if (
      r.ok &&
      (cmd.type === 'putTier' || cmd.type === 'putTenant' || cmd.type === 'putTierCap' || cmd.type === 'putDomainCap')
    )
      this.recordDefinitions();
    return r;
  }

  /** What the ledger counts every cell at, per quota (the premise of the bound: no cell uses more). */
  recordCounted(): void {
    for (const a of this.agents) {
      for (const key of QUOTA_KEYS) {
        const sl = this.ledger.getSlice(key, a.cell);
        const k = `${a.cell} ${key}`;
        const list = this.counted.get(k) ?? [];
        const last = list[list.length - 1];
        const rate = sl?.countedRate ?? 0;
        const burst = sl?.countedBurst ?? 0;
        if (last === undefined || last.rate !== rate || last.burst !== burst) {
          list.push({ fromMs: this.q.now, rate, burst });
          this.countedChanged(k, rate, burst);
        }
        if (list.length > 256) list.shift();
        this.counted.set(k, list);
      }
    }
  }

  recordDefinitions(): void {
    for (const key of QUOTA_KEYS) {
      const qd = this.ledger.getQuota(key);
      const list = this.definitions.get(key) ?? [];
      const last = list[list.length - 1];
      const rate = qd?.rate ?? 0;
      const burst = qd?.burst ?? 0;
      if (last === undefined || last.rate !== rate || last.burst !== burst) {
        list.push({ fromMs: this.q.now, rate, burst });
        if (last !== undefined) this.stats.definitionChanges++;
      }
      this.definitions.set(key, list);
    }
  }

  propose(from: Replica, cmd: LedgerCommandInput): Promise<LedgerResult> {
    return new Promise((resolve, reject) => {
      if (this.leader !== from || !from.up) {
        reject(new Error('not the leader'));
        return;
      }
      const term = this.term;
      const entry = { term, cmd, done: (r: LedgerResult | Error) => (r instanceof Error ? reject(r) : resolve(r)) };
      this.inflight.push(entry);
      const at = Math.max(this.lastCommitAt, this.q.now + this.net.range(2, 40));
      this.lastCommitAt = at;
      this.at(at, () => {
        const i = this.inflight.indexOf(entry);
        if (i < 0) return; // lost, or committed by the next leader
        this.inflight.splice(i, 1);
        entry.done(this.commit(cmd));
      });
    });
  }

  /** The leader is gone (crash or transfer): its uncommitted entries are lost or committed by the next leader, unanswered. */
  loseLeader(): void {
    const old = this.leader;
    this.leader = null;
    this.term++;
    const survivors: LedgerCommandInput[] = [];
    for (const e of this.inflight.splice(0)) {
      if (this.fault.chance(0.5)) survivors.push(e.cmd);
      e.done(new Error('leadership lost'));
    }
    const delay = this.fault.range(150, 1_000);
    this.at(this.q.now + delay, () => {
      const candidates = this.replicas.filter((r) => r.up && r !== old);
      const next = candidates.length > 0 ? (candidates[this.fault.int(candidates.length)] as Replica) : null;
      if (next === null) {
        this.at(this.q.now + 200, () => this.elect());
        return;
      }
      for (const cmd of survivors) this.commit(cmd);
      this.leader = next;
      this.stats.leaderChanges++;
    });
  }

  elect(): void {
    if (this.leader !== null) return;
    const up = this.replicas.filter((r) => r.up);
    if (up.length < 2) {
      this.at(this.q.now + 200, () => this.elect());
      return;
    }
    this.leader = up[this.fault.int(up.length)] as Replica;
    this.stats.leaderChanges++;
  }

  /** An operator's change through the admin API: proposed on the leader, retried until one exists. */
  admin(cmd: LedgerCommandInput, what: string): void {
    const leader = this.leader;
    if (leader === null || !leader.up) {
      this.at(this.q.now + 100, () => this.admin(cmd, what));
      return;
    }
    this.faults.push(`${Math.round(this.q.now)} ms: ${what}`);
    this.propose(leader, cmd).catch(() => this.at(this.q.now + 100, () => this.admin(cmd, what)));
  }

  // ---- the bound -----------------------------------------------------------------------------

  admitted(cell: string, key: string, hits: number, since: number): void {
    if (this.trace !== null) {
      const k = `${cell} ${key}`;
      const xs = this.perCell.get(k) ?? [];
      for (let h = 0; h < hits; h++) xs.push(this.q.now);
      this.perCell.set(k, xs);
    }
    const now = this.q.now;
    this.checkTokens(cell, key, hits);
    this.checkCell(cell, key, hits, since);
    const w = slide(this.windows, key, now, hits);
    let rate = 0;
    let burst = 0;
    const defs = this.definitions.get(key) ?? [];
    for (let i = 0; i < defs.length; i++) {
      const d = defs[i] as Definition;
      const until = defs[i + 1]?.fromMs ?? Infinity;
      if (until < now - WINDOW_MS - DEFINITION_HORIZON_MS) continue;
      rate = Math.max(rate, d.rate);
      burst = Math.max(burst, d.burst);
    }
    const bound = rate * (WINDOW_MS / 1000) * (1 + this.agentRateError) + burst + 1e-6;
    const ratio = bound > 0 ? w.sum / bound : Infinity;
    if (ratio > this.stats.maxWindowRatio) this.stats.maxWindowRatio = ratio;
    if (w.sum > bound) {
      throw new Stop({
        kind: 'bound',
        atMs: now,
        message: `${key}: ${w.sum} admitted in [${(now - WINDOW_MS).toFixed(3)}, ${now.toFixed(3)}] ms, over rate·W·(1+ρ) + burst = ${bound.toFixed(2)} (last admitted by ${cell})`,
        evidence: {
          key,
          admitted: w.sum,
          bound,
          definitions: defs,
          cells: this.agents.map((a) => ({
            cell: a.cell,
            up: a.process !== null,
            lease: a.process?.client.status().state ?? null,
            slice: this.ledger.getSlice(key, a.cell) ?? null,
          })),
        },
      });
    }
  }

  /** The ledger now counts `k` (cell and key) at rate and burst: its tokens so far under the old count, then capped. */
  countedChanged(k: string, rate: number, burst: number): void {
    const t = this.counters.get(k);
    if (t === undefined) {
      this.counters.set(k, { level: 0, atMs: this.q.now, rate, burst });
      return;
    }
    this.refill(t);
    t.rate = rate;
    t.burst = burst;
    t.level = Math.min(t.level, burst);
  }

  refill(t: Tokens): void {
    const now = this.q.now;
    t.level = Math.min(t.burst, t.level + ((t.rate * (now - t.atMs)) / 1000) * (1 + this.agentRateError));
    t.atMs = now;
  }

  /**
   * The cell's admissions against the tokens the ledger counts it as possibly holding: a bucket
   * that starts empty, refills at the counted rate (times 1 + ρ for the agent's clock) and is capped
   * at the counted burst the moment the ledger lowers it — what the global bound adds up over the
   * cells. Stricter than the window check: a cell whose bucket refilled at a rate the ledger no
   * longer counted (a grant's, past its lease and the margin) and then spends it is caught here even
   * when the window still allows the counted burst. One token of slack for the buckets' rounding.
   */
  checkTokens(cell: string, key: string, hits: number): void {
    const k = `${cell} ${key}`;
    const t = this.counters.get(k);
    if (t === undefined)
      throw new Stop({
        kind: 'cell-tokens',
        atMs: this.q.now,
        message: `${cell} admitted ${hits} under ${key} before the ledger counted it at anything`,
        evidence: { cell, key, admitted: hits, bound: 0 },
      });
    this.refill(t);
    const before = t.level;
    t.level -= hits;
    if (t.level < -1 - 1e-6) {
      const list = this.counted.get(k) ?? [];
      const p = this.agents.find((a) => a.cell === cell)?.process;
      throw new Stop({
        kind: 'cell-tokens',
        atMs: this.q.now,
        message: `${cell} admitted ${hits} under ${key} holding ${before.toFixed(2)} of the tokens the ledger counted it at (refilled at the counted rate, capped at the counted burst)`,
        evidence: {
          cell,
          key,
          admitted: hits,
          bound: before + 1,
          counted: list.filter((d) => d.fromMs >= this.q.now - 3 * LEASE_TTL_MS),
          lease: p?.client.status() ?? null,
          slice: this.ledger.getSlice(key, cell) ?? null,
          ledgerNowMs: this.ledger.nowMs,
        },
      });
    }
  }

  /**
   * The cell's own window against what the ledger counted it at (the bound's premise: no cell ever
   * uses more than the ledger counts it at). In [t − W, t] a cell admits at most the tokens its
   * bucket held at t − W — no more than the burst counted then, nor than it earned at the counted
   * rates since its process first met the key (`since`: its buckets start empty) — plus what the
   * counted rate refills over the window: ∫ counted rate, exactly, times (1 + ρ) for its clock.
   */
  checkCell(cell: string, key: string, hits: number, since: number): void {
    const now = this.q.now;
    const from = now - WINDOW_MS;
    const k = `${cell} ${key}`;
    const w = slide(this.cellWindows, k, now, hits);
    const list = this.counted.get(k) ?? [];
    let refill = 0;
    let earned = 0;
    let burstAtFrom = 0;
    for (let i = 0; i < list.length; i++) {
      const d = list[i] as Definition;
      const until = list[i + 1]?.fromMs ?? Infinity;
      refill += d.rate * Math.max(0, Math.min(until, now) - Math.max(d.fromMs, from));
      earned += d.rate * Math.max(0, Math.min(until, from) - Math.max(d.fromMs, since));
      if (d.fromMs <= from && until > from) burstAtFrom = d.burst;
    }
    // History dropped beyond the kept entries: no claim about what was earned or held then.
    if ((list[0]?.fromMs ?? Infinity) > Math.min(since, from)) {
      earned = Infinity;
      burstAtFrom = Math.max(burstAtFrom, list[0]?.burst ?? Infinity);
    }
    const ρ = 1 + this.agentRateError;
    const atStart = Math.min(Math.floor(burstAtFrom + 1e-9), (earned / 1000) * ρ);
    const bound = (refill / 1000) * ρ + atStart + 1 + 1e-6;
    if (w.sum > bound) {
      const p = this.agents.find((a) => a.cell === cell)?.process;
      throw new Stop({
        kind: 'cell-bound',
        atMs: now,
        message: `${cell} admitted ${w.sum} under ${key} in [${(now - WINDOW_MS).toFixed(3)}, ${now.toFixed(3)}] ms, over what the ledger counted it at: rate·W·(1+ρ) + burst = ${bound.toFixed(2)}`,
        evidence: {
          cell,
          key,
          admitted: w.sum,
          bound,
          since,
          counted: list.filter((d, i) => (list[i + 1]?.fromMs ?? Infinity) >= Math.min(since, from)),
          lease: p?.client.status() ?? null,
          slice: this.ledger.getSlice(key, cell) ?? null,
          ledgerNowMs: this.ledger.nowMs,
        },
      });
    }
  }

  // ---- the run -------------------------------------------------------------------------------

  async run(): Promise<QuotaSimResult> {
    let violation: QuotaViolation | undefined;
    try {
      this.setUp();
      while (this.q.runNext(this.duration)) {
        this.stats.events++;
        if (this.drain) {
          this.drain = false;
          await new Promise<void>((r) => setImmediate(r));
        }
      }
    } catch (e) {
      if (!(e instanceof Stop)) throw e;
      violation = e.violation;
    } finally {
      for (const a of this.agents) a.process?.client.stop();
    }
    for (const a of this.agents) this.stats.evictions += a.evictions + (a.process?.table.evictions ?? 0);
    // The lease rounds the leaders ran (a round on a follower, or refused for lack of a read barrier, is not one).
    for (const service of this.services) this.stats.rounds += service.stats.rounds;
    for (const service of this.services) this.stats.releasedSlicesDropped += service.stats.releasedSlicesDropped;
    return violation === undefined
      ? { ok: true, seed: this.seed, stats: this.stats, faults: this.faults }
      : { ok: false, seed: this.seed, violation, stats: this.stats, faults: this.faults };
  }

  setUp(): void {
    const f = this.fault;
    const offsets = f.chance(0.5);
    const rates = f.chance(0.4);
    for (let i = 1; i <= 3; i++) {
      const wallOffset = offsets ? f.range(-3_000, 3_000) : f.range(-50, 50);
      const rate = rates ? f.range(-MAX_RATE_ERROR, MAX_RATE_ERROR) : f.range(-1e-4, 1e-4);
      this.replicas.push(new Replica(this, `n${i}`, wallOffset, rate));
    }
    if (offsets)
      this.faults.push(`replica wall offsets ${this.replicas.map((r) => Math.round(r.wallOffsetMs)).join(', ')} ms`);
    if (rates)
      this.faults.push(`replica clock-rate errors ${this.replicas.map((r) => r.rateError.toFixed(3)).join(', ')}`);
    // Odd seeds: the log raised to this build's command format and agents holding at most LEASE_KEYS_RAISED keys, so
    // idle keys are evicted, released, and their slices dropped from the ledger (dropReleasedSlices) — then asked for
    // again when the load moves back. Even seeds: the base format with unbounded keys, as before (by the seed's
    // parity, so the other draws of every seed stay as they were).
    if (this.seed % 2 === 1) {
      this.commit({ type: 'raiseCommandFormat', format: NEWEST_COMMAND_FORMAT });
      this.leaseKeys = LEASE_KEYS_RAISED;
      this.faults.push(`log at command format ${NEWEST_COMMAND_FORMAT}, agents hold at most ${LEASE_KEYS_RAISED} keys`);
    }
    this.commit({ type: 'putTier', name: 'gold', ...TIERS.gold });
    this.commit({ type: 'putTier', name: 'silver', ...TIERS.silver });
    // Caps in some runs only: a run without them is tight on the tenant quotas alone.
    if (f.chance(0.4)) {
      this.commit({ type: 'putTierCap', tier: 'gold', ...GOLD_CAP });
      this.faults.push('tier gold capped');
    }
    if (f.chance(0.4)) {
      this.commit({ type: 'putDomainCap', domain: 'web', ...WEB_CAP });
      this.faults.push('domain web capped');
    }
    for (const t of TENANTS) this.commit({ type: 'putTenant', id: t.id, tier: t.tier });
    // A quota whose window (burst/rate, 20 s) is far longer than the skew margin: a cell's floor
    // then holds more than its grant refills over the margin, so a floor that took over late (the
    // time past the lease's end refilled at the grant's rate) shows in the cell's tokens.
    const longWindow = f.chance(0.5);
    if (longWindow) {
      this.commit({
        type: 'putTenant',
        id: 'initech',
        tier: 'silver',
        rate: LONG_WINDOW.rate,
        burst: LONG_WINDOW.burst,
      });
      this.faults.push(`initech has its own ${LONG_WINDOW.rate}/s, burst ${LONG_WINDOW.burst} quota`);
    }
    // What an agent running the pre-coordinator static share would use (the planted 'uncounted-static-share' only): the same definitions, its own file.
    const gold = this.ledger.getQuota('tier/gold');
    const web = this.ledger.getQuota('domain/web');
    this.staticFile = {
      tiers: {
        gold: {
          rate: TIERS.gold.rate,
          burst: TIERS.gold.burst,
          ...(gold === undefined ? {} : { cap: { rate: gold.rate, burst: gold.burst } }),
        },
        silver: { rate: TIERS.silver.rate, burst: TIERS.silver.burst },
      },
      tenants: Object.fromEntries(TENANTS.map((t) => [t.id, t.tier])),
      ...(web === undefined ? {} : { domainCap: { rate: web.rate, burst: web.burst } }),
    };
    this.leader = this.replicas[f.int(3)] as Replica;
    for (const r of this.replicas) r.start();

    const agentRates = f.chance(0.3);
    for (let i = 0; i < CELLS; i++) {
      const rateError = agentRates ? f.range(-MAX_RATE_ERROR, MAX_RATE_ERROR) : f.range(-1e-4, 1e-4);
      this.agentRateError = Math.max(this.agentRateError, Math.max(0, rateError));
      const a = new Agent(this, `cell-${i}`, i, rateError, f.range(1, 100_000));
      this.agents.push(a);
      const startAt = i === 0 || f.chance(0.5) ? f.range(0, 300) : f.range(300, 3_000);
      this.at(startAt, () => a.boot());
      this.at(f.range(0, 5), () => a.arrive(), false);
    }
    if (agentRates)
      this.faults.push(`agent clock-rate errors ${this.agents.map((a) => a.rateError.toFixed(3)).join(', ')}`);

    // Leader changes.
    const crashes = f.int(4);
    for (let k = 0; k < crashes; k++) {
      const t = f.range(1_000, this.duration - 500);
      const down = f.range(300, 3_000);
      const transfer = f.chance(0.4);
      this.at(t, () => {
        const old = this.leader;
        if (old === null) return;
        this.faults.push(
          `${Math.round(t)} ms: leader ${old.id} ${transfer ? 'transfers leadership' : `crashes for ${Math.round(down)} ms`}`,
        );
        if (!transfer) old.crash(down);
        this.loseLeader();
      });
    }
    // Agent faults.
    const during = (ms: number): number => f.range(500, Math.max(600, this.duration - ms - 500));
    for (const a of this.agents) {
      if (f.chance(0.5)) {
        const ms = f.chance(0.4) ? f.range(100, 1_500) : f.range(1_500, 7_000);
        a.planStall('main', during(ms), ms);
      }
      if (f.chance(0.35)) {
        const ms = f.range(100, 3_000);
        a.planStall('worker', during(ms), ms);
      }
      if (f.chance(0.15)) {
        const ms = f.range(300, 6_000);
        a.planStall('process', during(ms), ms);
      }
      if (f.chance(0.15)) a.planRestart(f.range(1_500, this.duration - 500), f.range(50, 2_000));
    }
    // Nothing touches a cell's buckets across its lease's end (a long-window quota shows what the
    // floor then refills, see LONG_WINDOW).
    // The cell is the one holding most of that quota when it happens.
    if (longWindow && f.chance(0.8)) {
      const quietMs = f.range(3_000, 4_500);
      const attempt = (): void => {
        const rateOf = (a: Agent): number => this.ledger.getSlice('tenant/initech', a.cell)?.rate ?? 0;
        const top = this.agents.reduce((x, y) => (rateOf(y) > rateOf(x) ? y : x));
        // Once some cell holds well above its floor (and while there is time left for the quiet).
        if (
          rateOf(top) >= (2 * LONG_WINDOW.rate * TIERS.silver.floorFraction) / CELLS &&
          top.process?.client.status().state === 'leased'
        )
          top.planQuietLeaseEnd(this.q.now, quietMs);
        else if (this.q.now < this.duration - quietMs - 3_000) this.at(this.q.now + 250, attempt, false);
      };
      this.at(f.range(800, 2_000), attempt, false);
    }
    if (f.chance(0.25)) {
      const cell = (this.agents[f.int(CELLS)] as Agent).cell;
      const from = f.range(1_000, this.duration - 1_000);
      this.partition = { cell, from, to: from + f.range(1_000, 6_000) };
      this.faults.push(`${Math.round(from)} ms: ${cell} cut off for ${Math.round(this.partition.to - from)} ms`);
    }
    // Definitions changing while leases are out.
    const changes = f.int(3);
    for (let k = 0; k < changes; k++) {
      const t = f.range(1_000, this.duration - 1_000);
      const what = f.int(4);
      this.at(t, () => {
        if (what === 0)
          this.admin(
            {
              type: 'putTier',
              name: 'gold',
              rate: this.fault.range(80, 300),
              burst: Math.round(this.fault.range(10, 60)),
              floorFraction: TIERS.gold.floorFraction,
            },
            'tier gold changes',
          );
        else if (what === 1)
          this.admin(
            { type: 'putTenant', id: 'globex', tier: this.fault.chance(0.5) ? 'silver' : 'gold' },
            'globex moves tier',
          );
        else if (what === 2)
          this.admin(
            {
              type: 'putTenant',
              id: 'acme',
              tier: 'gold',
              rate: this.fault.range(50, 300),
              burst: Math.round(this.fault.range(10, 60)),
            },
            'acme gets its own quota',
          );
        else
          this.admin(
            {
              type: 'putTierCap',
              tier: 'gold',
              rate: this.fault.range(100, 400),
              burst: Math.round(this.fault.range(20, 80)),
              floorFraction: GOLD_CAP.floorFraction,
            },
            'gold cap changes',
          );
      });
    }
    this.recordDefinitions();
    this.redrawLoad();
    this.at(0, () => this.traceNow(), false);
  }

  /** Demand mostly above the quota (the bound is tight only there), its skew moving between cells. */
  redrawLoad(): void {
    const r = this.load;
    TENANTS.forEach((t, i) => {
      this.demand[i] = r.chance(0.15) ? r.range(0, 0.5) * TIERS[t.tier].rate : r.range(0.9, 1.8) * TIERS[t.tier].rate;
      const row = this.shares[i] as number[];
      const top = r.int(CELLS);
      const topShare = r.range(0.5, 1);
      let rest = 1 - topShare;
      for (let c = 0; c < CELLS; c++) {
        if (c === top) continue;
        const x = r.chance(0.3) ? 0 : r.range(0, rest);
        row[c] = x;
        rest -= x;
      }
      row[top] = topShare + rest;
    });
    this.at(this.q.now + r.range(300, 2_000), () => this.redrawLoad(), false);
  }

  // ---- the network ----------------------------------------------------------------------------

  cutOff(cell: string): boolean {
    const p = this.partition;
    return p !== null && p.cell === cell && this.q.now >= p.from && this.q.now < p.to;
  }

  delay(): number {
    return this.net.chance(this.slowP) ? this.net.range(100, 900) : this.net.range(0.5, 25);
  }

  /** A report from `agent` to `address`: delivered (maybe twice, maybe late, maybe never); every answer comes back through `answer`. */
  send(agent: Agent, address: string, req: ReportRequestMessage, answer: (r: LeaseCallResult) => void): void {
    const copies = this.net.chance(this.dupP) ? 2 : 1;
    for (let c = 0; c < copies; c++) {
      if (this.cutOff(agent.cell) || this.net.chance(this.dropP)) continue;
      this.at(this.q.now + this.delay(), () => {
        if (this.cutOff(agent.cell)) return;
        const replica = this.replicas.find((r) => r.address === address);
        const back = (r: LeaseCallResult): void => {
          if (this.cutOff(agent.cell) || this.net.chance(this.dropP)) return;
          this.at(this.q.now + this.delay(), () => answer(r));
        };
        if (replica === undefined || !replica.up || replica.service === null) {
          back({ err: { code: grpc.status.UNAVAILABLE, details: 'connection refused' } });
          return;
        }
        this.stats.reports++;
        replica.service.submit(
          req,
          (res) => back({ res }),
          (e) => back({ err: 'code' in e ? leaseCallError(e) : { code: grpc.status.UNKNOWN, details: e.message } }),
        );
      });
    }
  }
}

/** Adds `hits` at `now` to the window of `key` and drops what fell out of the last WINDOW_MS (closed). */
function slide(map: Map<string, Window>, key: string, now: number, hits: number): Window {
  let w = map.get(key);
  if (w === undefined) map.set(key, (w = { times: [], hits: [], head: 0, sum: 0 }));
  w.times.push(now);
  w.hits.push(hits);
  w.sum += hits;
  while ((w.times[w.head] as number) < now - WINDOW_MS) {
    w.sum -= w.hits[w.head] as number;
    w.head++;
  }
  if (w.head > 4096) {
    w.times.splice(0, w.head);
    w.hits.splice(0, w.head);
    w.head = 0;
  }
  return w;
}

/**
 * One direction of a worker_threads MessagePort, read by `thread`: messages are delivered in the
 * order they were posted (the port's message queue is FIFO: receiveMessageOnPort takes "the oldest
 * message in the MessagePort's queue", and the 'message' events follow the same queue), each no
 * earlier than its own time and, on a stalled thread, after the socket reads it queued meanwhile.
 * A message that is due cannot overtake an earlier one still waiting for a stalled thread: it is
 * delivered right after it. (Scheduling each message as its own thread event let a message posted
 * just after a stall ended run before one deferred by the stall: a worker applied lease batch 4,
 * then batch 3 over it, and decided for a second on a grant the main thread had acknowledged as
 * replaced. Seed 10223; agent-workers.ts counts confirmations on this order.)
 */
class Port {
  private readonly queue: { readonly at: number; readonly fn: () => void }[] = [];
  private lastAt = 0;

  constructor(
    private readonly sim: Simulation,
    private readonly thread: Thread,
    private readonly async: boolean,
  ) {}

  /** Posts a message the reader takes at `at` or later (never before one posted earlier). */
  post(at: number, fn: () => void): void {
    const due = Math.max(at, this.lastAt);
    this.lastAt = due;
    this.queue.push({ at: due, fn });
    this.sim.on(this.thread, due, () => this.deliver(), this.async, true);
  }

  /** Every message due by now, oldest first (their own events then find them gone). */
  private deliver(): void {
    const now = this.sim.q.now;
    while (this.queue.length > 0 && (this.queue[0] as { at: number }).at <= now) {
      const m = this.queue.shift() as { fn: () => void };
      m.fn();
    }
  }
}

// ---- coordinator replicas ---------------------------------------------------------------------

class Replica {
  readonly address: string;
  up = true;
  service: LeaseService | null = null;
  private monoBase = 0;
  private generation = 0;

  constructor(
    readonly sim: Simulation,
    readonly id: string,
    readonly wallOffsetMs: number,
    readonly rateError: number,
  ) {
    this.address = `${id}.coordinators:7000`;
  }

  monoMs(): number {
    return this.monoBase + this.sim.q.now * (1 + this.rateError);
  }

  /** Real ms from now until this replica's monotonic clock ran `ms`. */
  realFor(ms: number): number {
    return ms / (1 + this.rateError);
  }

  start(): void {
    const sim = this.sim;
    this.generation++;
    const gen = this.generation;
    this.monoBase = sim.fault.range(0, 1e6);
    const backend: LeaseBackend = {
      id: this.id,
      isLeader: () => this.up && sim.leader === this,
      leaderId: () => sim.leader?.id ?? null,
      term: () => sim.term,
      readBarrier: () =>
        new Promise<void>((resolve, reject) => {
          const term = sim.term;
          sim.at(sim.q.now + sim.net.range(1, 30), () =>
            sim.leader === this && sim.term === term && this.up ? resolve() : reject(new Error('not the leader')),
          );
        }),
      peerAddress: (id) => sim.replicas.find((r) => r.id === id)?.address ?? null,
      ledger: () => sim.ledger,
      propose: (cmd) => sim.propose(this, cmd),
    };
    this.service = this.sim.track(
      new LeaseService({
        backend,
        logger: SILENT,
        leaseTtlMs: LEASE_TTL_MS,
        roundMs: ROUND_MS,
        expireEveryMs: EXPIRE_EVERY_MS,
        monoMs: () => this.monoMs(),
        wallMs: () => WALL_BASE_MS + this.wallOffsetMs + sim.q.now * (1 + this.rateError),
      }),
    );
    // Its timers, on its own clock.
    const service = this.service;
    const every = (ms: number, fn: () => void): void => {
      const tick = (): void => {
        if (this.generation !== gen || !this.up) return;
        fn();
        sim.at(sim.q.now + this.realFor(ms), tick);
      };
      sim.at(sim.q.now + sim.fault.range(0, this.realFor(ms)), tick);
    };
    every(ROUND_MS, () => void service.round());
    every(EXPIRE_EVERY_MS, () => void service.expire());
  }

  crash(downMs: number): void {
    this.up = false;
    this.service = null; // its memory is gone; held reports are never answered
    this.generation++;
    this.sim.at(this.sim.q.now + downMs, () => {
      this.up = true;
      this.start();
      if (this.sim.leader === null) this.sim.elect();
    });
  }
}

// ---- agents -----------------------------------------------------------------------------------

/** One agent process: what a restart throws away. */
interface AgentProcess {
  readonly main: Thread;
  readonly workers: readonly Thread[];
  readonly table: BucketTable;
  readonly client: LeaseClient;
  /** Per thread (main first): its Decider. */
  readonly deciders: readonly Decider[];
  /** Per quota key, when a decider of this process first evaluated it (its bucket starts empty no earlier). */
  readonly firstSeen: Map<string, number>;
}

class Agent {
  process: AgentProcess | null = null;
  evictions = 0;
  private readonly offsetNs: number;
  private incarnations = 0;
  private users = 0;

  constructor(
    readonly sim: Simulation,
    readonly cell: string,
    readonly index: number,
    readonly rateError: number,
    offsetS: number,
  ) {
    this.offsetNs = offsetS * 1e9;
  }

  nowNs(): bigint {
    return BigInt(Math.floor(this.offsetNs + this.sim.q.now * 1e6 * (1 + this.rateError)));
  }

  monoMs(): number {
    return (this.offsetNs + this.sim.q.now * 1e6 * (1 + this.rateError)) / 1e6;
  }

  /** Real ms at which this agent's monotonic clock reads `ms`. */
  realAt(ms: number): number {
    return (ms * 1e6 - this.offsetNs) / (1e6 * (1 + this.rateError));
  }

  boot(): void {
    const sim = this.sim;
    const main: Thread = { name: `${this.cell}/main`, stalledUntil: 0 };
    const workers: Thread[] = Array.from({ length: WORKERS }, (_, i) => ({
      name: `${this.cell}/worker-${i}`,
      stalledUntil: 0,
    }));
    const table = new BucketTable({ capacity: 12 + sim.fault.int(40), startNs: 0n, seed: sim.fault.int(1 << 30) });
    const velocityTable = VelocityTable.create({ capacity: 64, startNs: 0n, seed: sim.fault.int(1 << 30) });
    const velocityKeys = new VelocityKeys(velocityTable);
    velocityTable.onNewKey = (slot, gen, key) => velocityKeys.learn(slot, gen, key);
    const deadline = LeaseDeadline.create();
    const fallback = new StaticQuotas(sim.staticFile, { staticShare: 1 / CELLS, unknownTenant: { kind: 'deny' } });
    // What the deciders record as admitted under each quota: the window the bound is checked on.
    const tap = (thread: Thread): VelocityRecorder => ({
      record: (key, allowed, refused, nowNs) => {
        velocityTable.record(key, allowed, refused, nowNs);
        if (!firstSeen.has(key)) firstSeen.set(key, sim.q.now);
        if (allowed > 0) this.consumed.push({ key, hits: allowed, thread: thread.name });
      },
    });
    const overridesOf: QuotaOverrides[] = [];
    const firstSeen = new Map<string, number>();
    const deciders = [main, ...workers].map((thread) => {
      const overrides = new QuotaOverrides(LeaseDeadline.attach(deadline.shared));
      overridesOf.push(overrides);
      const d = new Decider(
        {
          table,
          quotas: new CoordinatedQuotas(overrides, fallback),
          clock: () => this.nowNs(),
          velocity: tap(thread),
          overrides,
          deadline: LeaseDeadline.attach(deadline.shared),
        },
        {
          bounds: DEFAULT_REQUEST_BOUNDS,
          responseHeaders: false,
          tableFull: 'closed',
          staticSlices: false,
          cell: this.cell,
        },
      );
      d.setRules(RULES);
      return d;
    });
    // agent-main.ts's wiring: the main thread applies, posts to every worker, and the batch counts as
    // applied once every worker confirmed it.
    let seq = 0;
    const confirmed = workers.map(() => 0);
    // Each worker's port, both ways: the entries to it, its confirmations back to the main thread.
    const toWorker = workers.map((w) => new Port(sim, w, false));
    const toMain = workers.map(() => new Port(sim, main, true));
    const waiters: { seq: number; resolve: () => void }[] = [];
    const settle = (): void => {
      for (let i = waiters.length - 1; i >= 0; i--) {
        const w = waiters[i] as { seq: number; resolve: () => void };
        if (confirmed.every((c) => c >= w.seq)) {
          waiters.splice(i, 1);
          w.resolve();
        }
      }
    };
    const onOverrides = (entries: OverrideEntry[]): Promise<void> => {
      applyLeaseEntries(table, overridesOf[0] as QuotaOverrides, entries, this.nowNs());
      const s = ++seq;
      workers.forEach((_w, i) => {
        // A busy worker may read its sockets before its message port: the entries reach it late.
        const lag = sim.net.chance(sim.portLagP) ? sim.net.range(100, 1_500) : sim.net.range(0.01, 3);
        (toWorker[i] as Port).post(sim.q.now + lag, () => {
          applyLeaseEntries(table, overridesOf[i + 1] as QuotaOverrides, entries, this.nowNs());
          (toMain[i] as Port).post(sim.q.now + sim.net.range(0.01, 3), () => {
            confirmed[i] = Math.max(confirmed[i] as number, s);
            settle();
          });
        });
      });
      return new Promise<void>((resolve) => waiters.push({ seq: s, resolve }));
    };
    const timers: LeaseTimers = {
      setTimeout: (fn, ms) => {
        const handle = { cancelled: false };
        sim.on(main, Math.max(sim.q.now, this.realAt(this.monoMs() + ms)), () => {
          if (!handle.cancelled) fn();
        });
        return handle;
      },
      clearTimeout: (h) => {
        (h as { cancelled: boolean }).cancelled = true;
      },
    };
    const transport: LeaseTransport = {
      report: (address, req, deadlineMs) =>
        new Promise<LeaseCallResult>((resolve) => {
          let done = false;
          const finish = (r: LeaseCallResult): void => {
            if (done) return;
            done = true;
            resolve(r);
          };
          sim.on(main, Math.max(sim.q.now, this.realAt(this.monoMs() + deadlineMs)), () =>
            finish({ err: { code: grpc.status.DEADLINE_EXCEEDED, details: 'deadline exceeded' } }),
          );
          sim.send(this, address, req, (r) => sim.on(main, sim.q.now, () => finish(r)));
        }),
      close: () => undefined,
    };
    const random = sim.rng.fork();
    const client = new LeaseClient({
      cellId: this.cell,
      coordinators: sim.replicas.map((r) => r.address),
      logger: SILENT,
      velocity: () => velocityKeys.snapshot(this.nowNs()),
      onOverrides,
      intervalMs: REPORT_MS,
      monotonicMs: () => this.monoMs(),
      deadline: deadlineWriter(deadline, 0n),
      transport,
      timers,
      wallMs: () => WALL_BASE_MS + this.monoMs(),
      random: () => random.float(),
      newIncarnation: () => `${this.cell}-${++this.incarnations}`,
      ...(sim.leaseKeys === undefined ? {} : { maxKeys: sim.leaseKeys }),
    });
    this.process = { main, workers, table, client, deciders, firstSeen };
    sim.on(main, sim.q.now, () => client.start());
  }

  private readonly consumed: { key: string; hits: number; thread: string }[] = [];
  /** No request reaches the cell before this (its clients went elsewhere). */
  quietUntil = 0;

  /**
   * The main thread stalls at `at` (no report, no timer) and the cell's clients go quiet from the
   * moment its lease ends until `quietMs` after: nothing touches its buckets across the lease's end,
   * then the workers decide again on the floors while the main thread is still stalled.
   */
  planQuietLeaseEnd(at: number, quietMs: number): void {
    const sim = this.sim;
    sim.at(
      at,
      () => {
        const p = this.process;
        if (p === null) return;
        const st = p.client.status();
        if (st.state !== 'leased') return;
        const endsAt = sim.q.now + st.leaseRemainingMs / (1 + this.rateError);
        const stall = endsAt - sim.q.now + quietMs + 500;
        sim.faults.push(
          `${Math.round(at)} ms: ${this.cell} main thread stalled for ${Math.round(stall)} ms, its clients quiet for ${Math.round(quietMs)} ms from its lease's end`,
        );
        sim.stats.mainStalls++;
        p.main.stalledUntil = Math.max(p.main.stalledUntil, sim.q.now + stall);
        sim.at(
          endsAt,
          () => {
            this.quietUntil = Math.max(this.quietUntil, sim.q.now + quietMs);
          },
          false,
        );
      },
      false,
    );
  }

  planStall(what: 'main' | 'worker' | 'process', at: number, ms: number): void {
    const sim = this.sim;
    sim.at(
      at,
      () => {
        const p = this.process;
        if (p === null) return;
        sim.faults.push(
          `${Math.round(at)} ms: ${this.cell} ${what === 'process' ? 'SIGSTOPped' : `${what} thread stalled`} for ${Math.round(ms)} ms`,
        );
        const until = sim.q.now + ms;
        if (what === 'main') {
          sim.stats.mainStalls++;
          p.main.stalledUntil = Math.max(p.main.stalledUntil, until);
        } else if (what === 'worker') {
          sim.stats.workerStalls++;
          const w = p.workers[sim.fault.int(p.workers.length)] as Thread;
          w.stalledUntil = Math.max(w.stalledUntil, until);
        } else {
          // SIGCONT: the workers read their queued requests before the main thread's timers run.
          sim.stats.sigstops++;
          for (const w of p.workers) w.stalledUntil = Math.max(w.stalledUntil, until);
          p.main.stalledUntil = Math.max(p.main.stalledUntil, until + sim.fault.range(0, 20));
        }
      },
      false,
    );
  }

  /** When the cell's buckets for `key` began refilling, for a window that may still hold the previous process's admissions. */
  private since(p: AgentProcess, key: string): number {
    const now = this.sim.q.now;
    const cur = p.firstSeen.get(key) ?? now;
    const old = this.previous?.firstSeen.get(key);
    return old !== undefined && now - WINDOW_MS <= this.previous!.stoppedAt ? Math.min(old, cur) : cur;
  }

  private previous: { readonly firstSeen: ReadonlyMap<string, number>; readonly stoppedAt: number } | null = null;

  planRestart(at: number, downMs: number): void {
    const sim = this.sim;
    sim.at(at, () => {
      const p = this.process;
      if (p === null) return;
      sim.faults.push(`${Math.round(at)} ms: ${this.cell} restarts (down ${Math.round(downMs)} ms)`);
      sim.stats.restarts++;
      this.evictions += p.table.evictions;
      p.client.stop();
      this.previous = { firstSeen: p.firstSeen, stoppedAt: sim.q.now };
      this.process = null;
      sim.at(sim.q.now + downMs, () => this.boot());
    });
  }

  /** One Poisson stream of requests at the cell's total demand (memoryless: redrawn at least every 50 ms, so a change of demand takes effect promptly). */
  arrive(request = false): void {
    const sim = this.sim;
    const mine = TENANTS.map((_, t) => (sim.demand[t] as number) * ((sim.shares[t] as number[])[this.index] as number));
    const total = mine.reduce((x, y) => x + y, 0);
    if (request && total > 0 && this.process !== null && sim.q.now >= this.quietUntil) this.request(mine, total);
    const gap = total > 0 ? (-Math.log(1 - sim.load.float()) * 1000) / total : Infinity;
    if (gap <= 50) sim.at(sim.q.now + gap, () => this.arrive(true), false);
    else sim.at(sim.q.now + 50, () => this.arrive(false), false);
  }

  private request(demand: readonly number[], total: number): void {
    const sim = this.sim;
    const p = this.process as AgentProcess;
    const r = sim.load;
    let pick = r.float() * total;
    let ti = 0;
    while (ti < TENANTS.length - 1 && pick >= (demand[ti] as number)) pick -= demand[ti++] as number;
    const tenant = (TENANTS[ti] as { id: string }).id;
    const hits = r.chance(0.1) ? 1 + r.int(3) : null;
    const shape = r.int(4);
    const entries = (pairs: [string, string][]): { key: string; value: string }[] =>
      pairs.map(([key, value]) => ({ key, value }));
    let req: RlsRequest;
    if (shape === 0)
      req = {
        domain: 'api',
        descriptors: [{ entries: entries([['tenant', tenant]]), limit: null, hitsAddend: hits }],
        hitsAddend: 0,
      };
    else if (shape === 1)
      req = {
        domain: 'api',
        descriptors: [
          {
            entries: entries([
              ['route', 'upload'],
              ['tenant', tenant],
            ]),
            limit: null,
            hitsAddend: hits,
          },
        ],
        hitsAddend: 0,
      };
    else if (shape === 2)
      req = {
        domain: 'web',
        descriptors: [{ entries: entries([['customer', tenant]]), limit: null, hitsAddend: hits }],
        hitsAddend: 0,
      };
    else
      req = {
        domain: 'api',
        descriptors: [
          { entries: entries([['tenant', tenant]]), limit: null, hitsAddend: hits },
          { entries: entries([['user', `u${(this.users = (this.users + 1) % 97)}`]]), limit: null, hitsAddend: hits },
        ],
        hitsAddend: 0,
      };
    const t = r.float() < 0.1 ? 0 : 1 + r.int(p.workers.length);
    const thread = t === 0 ? p.main : (p.workers[t - 1] as Thread);
    const decider = p.deciders[t] as Decider;
    sim.on(
      thread,
      sim.q.now,
      () => {
        if (this.process !== p) return; // the process is gone: nobody decides
        this.consumed.length = 0;
        const d = decider.decide(req);
        sim.stats.decisions++;
        if (!d.ok) throw new Error(`simulation request refused as malformed: ${d.failure.message}`);
        if (d.decision.overLimit) return;
        sim.stats.admitted++;
        const need = hits ?? 1;
        const own = this.consumed.find((c) => c.key === `tenant/${tenant}`);
        if (own === undefined || own.hits < need) {
          throw new Stop({
            kind: 'consumed',
            atMs: sim.q.now,
            message: `${this.cell} admitted ${need} for tenant/${tenant} without counting them under its quota`,
            evidence: { consumed: [...this.consumed], req: JSON.stringify(req) },
          });
        }
        for (const c of this.consumed.splice(0)) sim.admitted(this.cell, c.key, c.hits, this.since(p, c.key));
      },
      false,
    );
  }
}
