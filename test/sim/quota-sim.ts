// The deterministic whole-system quota simulation: a coordinator and N cell agents in simulated time,
// every source of nondeterminism (network delays and drops, commit delays, elections, arrivals,
// clocks, faults) drawn from one seed, so a seed replays a run exactly.
//
// Real code: the committed state is the real `Ledger` (reportAndGrant / expireLeases entries applied
// as the Raft log would apply them, one ledger standing for every replica), the grants of a round come
// from the real grant policy (`allocatorPolicy`: the allocator fed from the ledger's QuotaStates), and
// every admission decision is the real GCRA (`limitFromRate`, `gcraInitialTat` empty start,
// `gcraReconfigure` when a key's limit changes — lazily at the next take, as the shared bucket table
// does — and `gcraTake`).
//
// Modelled: the leader's round loop (lease-service.ts: reports held until the round committed,
// renewals at receipt time + TTL, acks that still change something, ONE reportAndGrant entry per round,
// retried without grants if refused, answers from the committed ledger with the grants newer than the
// incarnation acknowledged, expireLeases when a lease surely expired), Raft as "commit after a random
// delay" (a leader crash loses the uncommitted round, or lets the next leader commit it unanswered; a
// new leader takes over the committed ledger after an election delay with empty sessions and demands),
// and the agent's lease client (lease-client.ts: a report every 500 ms of its own clock with a 400 ms
// deadline and backoff, the lease counted from the SEND time of the last answered report, grants
// applied after a short delay and only then acknowledged, every key to its floor on expiry with a new
// incarnation). Each agent has its own clock (offset and rate drift).
//
// Checks, after every event (the first three whenever an agent's limit or the ledger changed, the
// only events that can move them):
//   - allocation: for every quota, Σ over cells of the limit each agent actually has in force
//     (max(grant, floor) while leased, else its floor; the old limit until a new one is applied) is
//     ≤ the quota's rate and burst — from the agents' state, not from the ledger's bookkeeping;
//   - undercount: cell by cell, what the agent has in force ≤ what the committed ledger counts it at
//     (a cross-check that points at the cell when the ledger's accounting and the agents disagree);
//   - the ledger's own invariants (checkInvariants) after every commit;
//   - the bound: over every 1 s window (closed, ending at each admission) the cells together admit
//     ≤ rate × 1 s + burst. Exact: one request over is a violation, reported with its evidence.
import { Ledger } from '../../coordinator/ledger/ledger.js';
import type { LedgerCommandInput, Grant, GrantAck, LeaseRenewal } from '../../coordinator/ledger/ledger-commands.js';
import { tenantKey } from '../../coordinator/ledger/ledger-commands.js';
import { allocatorPolicy } from '../../coordinator/lease/grant-policy.js';
import { gcraInitialTat, gcraReconfigure, gcraTake, limitFromRate } from '../../cell-agent/buckets/gcra.js';
import type { GcraLimit } from '../../cell-agent/buckets/gcra.js';
import { EventQueue } from './sim-queue.js';
import { Rng } from './sim-rng.js';

export const QUOTA_SCENARIOS = ['skewed', 'moving', 'partition', 'failover', 'outage', 'clock-skew'] as const;
export type QuotaScenario = (typeof QUOTA_SCENARIOS)[number];

export interface QuotaPlantedBugs {
  /** Agents keep using their grants after their lease expired (never fall to floors). */
  readonly ignoreLeaseExpiry?: boolean;
  /** A global bucket whose limit changes is refilled (restarts full) instead of keeping its level. */
  readonly refillOnChange?: boolean;
  /** The leader treats every grant it sent as acknowledged (it forges the acks into the round), so a
   * shrink's capacity goes to another cell's grow before the shrunk cell has applied it. */
  readonly forgeAcks?: boolean;
}

export interface QuotaSimOptions {
  readonly seed: number;
  /** Default: drawn from the seed. */
  readonly scenario?: QuotaScenario;
  /** Simulated ms (default 10,000). */
  readonly durationMs?: number;
  readonly cells?: number;
  readonly plantedBugs?: QuotaPlantedBugs;
  /** Check Σ of the agents' limits in force (default true; off to show the window check alone finds a bug). */
  readonly checkAllocation?: boolean;
  /** Check each agent's limit in force against what the ledger counts it at (default true). */
  readonly checkUndercount?: boolean;
}

export interface QuotaViolation {
  /** allocation: Σ of the agents' limits in force over the quota; undercount: a cell uses more than the
   * ledger counts it at; ledger: the ledger's own invariants; bound: a 1 s window over rate + burst. */
  readonly kind: 'allocation' | 'undercount' | 'bound' | 'ledger';
  readonly atMs: number;
  readonly message: string;
  readonly evidence: Record<string, unknown>;
}

export interface QuotaSimStats {
  scenario: QuotaScenario;
  events: number;
  admitted: number;
  refused: number;
  reports: number;
  reportsFailed: number;
  rounds: number;
  refusedRounds: number;
  lostRounds: number;
  expireEntries: number;
  leaderChanges: number;
  agentExpiries: number;
  grantsApplied: number;
  /** Largest count admitted over a 1 s window, and the bound it must stay under. */
  maxWindowAdmitted: number;
  bound: number;
  /** Largest Σ of the rates in force seen (≤ the quota). */
  maxSumRate: number;
  /** Admitted per second over the steady part (from 4 s on) vs the quota (skewed overload scenarios). */
  steadyAdmittedRate: number | null;
  /** Time-average of Σ over cells of the rate in force over the same steady part (what was allocated). */
  steadyAllocatedRate: number | null;
  /** ms from a load move until the new cell's last 500 ms admitted ≥ 90% of its demand (moving scenarios; includes that 500 ms). */
  takeoverMs: number | null;
}

export interface QuotaSimResult {
  readonly ok: boolean;
  readonly seed: number;
  readonly violation?: QuotaViolation;
  readonly stats: QuotaSimStats;
}

// ---- constants of the modelled deployment --------------------------------------------------------

const TENANT = 't1';
const KEY = tenantKey(TENANT);
const RATE = 200;
const BURST = 40;
const FLOOR_FRACTION = 0.3;
const LEASE_TTL_MS = 3_000;
const SKEW_MARGIN_MS = 1_000;
const ROUND_MS = 100;
const EXPIRE_EVERY_MS = 1_000;
const REPORT_MS = 500;
const DEADLINE_MS = 400;
const WINDOW_MS = 1_000;
const STEADY_FROM_MS = 4_000;

class Stop extends Error {
  constructor(readonly violation: QuotaViolation) {
    super(violation.message);
  }
}

// ---- agents ----------------------------------------------------------------------------------------

interface HeldGrant {
  readonly epoch: number;
  readonly rate: number;
  readonly burst: number;
  readonly floorRate: number;
  readonly floorBurst: number;
}

interface InForce {
  rate: number;
  burst: number;
  leased: boolean;
  limit: GcraLimit;
}

interface ReportMsg {
  readonly cellId: string;
  readonly incarnation: string;
  readonly callId: number;
  readonly acks: { key: string; epoch: number }[];
  readonly demand: number;
}

interface GrantMsg extends HeldGrant {
  readonly key: string;
}

interface AnswerMsg {
  readonly callId: number;
  readonly leaseTtlMs: number;
  readonly grants: GrantMsg[];
}

class Agent {
  readonly id: string;
  /** Agent clock: offset + real × (1 + drift). */
  readonly offsetMs: number;
  readonly drift: number;
  incarnationN = 0;
  state: 'none' | 'leased' | 'expired' = 'none';
  leaseExpiresAt = -Infinity;
  readonly grants = new Map<string, HeldGrant>();
  pendingAcks = new Map<string, number>();
  inFlight: { callId: number; sentAt: number; acks: [string, number][] } | null = null;
  failures = 0;
  inForce: InForce;
  tat: bigint | null = null;
  bucketLimit: GcraLimit | null = null;
  allowedInWindow = 0;
  refusedInWindow = 0;
  /** Real times of this cell's admissions in the last 500 ms (takeover measurement). */
  readonly recent: number[] = [];
  readonly floorRate: number;
  readonly floorBurst: number;

  constructor(id: string, offsetMs: number, drift: number, floorRate: number, floorBurst: number) {
    this.id = id;
    this.offsetMs = offsetMs;
    this.drift = drift;
    this.floorRate = floorRate;
    this.floorBurst = floorBurst;
    // Before any grant the agent runs on its static share, the floor.
    this.inForce = { rate: floorRate, burst: floorBurst, leased: false, limit: limitFromRate(floorRate, Math.floor(floorBurst + 1e-9)) };
  }

  get incarnation(): string {
    return `${this.id}-${this.incarnationN}`;
  }
  clock(realMs: number): number {
    return this.offsetMs + realMs * (1 + this.drift);
  }
  realAt(agentMs: number): number {
    return (agentMs - this.offsetMs) / (1 + this.drift);
  }
}

// ---- the simulation -------------------------------------------------------------------------------

interface Pending {
  readonly report: ReportMsg;
  readonly receiptMs: number;
}

interface Proposal {
  readonly term: number;
  readonly cmd: LedgerCommandInput;
  readonly batch: Pending[] | null;
  readonly withGrants: boolean;
  readonly leases: LeaseRenewal[];
  readonly acks: GrantAck[];
}

interface Load {
  /** Arrivals per second at cell i at real time t. */
  (cell: number, t: number): number;
}

export function runQuotaSimulation(opts: QuotaSimOptions): QuotaSimResult {
  const rng = new Rng(opts.seed);
  const scenario: QuotaScenario = opts.scenario ?? rng.pick(QUOTA_SCENARIOS);
  const duration = opts.durationMs ?? 10_000;
  const nCells = opts.cells ?? 3;
  const bugs = opts.plantedBugs ?? {};
  const checkAllocation = opts.checkAllocation ?? true;
  const checkUndercount = opts.checkUndercount ?? true;
  /** The agents' limits or the ledger changed since the last check (nothing else moves either side). */
  let dirty = true;
  const q = new EventQueue();
  const net = rng.fork();
  const arrivals = rng.fork();
  const faults = rng.fork();

  const stats: QuotaSimStats = {
    scenario,
    events: 0,
    admitted: 0,
    refused: 0,
    reports: 0,
    reportsFailed: 0,
    rounds: 0,
    refusedRounds: 0,
    lostRounds: 0,
    expireEntries: 0,
    leaderChanges: 0,
    agentExpiries: 0,
    grantsApplied: 0,
    maxWindowAdmitted: 0,
    bound: RATE * (WINDOW_MS / 1000) + BURST,
    maxSumRate: 0,
    steadyAdmittedRate: null,
    steadyAllocatedRate: null,
    takeoverMs: null,
  };

  // ---- the committed state: the real ledger --------------------------------------------------
  const ledger = new Ledger({ floorCells: nCells, skewMarginMs: SKEW_MARGIN_MS });
  let index = 0;
  const commit = (cmd: LedgerCommandInput): ReturnType<Ledger['apply']> => {
    const r = ledger.apply(cmd, ++index);
    dirty = true;
    try {
      ledger.checkInvariants();
    } catch (e) {
      throw new Stop({ kind: 'ledger', atMs: q.now, message: `ledger invariant: ${e instanceof Error ? e.message : String(e)}`, evidence: { index } });
    }
    return r;
  };
  commit({ type: 'putTier', name: 'gold', rate: RATE, burst: BURST, floorFraction: FLOOR_FRACTION });
  commit({ type: 'putTenant', id: TENANT, tier: 'gold' });
  const floorRate = (FLOOR_FRACTION * RATE) / nCells;
  const floorBurst = (FLOOR_FRACTION * BURST) / nCells;

  // ---- scenario: clocks, load, faults ------------------------------------------------------------
  const skewed = scenario === 'clock-skew';
  const agents: Agent[] = [];
  for (let i = 0; i < nCells; i++) {
    // Within the margin: a slow clock stretches the agent's lease in real time (TTL / (1 + drift) must
    // stay below TTL + margin); a fast one speeds its buckets, kept to quartz-like drift (±100 ppm).
    const drift = skewed ? faults.range(-0.15, 1e-4) : faults.range(-1e-4, 1e-4);
    const offset = skewed ? faults.range(-60_000, 60_000) : faults.range(-50, 50);
    agents.push(new Agent(`cell-${i}`, offset, drift, floorRate, floorBurst));
  }
  for (const a of agents) commit({ type: 'registerCell', cellId: a.id, nowMs: 0 });

  const overload = 3 * RATE;
  const share = [0.7, 0.2, 0.1];
  const skewedLoad: Load = (i) => overload * (nCells === 3 ? (share[i] ?? 0) : 1 / nCells);
  const moveAt = faults.range(3_000, Math.max(3_500, duration / 2));
  const from = faults.int(nCells);
  const to = (from + 1 + faults.int(nCells - 1)) % nCells;
  const moveDemand = 0.8 * RATE;
  const movingLoad: Load = (i, t) => (i === (t < moveAt ? from : to) ? moveDemand : 0);
  let load: Load;
  let measureMove = false;
  let partition: { cell: number; from: number; to: number } | null = null;
  let crashAt: number | null = null;
  let outage: { from: number; to: number } | null = null;
  switch (scenario) {
    case 'skewed':
      load = skewedLoad;
      break;
    case 'moving':
      load = movingLoad;
      measureMove = true;
      break;
    case 'partition': {
      load = skewedLoad;
      const start = faults.range(1_500, duration / 2);
      partition = { cell: faults.int(nCells), from: start, to: start + faults.range(2_000, 6_000) };
      break;
    }
    case 'failover':
      load = movingLoad;
      measureMove = true;
      crashAt = moveAt + faults.range(0, 1_200); // mid-rebalance: shrinks and grows in flight
      break;
    case 'outage': {
      load = (i, t) => (t < duration / 2 ? skewedLoad(i, t) : skewedLoad((i + 1) % nCells, t));
      const start = faults.range(1_500, duration / 2);
      outage = { from: start, to: start + faults.range(1_000, 6_000) };
      break;
    }
    case 'clock-skew':
      load = (i, t) => skewedLoad((i + Math.floor(t / 3_000)) % nCells, t);
      break;
  }
  const dropP = faults.range(0, 0.05);
  const delay = (): number => net.range(1, 30);
  const cutOff = (cell: number, t: number): boolean => partition !== null && partition.cell === cell && t >= partition.from && t < partition.to;

  // ---- the coordinator -----------------------------------------------------------------------
  let term = 1;
  let leaderUp = true;
  let leaderOffset = 0;
  let pending: Pending[] = [];
  let inFlight: Proposal | null = null;
  let sessions = new Map<string, { incarnation: string; acked: Map<string, number> }>();
  let demands = new Map<string, number>();
  const coordClock = (): number => Math.max(0, q.now + leaderOffset);

  const session = (cellId: string, incarnation: string): { incarnation: string; acked: Map<string, number> } => {
    let s = sessions.get(cellId);
    if (s === undefined || s.incarnation !== incarnation) {
      s = { incarnation, acked: new Map() };
      sessions.set(cellId, s);
    }
    return s;
  };

  const propose = (p: Proposal): void => {
    inFlight = p;
    q.schedule(q.now + net.range(2, 60), () => {
      if (inFlight !== p || p.term !== term || !leaderUp) return; // lost with the leader
      inFlight = null;
      applyProposal(p, true);
    });
  };

  const applyProposal = (p: Proposal, answer: boolean): void => {
    const r = commit(p.cmd);
    if (p.cmd.type === 'expireLeases') return;
    if (!r.ok && p.withGrants && answer && p.batch !== null) {
      stats.refusedRounds++;
      propose({ ...p, cmd: { type: 'reportAndGrant', nowMs: Math.max(coordClock(), ledger.nowMs), leases: p.leases, acks: p.acks }, withGrants: false });
      return;
    }
    if (!r.ok) return;
    stats.rounds++;
    if (!answer || p.batch === null) return;
    for (const { report } of p.batch) {
      const s = session(report.cellId, report.incarnation);
      const grants: GrantMsg[] = [];
      for (const key of ledger.activeQuotaKeys()) {
        const sl = ledger.getSlice(key, report.cellId);
        if (sl === undefined || sl.epoch === 0 || sl.epoch <= (s.acked.get(key) ?? 0)) continue;
        grants.push({ key, rate: sl.rate, burst: sl.burst, epoch: sl.epoch, floorRate: sl.floorRate, floorBurst: sl.floorBurst });
      }
      const agent = agents.find((a) => a.id === report.cellId);
      if (agent !== undefined) send(agent, () => onAnswer(agent, { callId: report.callId, leaseTtlMs: LEASE_TTL_MS, grants }));
    }
  };

  const round = (): void => {
    if (!leaderUp || inFlight !== null || pending.length === 0) return;
    const batch = pending;
    pending = [];
    const latest = new Map<string, Pending>();
    for (const p of batch) {
      const prev = latest.get(p.report.cellId);
      if (prev === undefined || prev.receiptMs <= p.receiptMs) latest.set(p.report.cellId, p);
    }
    const acks: GrantAck[] = [];
    for (const { report } of batch) {
      const s = session(report.cellId, report.incarnation);
      if (report.demand > 0) demands.set(report.cellId, report.demand);
      else demands.delete(report.cellId);
      for (const a of report.acks) {
        if ((s.acked.get(a.key) ?? 0) < a.epoch) s.acked.set(a.key, a.epoch);
        const sl = ledger.getSlice(a.key, report.cellId);
        if (sl !== undefined && sl.epoch === a.epoch && !sl.acknowledged && !acks.some((x) => x.cellId === report.cellId && x.key === a.key)) {
          acks.push({ key: a.key, cellId: report.cellId, epoch: a.epoch });
        }
      }
    }
    if (bugs.forgeAcks ?? false) {
      for (const cellId of latest.keys()) {
        const sl = ledger.getSlice(KEY, cellId);
        if (sl !== undefined && sl.epoch > 0 && !sl.acknowledged && !acks.some((x) => x.cellId === cellId && x.key === KEY)) acks.push({ key: KEY, cellId, epoch: sl.epoch });
      }
    }
    const leases: LeaseRenewal[] = [...latest].map(([cellId, p]) => ({ cellId, leaseExpiresAtMs: p.receiptMs + LEASE_TTL_MS }));
    const reported = new Set(latest.keys());
    const byKey = new Map<string, Map<string, number>>([[KEY, new Map(demands)]]);
    const nowMs = Math.max(coordClock(), ledger.nowMs);
    const grants: Grant[] = allocatorPolicy(ledger, { reported, byKey, acks, leaseTtlMs: LEASE_TTL_MS }, nowMs).filter((g) => reported.has(g.cellId));
    propose({ term, cmd: { type: 'reportAndGrant', nowMs, leases, acks, grants }, batch, withGrants: grants.length > 0, leases, acks });
  };

  const expire = (): void => {
    if (!leaderUp || inFlight !== null) return;
    const nowMs = coordClock();
    if (!ledger.listCells().some((c) => c.leaseExpiresAtMs !== null && nowMs >= c.leaseExpiresAtMs + SKEW_MARGIN_MS)) return;
    stats.expireEntries++;
    propose({ term, cmd: { type: 'expireLeases', nowMs }, batch: null, withGrants: false, leases: [], acks: [] });
  };

  const crash = (downForMs: number): void => {
    if (!leaderUp) return;
    leaderUp = false;
    term++;
    pending = [];
    const lost = inFlight;
    inFlight = null;
    // The uncommitted entry: lost, or committed later by the next leader (answered by nobody).
    const survives = lost !== null && faults.chance(0.5);
    if (lost !== null && !survives) stats.lostRounds++;
    q.schedule(q.now + downForMs, () => {
      leaderUp = true;
      stats.leaderChanges++;
      leaderOffset = faults.range(-50, 50);
      sessions = new Map();
      demands = new Map();
      if (survives && lost !== null) applyProposal(lost, false);
    });
  };

  // ---- network and agents ----------------------------------------------------------------------
  let callIds = 0;
  const send = (agent: Agent, deliver: () => void): void => {
    const i = agents.indexOf(agent);
    if (cutOff(i, q.now) || net.chance(dropP)) return;
    const at = q.now + delay();
    q.schedule(at, () => {
      if (!cutOff(i, q.now)) deliver();
    });
  };

  const setInForce = (a: Agent, rate: number, burst: number, leased: boolean): void => {
    a.inForce = { rate, burst, leased, limit: limitFromRate(Math.max(0, rate), Math.max(0, Math.floor(burst + 1e-9))) };
    dirty = true;
    stats.grantsApplied++;
  };

  const scheduleReport = (a: Agent, inAgentMs: number): void => {
    const at = a.realAt(a.clock(q.now) + inAgentMs);
    q.schedule(at, () => report(a));
  };

  const report = (a: Agent): void => {
    if (a.inFlight !== null) return;
    const callId = ++callIds;
    const sentAt = a.clock(q.now);
    const acks: [string, number][] = [...a.pendingAcks];
    const demand = ((a.allowedInWindow + a.refusedInWindow) * 1000) / REPORT_MS;
    a.allowedInWindow = 0;
    a.refusedInWindow = 0;
    a.inFlight = { callId, sentAt, acks };
    stats.reports++;
    const msg: ReportMsg = { cellId: a.id, incarnation: a.incarnation, callId, acks: acks.map(([key, epoch]) => ({ key, epoch })), demand };
    send(a, () => {
      if (leaderUp) pending.push({ report: msg, receiptMs: coordClock() });
    });
    q.schedule(a.realAt(sentAt + DEADLINE_MS), () => {
      if (a.inFlight?.callId !== callId) return;
      a.inFlight = null;
      stats.reportsFailed++;
      a.failures++;
      const backoff = Math.min(REPORT_MS * 4, REPORT_MS * 2 ** Math.min(a.failures - 1, 3));
      scheduleReport(a, Math.max(0, backoff * net.range(0.5, 1) - DEADLINE_MS));
    });
  };

  const onAnswer = (a: Agent, ans: AnswerMsg): void => {
    const call = a.inFlight;
    if (call?.callId !== ans.callId) return; // past its deadline: the call already failed
    a.inFlight = null;
    a.failures = 0;
    const incarnation = a.incarnation;
    for (const [key, epoch] of call.acks) if (a.pendingAcks.get(key) === epoch) a.pendingAcks.delete(key);
    const now = a.clock(q.now);
    a.leaseExpiresAt = Math.max(a.leaseExpiresAt, call.sentAt + ans.leaseTtlMs);
    const live = a.leaseExpiresAt > now;
    const changed = new Map<string, { rate: number; burst: number; leased: boolean }>();
    const toAck: [string, number][] = [];
    for (const g of ans.grants) {
      const held = a.grants.get(g.key);
      if (held !== undefined && held.epoch >= g.epoch) continue;
      a.grants.set(g.key, g);
      toAck.push([g.key, g.epoch]);
      changed.set(g.key, live ? leased(g) : { rate: g.floorRate, burst: g.floorBurst, leased: false });
    }
    if (live && a.state !== 'leased') {
      for (const [key, g] of a.grants) if (!changed.has(key)) changed.set(key, leased(g));
      a.state = 'leased';
    }
    if (live) scheduleExpiry(a);
    scheduleReport(a, Math.max(0, REPORT_MS - (now - call.sentAt)));
    if (changed.size === 0) return;
    // Applied by the serving threads a little later; acknowledged only once applied.
    q.schedule(q.now + net.range(0.1, 15), () => {
      const e = changed.get(KEY);
      if (incarnation !== a.incarnation && !(bugs.ignoreLeaseExpiry ?? false)) return; // expired meanwhile: floors stay
      if (e !== undefined) setInForce(a, e.rate, e.burst, e.leased);
      for (const [key, epoch] of toAck) if (a.grants.get(key)?.epoch === epoch) a.pendingAcks.set(key, epoch);
    });
  };

  const scheduleExpiry = (a: Agent): void => {
    // At least a µs on: converting the expiry to real time and back may round just below it.
    q.schedule(Math.max(a.realAt(a.leaseExpiresAt), q.now + 1e-3), () => checkExpiry(a));
  };

  const checkExpiry = (a: Agent): void => {
    if (a.state !== 'leased') return;
    if (a.leaseExpiresAt - a.clock(q.now) > 0) {
      scheduleExpiry(a); // renewed meanwhile (or rounding): armed again, as lease-client.ts does
      return;
    }
    if (bugs.ignoreLeaseExpiry ?? false) return;
    stats.agentExpiries++;
    const g = a.grants.get(KEY);
    a.grants.clear();
    a.pendingAcks.clear();
    a.incarnationN++;
    a.state = 'expired';
    if (g !== undefined) {
      const floor = { rate: g.floorRate, burst: g.floorBurst };
      q.schedule(q.now + net.range(0.1, 15), () => setInForce(a, floor.rate, floor.burst, false));
    }
  };

  // ---- requests and the bound ------------------------------------------------------------------
  const window: number[] = [];
  let windowHead = 0;
  const admittedBy: number[][] = agents.map(() => []);
  let steadyAdmitted = 0;

  const decide = (i: number): void => {
    const a = agents[i] as Agent;
    const nowNs = BigInt(Math.round(a.clock(q.now) * 1e6));
    const limit = a.inForce.limit;
    if (a.tat === null || a.bucketLimit === null) {
      a.tat = gcraInitialTat(limit, nowNs);
    } else if (a.bucketLimit !== limit) {
      a.tat = bugs.refillOnChange ?? false ? nowNs : gcraReconfigure(a.tat, nowNs, a.bucketLimit, limit);
    }
    a.bucketLimit = limit;
    const d = gcraTake(a.tat, nowNs, limit, 1);
    a.tat = d.tat;
    if (!d.allowed) {
      stats.refused++;
      a.refusedInWindow++;
      return;
    }
    stats.admitted++;
    a.allowedInWindow++;
    if (q.now >= STEADY_FROM_MS) steadyAdmitted++;
    const mine = admittedBy[i] as number[];
    mine.push(q.now);
    window.push(q.now);
    while ((window[windowHead] as number) < q.now - WINDOW_MS) windowHead++;
    if (windowHead > 4096) {
      window.splice(0, windowHead);
      windowHead = 0;
    }
    const count = window.length - windowHead;
    if (count > stats.maxWindowAdmitted) stats.maxWindowAdmitted = count;
    if (count > stats.bound) {
      const perCell = admittedBy.map((ts) => ts.filter((t) => t >= q.now - WINDOW_MS).length);
      throw new Stop({
        kind: 'bound',
        atMs: q.now,
        message: `${count} admitted in the window [${(q.now - WINDOW_MS).toFixed(3)}, ${q.now.toFixed(3)}] ms, over rate × 1 s + burst = ${stats.bound}`,
        evidence: { windowFromMs: q.now - WINDOW_MS, windowToMs: q.now, admitted: count, bound: stats.bound, perCell, limits: agents.map((x) => ({ cell: x.id, rate: x.inForce.rate, burst: x.inForce.burst, leased: x.inForce.leased, state: x.state })) },
      });
    }
    // Per-cell admissions of the last second (evidence, and the takeover measurement's 500 ms).
    while (mine.length > 0 && (mine[0] as number) < q.now - WINDOW_MS) mine.shift();
  };

  const arrive = (i: number): void => {
    const lambda = load(i, q.now);
    if (lambda > 0) decide(i);
    const next = lambda > 0 ? (-Math.log(1 - arrivals.float()) * 1000) / lambda : 50;
    q.schedule(q.now + next, () => arrive(i));
  };

  // Rates in force between two events are those after the earlier one (read before the next runs).
  let inForceSum = agents.reduce((t, a) => t + a.inForce.rate, 0);
  const sumInForceRate = (): number => inForceSum;

  const checkAllocationNow = (): void => {
    if (!checkAllocation) return;
    let rate = 0;
    let burst = 0;
    for (const a of agents) {
      rate += a.inForce.rate;
      burst += a.inForce.burst;
    }
    if (rate > stats.maxSumRate) stats.maxSumRate = rate;
    const tol = (v: number): number => v * (1 + 1e-9);
    if (rate > tol(RATE) || burst > tol(BURST)) {
      throw new Stop({
        kind: 'allocation',
        atMs: q.now,
        message: `the cells may use rate ${rate} / burst ${burst}, over the quota ${RATE} / ${BURST}`,
        evidence: { perCell: agents.map((a) => ({ cell: a.id, rate: a.inForce.rate, burst: a.inForce.burst, leased: a.inForce.leased, state: a.state, leaseExpiresInMs: a.leaseExpiresAt - a.clock(q.now) })) },
      });
    }
  };

  // Cross-check, cell by cell: the committed ledger counts every cell at least at what it uses.
  const checkUndercountNow = (): void => {
    if (!checkUndercount) return;
    const tol = (v: number): number => v * (1 + 1e-9);
    for (const a of agents) {
      const sl = ledger.getSlice(KEY, a.id);
      const countedRate = sl?.countedRate ?? 0;
      const countedBurst = sl?.countedBurst ?? 0;
      if (a.inForce.rate > tol(countedRate) || a.inForce.burst > tol(countedBurst)) {
        throw new Stop({
          kind: 'undercount',
          atMs: q.now,
          message: `${a.id} uses rate ${a.inForce.rate} / burst ${a.inForce.burst} but the ledger counts it at ${countedRate} / ${countedBurst}`,
          evidence: { cell: a.id, inForce: { rate: a.inForce.rate, burst: a.inForce.burst, leased: a.inForce.leased }, state: a.state, leaseExpiresInMs: a.leaseExpiresAt - a.clock(q.now), ledgerNowMs: ledger.nowMs, slice: sl ?? null },
        });
      }
    }
  };

  // ---- start ----------------------------------------------------------------------------------
  for (let i = 0; i < nCells; i++) {
    const a = agents[i] as Agent;
    q.schedule(net.range(0, REPORT_MS), () => report(a));
    q.schedule(arrivals.range(0, 5), () => arrive(i));
  }
  for (let t = ROUND_MS; t <= duration; t += ROUND_MS) q.schedule(t, round);
  for (let t = EXPIRE_EVERY_MS; t <= duration; t += EXPIRE_EVERY_MS) q.schedule(t, expire);
  if (crashAt !== null) q.schedule(crashAt, () => crash(faults.range(300, 1_500)));
  if (outage !== null) {
    const o = outage;
    q.schedule(o.from, () => crash(o.to - o.from));
  }
  // Background faults in every scenario: an occasional leader failover.
  if (faults.chance(0.3)) q.schedule(faults.range(1_000, duration), () => crash(faults.range(150, 1_000)));

  let violation: QuotaViolation | undefined;
  let allocatedArea = 0;
  let lastT = 0;
  try {
    while (q.runNext(duration)) {
      stats.events++;
      if (q.now > STEADY_FROM_MS) allocatedArea += (q.now - Math.max(lastT, STEADY_FROM_MS)) * sumInForceRate();
      lastT = q.now;
      if (dirty) {
        dirty = false;
        checkAllocationNow();
        checkUndercountNow();
        inForceSum = agents.reduce((t, a) => t + a.inForce.rate, 0);
      }
      if (measureMove && stats.takeoverMs === null && q.now >= moveAt) {
        const got = (admittedBy[to] as number[]).filter((t) => t >= Math.max(moveAt, q.now - 500)).length;
        if (q.now - moveAt >= 500 && got >= 0.9 * moveDemand * 0.5) stats.takeoverMs = Math.round(q.now - moveAt);
      }
    }
  } catch (e) {
    if (!(e instanceof Stop)) throw e;
    violation = e.violation;
  }
  if (scenario === 'skewed' && duration > STEADY_FROM_MS && violation === undefined) {
    stats.steadyAdmittedRate = (steadyAdmitted * 1000) / (duration - STEADY_FROM_MS);
    stats.steadyAllocatedRate = allocatedArea / (lastT - STEADY_FROM_MS);
  }
  return violation === undefined ? { ok: true, seed: opts.seed, stats } : { ok: false, seed: opts.seed, violation, stats };
}

function leased(g: HeldGrant): { rate: number; burst: number; leased: boolean } {
  return { rate: Math.max(g.rate, g.floorRate), burst: Math.max(g.burst, g.floorBurst), leased: true };
}
