// A throw-away 3-member etcd cluster on loopback for the coordinator benchmark's side-by-side rows:
// free ports, fresh data dirs under a scratch directory, the v3 JSON gateway on each client URL.
// Members can be killed with SIGKILL and restarted on their data dir (etcd then ignores the
// --initial-cluster* flags and rejoins with its WAL). stop() waits for every PID to exit before it
// removes the directories (a data dir deleted under a live member breaks the next start). The
// binary is found on PATH (or $ETCD_BIN); when there is none, the etcd rows are skipped.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { accessSync, constants, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { freePort } from '../../testkit/ports.js';

export function findEtcd(): string | null {
  const explicit = process.env['ETCD_BIN'];
  const candidates =
    explicit !== undefined && explicit !== ''
      ? [explicit]
      : (process.env['PATH'] ?? '')
          .split(delimiter)
          .filter((d) => d !== '')
          .map((d) => join(d, 'etcd'));
  for (const c of candidates) {
    try {
      accessSync(c, constants.X_OK);
      return c;
    } catch {
      // next
    }
  }
  return null;
}

export function etcdVersion(bin: string): string {
  const out = spawnSync(bin, ['--version'], { encoding: 'utf8' }).stdout;
  return /etcd Version:\s*(\S+)/.exec(out)?.[1] ?? 'unknown';
}

/** Sum and count of a Prometheus histogram (no labels, or the first series) from a /metrics URL. */
export async function scrapeHistogram(url: string, metric: string): Promise<{ sum: number; count: number } | null> {
  try {
    const res = await fetch(url, { signal: AbortSignal.timeout(2000) });
    const text = await res.text();
    const sum = new RegExp(`^${metric}_sum(?:\\{[^}]*\\})? (\\S+)$`, 'm').exec(text)?.[1];
    const count = new RegExp(`^${metric}_count(?:\\{[^}]*\\})? (\\S+)$`, 'm').exec(text)?.[1];
    return sum === undefined || count === undefined ? null : { sum: Number(sum), count: Number(count) };
  } catch {
    return null;
  }
}

export interface EtcdClusterOptions {
  /** --heartbeat-interval in ms (etcd default 100). */
  readonly heartbeatMs: number;
  /** --election-timeout in ms (etcd default 1000); etcd randomizes it in [E, 2E). */
  readonly electionMs: number;
  /** --pre-vote (etcd 3.4 default false). */
  readonly preVote: boolean;
  /** A label for the scratch directory and messages. */
  readonly label?: string;
  /** The etcd binary (default: findEtcd()). */
  readonly bin?: string;
}

export interface EtcdMember {
  readonly name: string;
  readonly clientUrl: string;
  readonly peerUrl: string;
  readonly dataDir: string;
  proc: ChildProcess | null;
  /** The last lines of its output, for error messages. */
  tail: string[];
}

/** What GET-like POST /v3/maintenance/status answers (the gateway prints uint64 as strings). */
export interface EtcdStatus {
  readonly memberId: string;
  readonly leaderId: string;
  readonly raftTerm: number;
  readonly raftIndex: number;
  readonly raftAppliedIndex: number;
}

export class EtcdCluster {
  readonly members: EtcdMember[] = [];
  private readonly idToName = new Map<string, string>();

  private constructor(
    readonly bin: string,
    readonly version: string,
    readonly root: string,
    readonly options: EtcdClusterOptions,
    private readonly initialCluster: string,
  ) {}

  /** Starts 3 members on free loopback ports and waits until they agree on a leader. */
  static async start(options: EtcdClusterOptions, timeoutMs = 20_000): Promise<EtcdCluster> {
    const bin = options.bin ?? findEtcd();
    if (bin === null) throw new Error('etcd is not on PATH (apt-get install etcd-server)');
    const root = mkdtempSync(join(tmpdir(), `cq-etcd-${options.label ?? 'cluster'}-`));
    const specs: { name: string; client: number; peer: number }[] = [];
    for (const name of ['e1', 'e2', 'e3']) specs.push({ name, client: await freePort(), peer: await freePort() });
    const initialCluster = specs.map((s) => `${s.name}=http://127.0.0.1:${s.peer}`).join(',');
    const c = new EtcdCluster(bin, etcdVersion(bin), root, options, initialCluster);
    for (const s of specs) {
      c.members.push({
        name: s.name,
        clientUrl: `http://127.0.0.1:${s.client}`,
        peerUrl: `http://127.0.0.1:${s.peer}`,
        dataDir: join(root, `${s.name}.etcd`),
        proc: null,
        tail: [],
      });
    }
    try {
      for (const m of c.members) c.start(m.name);
      await c.waitForLeader(
        timeoutMs,
        c.members.map((m) => m.name),
      );
      return c;
    } catch (err) {
      await c.stop();
      throw err;
    }
  }

  member(name: string): EtcdMember {
    const m = this.members.find((x) => x.name === name);
    if (m === undefined) throw new Error(`no etcd member ${name}`);
    return m;
  }

  running(): EtcdMember[] {
    return this.members.filter((m) => m.proc !== null);
  }

  /** Starts (or restarts, on its existing data dir) one member. */
  start(name: string): void {
    const m = this.member(name);
    if (m.proc !== null) throw new Error(`etcd ${name} is already running`);
    const args = [
      '--name',
      m.name,
      '--data-dir',
      m.dataDir,
      '--listen-client-urls',
      m.clientUrl,
      '--advertise-client-urls',
      m.clientUrl,
      '--listen-peer-urls',
      m.peerUrl,
      '--initial-advertise-peer-urls',
      m.peerUrl,
      '--initial-cluster',
      this.initialCluster,
      '--initial-cluster-token',
      `cq-bench-${this.options.label ?? 'cluster'}`,
      '--initial-cluster-state',
      'new',
      '--heartbeat-interval',
      String(this.options.heartbeatMs),
      '--election-timeout',
      String(this.options.electionMs),
      `--pre-vote=${this.options.preVote ? 'true' : 'false'}`,
      '--logger',
      'zap',
      '--log-outputs',
      'stderr',
      '--log-level',
      'warn',
    ];
    const proc = spawn(this.bin, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    m.tail = [];
    const keep = (d: Buffer): void => {
      m.tail.push(
        ...d
          .toString('utf8')
          .split('\n')
          .filter((l) => l.trim() !== ''),
      );
      m.tail.splice(0, Math.max(0, m.tail.length - 10));
    };
    proc.stdout.on('data', keep);
    proc.stderr.on('data', keep);
    proc.on('exit', () => {
      if (m.proc === proc) m.proc = null;
    });
    m.proc = proc;
  }

  /** kill -9 of one member; resolves once its process has exited. */
  async kill(name: string, signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    const m = this.member(name);
    const proc = m.proc;
    if (proc === null) return;
    const exited = new Promise<void>((ok) => proc.once('exit', () => ok()));
    proc.kill(signal);
    await exited;
    m.proc = null;
  }

  async status(name: string, timeoutMs = 1000): Promise<EtcdStatus | null> {
    const m = this.member(name);
    try {
      const res = await fetch(`${m.clientUrl}/v3/maintenance/status`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: '{}',
        signal: AbortSignal.timeout(timeoutMs),
      });
      const text = await res.text();
      if (res.status !== 200) return null;
      const j = JSON.parse(text) as {
        header?: { member_id?: string };
        leader?: string;
        raftTerm?: string;
        raftIndex?: string;
        raftAppliedIndex?: string;
      };
      const memberId = j.header?.member_id ?? '';
      if (memberId !== '') this.idToName.set(memberId, name);
      return {
        memberId,
        leaderId: j.leader ?? '0',
        raftTerm: Number(j.raftTerm ?? 0),
        raftIndex: Number(j.raftIndex ?? 0),
        raftAppliedIndex: Number(j.raftAppliedIndex ?? 0),
      };
    } catch {
      return null;
    }
  }

  /**
   * Polls until every running member answers and names the same running leader; returns its name.
   * Fails at once if one of `mustRun` has exited (e.g. at start, with its last output).
   */
  async waitForLeader(timeoutMs = 20_000, mustRun: readonly string[] = []): Promise<string> {
    const deadline = Date.now() + timeoutMs;
    let last = '';
    while (Date.now() < deadline) {
      const up = this.running();
      if (up.length === 0) throw new Error('no etcd member is running');
      const statuses = await Promise.all(up.map((m) => this.status(m.name)));
      const leaders = new Set(statuses.map((s) => s?.leaderId ?? 'none'));
      const [only] = [...leaders];
      if (leaders.size === 1 && only !== undefined && only !== 'none' && only !== '0') {
        const leaderName = this.idToName.get(only);
        if (leaderName !== undefined && this.member(leaderName).proc !== null) return leaderName;
      }
      last = JSON.stringify(statuses.map((s, i) => `${up[i]?.name}:${s === null ? 'down' : s.leaderId}`));
      for (const name of mustRun) {
        const m = this.member(name);
        if (m.proc === null) throw new Error(`etcd ${name} exited: ${m.tail.join(' | ')}`);
      }
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error(
      `etcd (${this.options.label ?? 'cluster'}): no agreed leader within ${timeoutMs} ms (last seen: ${last})`,
    );
  }

  /**
   * After a restart: waits until `name` answers, follows the current leader and has applied
   * everything the leader had committed when it was asked.
   */
  async waitCaughtUp(name: string, timeoutMs = 20_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    let last = '';
    while (Date.now() < deadline) {
      const leader = await this.waitForLeader(Math.max(1, deadline - Date.now()), [name]);
      const ls = await this.status(leader);
      const ms = await this.status(name);
      if (ls !== null && ms !== null && ms.leaderId === ls.memberId && ms.raftAppliedIndex >= ls.raftIndex) return;
      last = `${name} applied ${ms?.raftAppliedIndex ?? '?'}, leader ${leader} at ${ls?.raftIndex ?? '?'}`;
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error(`etcd ${name} did not catch up within ${timeoutMs} ms (${last})`);
  }

  /** Sum and count of a histogram on a member's /metrics (e.g. etcd_disk_wal_fsync_duration_seconds). */
  async histogram(name: string, metric: string): Promise<{ sum: number; count: number } | null> {
    return scrapeHistogram(`${this.member(name).clientUrl}/metrics`, metric);
  }

  /** Stops every member (SIGTERM, SIGKILL after graceMs), waits for the PIDs, removes the dirs. */
  async stop(graceMs = 3000): Promise<void> {
    await Promise.all(
      this.members.map(async (m) => {
        const proc = m.proc;
        if (proc === null) return;
        const exited = new Promise<void>((ok) => proc.once('exit', () => ok()));
        proc.kill('SIGTERM');
        const timer = setTimeout(() => proc.kill('SIGKILL'), graceMs);
        await exited;
        clearTimeout(timer);
        m.proc = null;
      }),
    );
    rmSync(this.root, { recursive: true, force: true });
  }

  /** Last resort (process exit, signals): SIGKILL every member now, without waiting. */
  killNow(): void {
    for (const m of this.members) if (m.proc !== null) m.proc.kill('SIGKILL');
  }

  /** PIDs of the running members (for the caller's own checks). */
  pids(): number[] {
    return this.members.flatMap((m) => (m.proc?.pid === undefined ? [] : [m.proc.pid]));
  }
}
