// Resident memory of an idle agent, as an operator runs it: the built command
// (`node bin/cellquota.mjs agent ...`, so `npm run build` first), one process per variant, one after
// the other (never two at once: the figures must not share the machine's memory pressure).
//
//   npm run bench -- agent-idle-rss            # idle 10 s per variant, and 60 s for the settled figure
//   npx tsx bench/agent-idle-rss.ts [--idle-s N] [--settle-s N] [--workers N] [--node-flags="--flag ..."]
//        [--variants a,b]
//
// Variants (each with --workers 1 unless --workers says otherwise, the bench rules of
// bench/servers/bench-rules.ts, --log-level warn, the RLS on a Unix socket):
//   rls             the RLS socket only
//   rls+http        and the HTTP API (--http 127.0.0.1:0: /metrics, /healthz, checks)
//   rls+http+coord  and --coordinators: a one-node coordinator started here, the lease client leasing
//   after-load      rls only, after 3 s of checks (16 in flight, one grpc-js client): what the load
//                   leaves resident once it stops
// Each: the agent is started, one check is answered over the socket (it serves), then it stays idle
// for --idle-s seconds; RSS (VmRSS of /proc/PID/status) is sampled every 250 ms over that window and
// reported as its last value and its maximum. Linux only (reads /proc). Report only: the target (≤ 96
// MiB with one worker, issue 21) is for the reader. The smoke variant (test/bench/) runs the agent
// from source through tsx, whose loader adds its own memory: its figures say nothing, only that the
// benchmark runs.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { machineLine, type BenchReport } from './bench-report.js';
import { writeRules } from './servers/agent.js';
import { DOMAIN_UNLIMITED, TENANT_KEY } from './servers/bench-rules.js';
import { CoordinatorCluster } from '../testkit/coordinator-cluster.js';
import { RlsClient, d, unixTarget } from '../testkit/rls-client.js';
import { tempDir } from '../testkit/temp-dir.js';
import { sleep, waitFor } from '../testkit/wait.js';

const ROOT = resolve(fileURLToPath(import.meta.url), '../..');
const BIN = join(ROOT, 'bin/cellquota.mjs');
const BUILT_MAIN = join(ROOT, 'dist/cli/main.js');
const SOURCE_MAIN = join(ROOT, 'cli/main.ts');
const MiB = 1024 * 1024;
const SAMPLE_MS = 250;
const LOAD_MS = 3_000;
const LOAD_IN_FLIGHT = 16;
/** How long the full run keeps each variant idle for its settled figure. */
const SETTLE_S = 60;

export const IDLE_RSS_VARIANTS = ['rls', 'rls+http', 'rls+http+coord', 'after-load'] as const;
export type IdleRssVariant = (typeof IDLE_RSS_VARIANTS)[number];

export interface IdleRssOptions {
  readonly idleS: number;
  /** Keep sampling until this long idle (≥ idleS; 0: not at all) for the settled figure: V8's memory
   * reducer returns each thread's start-up young generation on its own after ~20-60 s idle. */
  readonly settleS: number;
  readonly workers: number;
  /** Node/V8 flags for the agent process (e.g. --max-semi-space-size=1). */
  readonly nodeFlags: readonly string[];
  readonly variants: readonly IdleRssVariant[];
  /** Run cli/main.ts through tsx instead of the build (smoke only: tsx's loader adds memory). */
  readonly fromSource: boolean;
  readonly progress: (msg: string) => void;
}

export interface IdleRssResult {
  readonly variant: IdleRssVariant;
  readonly workers: number;
  readonly rssMiB: number;
  readonly maxRssMiB: number;
  /** RSS after settleS idle (null when settleS is 0). */
  readonly settledRssMiB: number | null;
  readonly samples: number;
  readonly checksBeforeIdle: number;
}

function rssBytes(pid: number): number | null {
  try {
    const m = /^VmRSS:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m === null ? null : Number(m[1]) * 1024;
  } catch {
    return null;
  }
}

const mib = (bytes: number): number => Math.round((bytes / MiB) * 10) / 10;

/** Why the build cannot be measured (missing, or older than a source it is built from: a stale figure), or null. */
export function buildProblem(): string | null {
  if (!existsSync(BUILT_MAIN)) return `${BUILT_MAIN} is missing: run \`npm run build\` first`;
  for (const f of ['cell-agent/agent-main.ts', 'cell-agent/agent-worker.ts', 'cell-agent/rls/lean-server.ts']) {
    const out = join(ROOT, 'dist', f.replace(/\.ts$/, '.js'));
    if (!existsSync(out) || statSync(out).mtimeMs < statSync(join(ROOT, f)).mtimeMs)
      return `dist/ is older than ${f}: run \`npm run build\` first`;
  }
  return null;
}

interface RunningAgent {
  readonly child: ChildProcess;
  readonly exited: Promise<void>;
}

async function startAgent(args: readonly string[], opts: IdleRssOptions): Promise<RunningAgent> {
  const entry = opts.fromSource ? ['--import', 'tsx', SOURCE_MAIN] : [BIN];
  const child = spawn(process.execPath, [...opts.nodeFlags, ...entry, 'agent', ...args], {
    cwd: ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (b: Buffer) => (output += b.toString()));
  child.stderr.on('data', (b: Buffer) => (output += b.toString()));
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  await waitFor(
    'the agent to serve',
    () => {
      if (child.exitCode !== null) throw new Error(`the agent exited (${child.exitCode}):\n${output}`);
      return output.includes('is serving') ? true : undefined;
    },
    { timeoutMs: 60_000, everyMs: 50 },
  );
  return { child, exited };
}

/** Checks with LOAD_IN_FLIGHT in flight for `ms`; returns how many were answered. */
async function load(client: RlsClient, ms: number): Promise<number> {
  const until = Date.now() + ms;
  let answered = 0;
  const loop = async (lane: number): Promise<void> => {
    for (let i = 0; Date.now() < until; i++) {
      await client.check({
        domain: DOMAIN_UNLIMITED,
        descriptors: [d([TENANT_KEY, `tenant-${(lane * 7 + i) % 1000}`])],
      });
      answered++;
    }
  };
  await Promise.all(Array.from({ length: LOAD_IN_FLIGHT }, (_, lane) => loop(lane)));
  return answered;
}

async function measureVariant(variant: IdleRssVariant, opts: IdleRssOptions): Promise<IdleRssResult> {
  const dir = tempDir('cq-idle-rss-');
  let cluster: CoordinatorCluster | null = null;
  let agent: RunningAgent | null = null;
  let client: RlsClient | null = null;
  try {
    const socket = join(dir.path, 'rls.sock');
    const args = [
      '--cell',
      'bench',
      '--rules',
      writeRules(dir.path),
      '--rls-socket',
      socket,
      '--workers',
      String(opts.workers),
      '--log-level',
      'warn',
    ];
    if (variant === 'rls+http' || variant === 'rls+http+coord') args.push('--http', '127.0.0.1:0');
    if (variant === 'rls+http+coord') {
      cluster = await CoordinatorCluster.create(['n1']);
      cluster.start('n1');
      await cluster.waitForLeader(60_000);
      args.push('--coordinators', `127.0.0.1:${cluster.replica('n1').peerPort}`);
    }
    agent = await startAgent(args, opts);
    client = new RlsClient(unixTarget(socket));
    await client.check({ domain: DOMAIN_UNLIMITED, descriptors: [d([TENANT_KEY, 'tenant-1'])] });
    const checks = 1 + (variant === 'after-load' ? await load(client, LOAD_MS) : 0);
    client.close();
    client = null;
    const pid = agent.child.pid;
    if (pid === undefined) throw new Error('the agent has no pid');
    let last = 0;
    let max = 0;
    let samples = 0;
    const start = Date.now();
    const until = start + opts.idleS * 1000;
    const settleUntil = start + Math.max(opts.idleS, opts.settleS) * 1000;
    let settled: number | null = null;
    while (Date.now() < until) {
      await sleep(SAMPLE_MS);
      const rss = rssBytes(pid);
      if (rss === null) throw new Error('the agent exited while idle');
      last = rss;
      max = Math.max(max, rss);
      samples++;
    }
    while (opts.settleS > 0 && Date.now() < settleUntil) {
      await sleep(SAMPLE_MS);
      const rss = rssBytes(pid);
      if (rss === null) throw new Error('the agent exited while idle');
      settled = rss;
    }
    opts.progress(
      `${variant}: ${mib(last)} MiB after ${opts.idleS} s idle (max ${mib(max)})` +
        (settled === null ? '' : `, ${mib(settled)} MiB after ${opts.settleS} s`),
    );
    return {
      variant,
      workers: opts.workers,
      rssMiB: mib(last),
      maxRssMiB: mib(max),
      settledRssMiB: settled === null ? null : mib(settled),
      samples,
      checksBeforeIdle: checks,
    };
  } finally {
    client?.close();
    if (agent !== null) {
      agent.child.kill('SIGTERM');
      await agent.exited;
    }
    if (cluster !== null) await cluster.cleanup();
    dir.remove();
  }
}

export async function measureIdleRss(opts: IdleRssOptions): Promise<IdleRssResult[]> {
  const problem = opts.fromSource ? null : buildProblem();
  if (problem !== null) throw new Error(problem);
  const results: IdleRssResult[] = [];
  for (const v of opts.variants) results.push(await measureVariant(v, opts));
  return results;
}

/** For bench/run.ts. */
export async function runAgentIdleRssBench(opts: {
  smoke: boolean;
  progress: (msg: string) => void;
}): Promise<BenchReport> {
  const idleS = opts.smoke ? 1 : 10;
  const settleS = opts.smoke ? 0 : SETTLE_S;
  const variants = opts.smoke ? (['rls'] as const) : IDLE_RSS_VARIANTS;
  // In a run of every benchmark, a missing or stale build is reported, not thrown: the others still run.
  const problem = opts.smoke ? null : buildProblem();
  if (problem !== null) {
    opts.progress(`not run: ${problem}`);
    return {
      name: 'agent-idle-rss',
      title: 'Idle resident memory of the agent',
      rows: [],
      notes: [`not run: ${problem}`],
    };
  }
  const results = await measureIdleRss({
    idleS,
    settleS,
    workers: 1,
    nodeFlags: [],
    variants,
    fromSource: opts.smoke,
    progress: opts.progress,
  });
  return {
    name: 'agent-idle-rss',
    title: 'Idle resident memory of the agent (node bin/cellquota.mjs agent, one worker)',
    rows: results.map((r) => ({
      variant: r.variant,
      workers: r.workers,
      'RSS MiB': r.rssMiB,
      'max RSS MiB': r.maxRssMiB,
      [`RSS MiB after ${settleS} s`]: r.settledRssMiB ?? '',
      'checks before idle': r.checksBeforeIdle,
    })),
    notes: [
      `RSS after ${idleS} s idle, sampled every ${SAMPLE_MS} ms (the last sample; max over the window)`,
      `RSS after ${settleS} s idle: once V8's memory reducer has run in each thread (it returns the young generation ` +
        'that start-up and load grew, ~20-60 s into an idle period; see cell-agent/README.md)',
      opts.smoke
        ? 'smoke: run from source through tsx (its loader adds memory): figures not meaningful'
        : 'the built agent (npm run build); target ≤ 96 MiB with one worker (issue 21)',
      `machine: ${machineLine()}`,
    ],
  };
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      'idle-s': { type: 'string', default: '10' },
      'settle-s': { type: 'string', default: '0' },
      workers: { type: 'string', default: '1' },
      'node-flags': { type: 'string', default: '' },
      variants: { type: 'string', default: IDLE_RSS_VARIANTS.join(',') },
    },
  });
  const idleS = Number(values['idle-s']);
  const workers = Number(values.workers);
  const settleS = Number(values['settle-s']);
  if (!Number.isFinite(settleS) || settleS < 0) throw new RangeError('--settle-s takes a number ≥ 0');
  if (!Number.isFinite(idleS) || idleS <= 0) throw new RangeError('--idle-s takes a positive number');
  if (!Number.isSafeInteger(workers) || workers < 1) throw new RangeError('--workers takes a positive integer');
  const variants = values.variants.split(',').map((v) => {
    if (!(IDLE_RSS_VARIANTS as readonly string[]).includes(v))
      throw new RangeError(`unknown variant '${v}'; known: ${IDLE_RSS_VARIANTS.join(', ')}`);
    return v as IdleRssVariant;
  });
  const nodeFlags = values['node-flags'].split(/\s+/).filter((f) => f !== '');
  const results = await measureIdleRss({
    idleS,
    settleS,
    workers,
    nodeFlags,
    variants,
    fromSource: false,
    progress: (m) => console.log(`  … ${m}`),
  });
  console.log(JSON.stringify({ machine: machineLine(), idleS, workers, nodeFlags, results }));
}

if (process.argv[1] !== undefined && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) await main();
