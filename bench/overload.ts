// `npm run bench -- overload`: floods the agent at 1×, 2× and 4× its measured capacity against keys
// with small limits, under the bounded overload policy (issue 15, the default) and the open one (the
// behaviour before), side by side in one run.
//
//   npx tsx bench/run.ts overload [--smoke]
//
// Two agents (bench/servers/agent.ts, one worker each, in processes of their own, the lag guard on at
// the default 10 ms): `--overload-policy bounded` and `--overload-policy open`. The load generator
// (bench/load/loadgen.ts, raw HTTP/2 client, its own process) runs closed loops over `tenants` keys of
// the `bench-small` domain, every key under a rule of SMALL_PER_SECOND (50/s, 50 deep).
//   1. Capacity: a closed loop at BASE_CONCURRENCY checks in flight against the bounded agent; its
//      throughput C is "1×".
//   2. Floods: a closed loop cannot offer more answers than the server gives, so "k× capacity" is
//      k × the checks in flight that saturate it (k·BASE_CONCURRENCY): k× the work waiting at the
//      agent at any moment, which is what makes its loop late and puts it on its overload path.
//      Each level runs against the bounded agent, then the open one (order alternating per level).
// Per run: throughput, per key the admitted rate over the window (the largest key and the mean) against
// the bound rate·W + burst + allowance·W + depth (allowance = the rule's rate, one second deep: the
// default --overload-allowance 1), the share of fail-open answers (x-ratelimit-fail-open), and
// latency p50/p99 (send → answer as the generator sees it; the agent's decision is inside it).
// Report only: nothing is asserted (docs/targets.md).
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { BenchReport } from './bench-report.js';
import { LoadGenerator } from './load/loadgen-client.js';
import type { LoadJob, PhaseResult } from './load/loadgen-protocol.js';
import { DOMAIN_SMALL, SMALL_PER_SECOND } from './servers/bench-rules.js';
import { ServerProcess } from '../testkit/processes/server-process.js';
import { armEmergencyStop } from './emergency-stop.js';

const AGENT = fileURLToPath(new URL('./servers/agent.ts', import.meta.url));
const POLICIES = ['bounded', 'open'] as const;
type Policy = (typeof POLICIES)[number];

export interface OverloadBenchOptions {
  readonly smoke: boolean;
  readonly progress: (msg: string) => void;
}

interface Plan {
  readonly baseConcurrency: number;
  readonly levels: readonly number[];
  readonly tenants: number;
  readonly sessions: number;
  readonly warmupMs: number;
  readonly measureMs: number;
}

function makePlan(smoke: boolean): Plan {
  return smoke
    ? { baseConcurrency: 16, levels: [1, 2], tenants: 10, sessions: 2, warmupMs: 300, measureMs: 1000 }
    : { baseConcurrency: 64, levels: [1, 2, 4], tenants: 20, sessions: 4, warmupMs: 1000, measureMs: 5000 };
}

const pct = (a: number, b: number): number => (b > 0 ? Math.round((a / b) * 1000) / 10 : 0);

export async function runOverloadBench(opts: OverloadBenchOptions): Promise<BenchReport> {
  const plan = makePlan(opts.smoke);
  const scratch = mkdtempSync(join(os.tmpdir(), 'cq-overload-'));
  const servers = new Map<Policy, ServerProcess>();
  let gen: LoadGenerator | null = null;
  const emergency = armEmergencyStop(
    () => {
      for (const s of servers.values()) s.killNow();
      gen?.killNow();
    },
    scratch,
    opts.progress,
  );
  const rows: Record<string, number | string>[] = [];
  const notes: string[] = [];
  try {
    for (const policy of POLICIES) {
      const socket = join(scratch, `${policy}.sock`);
      const server = await ServerProcess.start(
        `agent-${policy}`,
        AGENT,
        socket,
        { scratchDir: join(scratch, policy), overloadPolicy: policy },
        (line) => opts.progress(line),
      );
      servers.set(policy, server);
    }
    gen = await LoadGenerator.start();
    const run = async (policy: Policy, concurrency: number): Promise<PhaseResult> => {
      const server = servers.get(policy) as ServerProcess;
      const job: LoadJob = {
        targets: [server.endpoints.length === 1 ? (server.endpoints[0] as string) : server.endpoints],
        sliceMs: 250,
        domain: DOMAIN_SMALL,
        tenants: plan.tenants,
        mode: 'closed',
        concurrency,
        rate: 0,
        sessions: plan.sessions,
        client: 'raw',
        warmupMs: plan.warmupMs,
        measureMs: plan.measureMs,
        drainTimeoutMs: 5000,
        seed: 0x15,
        progressEveryMs: 0,
        perTenant: true,
      };
      const [r] = await (gen as LoadGenerator).run(job);
      if (r === undefined) throw new Error('no result');
      return r;
    };
    // A first pass on both (not reported): JIT, connections and the keys' buckets settle.
    for (const policy of POLICIES) await run(policy, plan.baseConcurrency);
    opts.progress(`capacity: closed loop at ${plan.baseConcurrency} in flight against the bounded agent`);
    const capacity = await run('bounded', plan.baseConcurrency);
    const seconds = plan.measureMs / 1000;
    // Per key over the window W: rate·W + burst (its bucket) + allowance·W + depth (its fail-open allowance).
    const bound = SMALL_PER_SECOND * seconds + SMALL_PER_SECOND + SMALL_PER_SECOND * seconds + SMALL_PER_SECOND;
    const decidedBound = SMALL_PER_SECOND * seconds + SMALL_PER_SECOND;
    for (const [i, level] of plan.levels.entries()) {
      const order: readonly Policy[] = i % 2 === 0 ? POLICIES : [...POLICIES].reverse();
      for (const policy of order) {
        const concurrency = level * plan.baseConcurrency;
        opts.progress(`${level}× (${concurrency} in flight), ${policy}`);
        const r = await run(policy, concurrency);
        const allowed = r.tenantAllowed ?? [];
        const failOpenPerKey = r.tenantFailOpen ?? [];
        const maxKey = allowed.reduce((m, v) => Math.max(m, v), 0);
        const meanKey = allowed.length > 0 ? allowed.reduce((a, v) => a + v, 0) / allowed.length : 0;
        const failOpenInWindow = failOpenPerKey.reduce((a, v) => a + v, 0);
        rows.push({
          flood: `${level}×`,
          'in flight': concurrency,
          policy,
          'answers/s': r.throughput,
          'vs capacity': capacity.throughput > 0 ? Math.round((r.throughput / capacity.throughput) * 100) / 100 : 0,
          'max key admitted': maxKey,
          'mean key admitted': Math.round(meanKey),
          'bound per key': Math.round(bound),
          'max key ÷ bound': Math.round((maxKey / bound) * 100) / 100,
          'fail-open %': pct(failOpenInWindow, r.measuredCompletions),
          'p50 µs': r.latency?.p50Us ?? 0,
          'p99 µs': r.latency?.p99Us ?? 0,
          errors: r.errors,
        });
      }
    }
    notes.push(
      `Machine load while measuring: ${os
        .loadavg()
        .map((l) => l.toFixed(1))
        .join(' / ')} (1/5/15 min) at the end; figures taken while other work runs are indicative only.`,
      `Capacity (1×): ${capacity.throughput.toLocaleString('en-US')} answers/s at ${plan.baseConcurrency} checks in flight against the bounded agent (p99 ${capacity.latency?.p99Us ?? 0} µs). A closed loop cannot offer more answers than the agent gives: k× is k × those checks in flight, the work waiting at the agent at any moment.`,
      `${plan.tenants} keys, each under ${SMALL_PER_SECOND}/s (depth ${SMALL_PER_SECOND}); window W = ${seconds} s. Bound per key = rate·W + burst + allowance·W + depth = ${Math.round(bound)} (allowance = the rule's rate, one second deep: --overload-allowance 1); by decision alone ${Math.round(decidedBound)}. "max key admitted" counts OK answers completed inside the window (fail-open ones included).`,
      'Bounded: while overloaded each key admits at most its allowance fail-open and the rest is refused at once; open: every check while overloaded is OK without a decision (the behaviour before issue 15). A "max key ÷ bound" above 1 is the limit lost to fail-open.',
      `The agents: ${[...servers.values()].map((s) => s.description).join('; ')}.`,
    );
  } finally {
    emergency.signalsOff();
    await gen?.stop();
    await Promise.all([...servers.values()].map((s) => s.stop()));
    emergency.exitOff();
    rmSync(scratch, { recursive: true, force: true });
  }
  return { name: 'overload', title: 'Overload: floods at 1×, 2×, 4× capacity, bounded vs open policy', rows, notes };
}
