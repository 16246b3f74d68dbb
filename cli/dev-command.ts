// `cellquota dev` (what `npm start` runs): a whole local deployment on loopback — three
// coordinator replicas and two cell agents (cell-a, cell-b) as child processes, data under
// ./.cellquota (reused on the next run), a demo tier and tenant — then the endpoints and an
// example check. Ctrl-C stops everything.
//
// The agents lease their slices from the coordinators (reports every 500 ms) and have no tenants
// file: the demo tier and tenant exist only in the coordinators (the admin API), and an agent learns
// them from its lease answers. The floors are split over the two cells (--floor-cells 2). Before the
// endpoints are printed, cell-a is sent checks until one is decided on a leased grant, so the
// printed example check is answered from a lease.
//
// `--tls` runs it with TLS end to end: a CA and certificates made under <data-dir>/pki
// (scripts/make-certs.sh, openssl), mutual TLS between the replicas, the lease service on its own
// port (--peer-port+10..+12) requiring each agent's certificate for its cell.
//
// `--demo` then drives a skewed load from inside this process (runDemo below) and prints, each
// second, what every cell was offered, what it admitted and its current slice, and the global
// admitted rate against the quota, so the rebalancing shows in the terminal.
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, mkdirSync, writeFileSync } from 'node:fs';
import { Agent as HttpAgent, request as httpRequest } from 'node:http';
import { join, resolve } from 'node:path';
import { z } from 'zod';
import { loadSettings, setting, settingSpecs, settingsHelp } from '../shared/cli-config.js';
import { makeLocalPki } from '../shared/make-certs.js';

// The --demo load: the demo tenant's quota, the offered load as a multiple of it, the share of the
// hot cell, and how often the hot spot moves.
const DEMO_QUOTA = 100;
const DEMO_LOAD_FACTOR = 2.5;
const DEMO_HOT = 0.9;
const DEMO_SHIFT_S = 10;

interface Child {
  readonly name: string;
  readonly proc: ChildProcess;
  readonly log: string;
}

const devUsage =
  (): string => `cellquota dev [--data-dir DIR] [--peer-port P] [--admin-port P] [--agent-port P] [--tls] [--demo]

${settingsHelp(DEV_SETTING_SPECS)}

Starts 3 coordinators on 127.0.0.1 (peers on --peer-port..+2, admin API on --admin-port..+2) and
2 agents (cell-a, cell-b: HTTP on --agent-port..+1, gRPC RLS on <data-dir>/cell-*.sock and on
--agent-port+10..+11), creates the demo tier and tenant, prints the endpoints and waits; Ctrl-C
stops everything.
Logs go to <data-dir>/logs/. Running it again reuses the data.

--tls: TLS end to end with certificates made under <data-dir>/pki (openssl): mutual TLS between the
replicas, the lease service on --peer-port+10..+12 taking each agent's report only with its cell's
certificate.

--demo: once everything runs, sends checks for tenant 'acme' at ${DEMO_LOAD_FACTOR} × its quota (${DEMO_QUOTA} req/s),
${DEMO_HOT * 100} % to one cell and ${Math.round((1 - DEMO_HOT) * 100)} % to the other, \
moving the hot spot every ${DEMO_SHIFT_S} s, and prints each
second per cell the offered and admitted rates and the cell's slice (from the coordinators), and the
global admitted rate against the quota.`;

const port = z.coerce.number().int().min(1).max(65_000);

/** Every setting of `cellquota dev`, declared once (shared/cli-config.ts). */
export const devFields = z.object({
  dataDir: setting(z.string().min(1), {
    help: 'where the replicas, the agents and their logs keep their data (reused on the next run)',
    default: './.cellquota',
    example: '/tmp/cellquota-dev',
  }),
  peerPort: setting(port, {
    help: "the first replica's peer (gRPC) port; the others take the next two",
    default: 7001,
    example: '17001',
  }),
  adminPort: setting(port, {
    help: "the first replica's admin API port; the others take the next two",
    default: 8081,
    example: '18081',
  }),
  agentPort: setting(port, {
    help: "cell-a's HTTP API port, cell-b's the next; their TCP RLS ports are 10 above",
    default: 9091,
    example: '19091',
  }),
  tls: setting(z.boolean(), {
    help: 'TLS end to end, with certificates made under <data-dir>/pki (see below)',
    default: false,
    example: 'true',
  }),
  demo: setting(z.boolean(), {
    help: 'drive a skewed load and print the rebalancing each second (see below)',
    default: false,
    example: 'true',
  }),
});

export const DEV_SETTING_SPECS = settingSpecs(devFields);

export async function runDevCommand(argv: readonly string[], env: NodeJS.ProcessEnv): Promise<number> {
  if (argv.includes('--help') || argv.includes('-h')) {
    console.log(devUsage());
    return 0;
  }
  const values = loadSettings('cellquota dev', DEV_SETTING_SPECS, devFields, argv, env);
  const { peerPort, adminPort, agentPort } = values;
  const dataDir = resolve(values.dataDir);
  const logDir = join(dataDir, 'logs');
  mkdirSync(logDir, { recursive: true });
  const ids = ['n1', 'n2', 'n3'];
  const peers = ids.map((id, i) => `${id}=127.0.0.1:${peerPort + i}`).join(',');
  const adminPeers = ids.map((id, i) => `${id}=http://127.0.0.1:${adminPort + i}`).join(',');
  const adminUrls = ids.map((_, i) => `http://127.0.0.1:${adminPort + i}`);
  const script = process.argv[1];
  if (script === undefined) throw new Error('cannot find the cellquota script to start children');
  const children: Child[] = [];
  const cells = ['cell-a', 'cell-b'];
  let pki: ReturnType<typeof makeLocalPki> | null = null;
  if (values.tls) {
    try {
      pki = makeLocalPki(join(dataDir, 'pki'), ids, cells);
    } catch (err) {
      console.error(
        `cellquota dev --tls: cannot make the certificates: ${err instanceof Error ? err.message : String(err)}`,
      );
      return 1;
    }
  }
  const leasePort = (i: number): number => peerPort + 10 + i;
  const tlsOfReplica = (id: string, i: number): string[] =>
    pki === null
      ? []
      : [
          '--tls-ca',
          pki.ca,
          '--tls-cert',
          pki.replica(id).cert,
          '--tls-key',
          pki.replica(id).key,
          '--lease-listen',
          `127.0.0.1:${leasePort(i)}`,
        ];
  const tlsOfCell = (cell: string): string[] =>
    pki === null ? [] : ['--tls-ca', pki.ca, '--tls-cert', pki.cell(cell).cert, '--tls-key', pki.cell(cell).key];

  const startChild = (name: string, args: string[]): Child => {
    const log = join(logDir, `${name}.log`);
    const out = createWriteStream(log, { flags: 'a' });
    const proc = spawn(process.execPath, [...process.execArgv, script, ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...env, CELLQUOTA_CONFIG: undefined },
    });
    proc.stdout?.pipe(out);
    proc.stderr?.pipe(out);
    const child = { name, proc, log };
    proc.on('exit', (code, signal) => {
      if (!stopping) console.error(`! ${name} exited (${signal ?? `code ${code}`}); see ${log}`);
    });
    children.push(child);
    return child;
  };

  let stopping = false;
  const stopAll = async (): Promise<void> => {
    stopping = true;
    await Promise.all(
      children.map(
        (c) =>
          new Promise<void>((done) => {
            if (c.proc.exitCode !== null || c.proc.signalCode !== null) return done();
            const kill = setTimeout(() => c.proc.kill('SIGKILL'), 5000);
            c.proc.once('exit', () => {
              clearTimeout(kill);
              done();
            });
            c.proc.kill('SIGTERM');
          }),
      ),
    );
  };

  console.log(`cellquota dev: data in ${dataDir}, logs in ${logDir}`);
  ids.forEach((id, i) => {
    startChild(`coordinator-${id}`, [
      'coordinator',
      '--id',
      id,
      '--peers',
      peers,
      '--data-dir',
      join(dataDir, id),
      '--admin',
      `127.0.0.1:${adminPort + i}`,
      '--admin-peers',
      adminPeers,
      '--floor-cells',
      '2',
      ...tlsOfReplica(id, i),
    ]);
    console.log(
      `  starting coordinator ${id}: peer 127.0.0.1:${peerPort + i}, admin ${adminUrls[i] ?? ''}` +
        (pki === null ? '' : `, lease 127.0.0.1:${leasePort(i)} (mutual TLS)`),
    );
  });
  const interrupted = new Promise<'interrupted'>((r) => {
    // Ctrl-C in a terminal reaches the children too (one process group): their exits are expected.
    const stop = (): void => {
      stopping = true;
      r('interrupted');
    };
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
  });

  try {
    const leader = await Promise.race([waitForLeader(adminUrls, (msg) => console.log(`  … ${msg}`)), interrupted]);
    if (leader === 'interrupted') {
      await stopAll();
      return 130;
    }
    console.log(`  leader: ${leader}`);
    await putJson(adminUrls, '/v1/tiers/demo', { rate: DEMO_QUOTA, burst: 200, floorFraction: 0.5 });
    await putJson(adminUrls, '/v1/tenants/acme', { tier: 'demo' });

    // The agents: the demo rules only; every quota comes from the coordinators.
    const rulesFile = join(dataDir, 'rules.yaml');
    writeFileSync(rulesFile, demoRules);
    const agentHttp = cells.map((_, i) => `http://127.0.0.1:${agentPort + i}`);
    const coordinators =
      pki === null
        ? ids.map((_, i) => `127.0.0.1:${peerPort + i}`).join(',')
        : ids.map((id, i) => `${id}=127.0.0.1:${leasePort(i)}`).join(',');
    cells.forEach((cell, i) => {
      startChild(`agent-${cell}`, [
        'agent',
        '--cell',
        cell,
        '--rules',
        rulesFile,
        '--rls-socket',
        join(dataDir, `${cell}.sock`),
        '--rls-listen',
        `127.0.0.1:${agentPort + 10 + i}`,
        '--http',
        `127.0.0.1:${agentPort + i}`,
        '--coordinators',
        coordinators,
        '--response-headers',
        ...tlsOfCell(cell),
      ]);
      console.log(
        `  starting agent ${cell}: http ${agentHttp[i] ?? ''}, rls ${join(dataDir, `${cell}.sock`)} and ` +
          `127.0.0.1:${agentPort + 10 + i}`,
      );
    });
    await Promise.race([Promise.all(agentHttp.map((u) => waitForHttp(`${u}/healthz`))), interrupted]);
    const leased = await Promise.race([waitForLeasedCheck(agentHttp[0] ?? ''), interrupted]);
    if (leased === 'interrupted') {
      await stopAll();
      return 130;
    }
    console.log(
      leased
        ? '  cell-a decides acme on a leased grant'
        : '  cell-a holds no grant for acme yet (its checks are refused until the first one)',
    );
    const ctl = `node ${script.endsWith('.ts') ? `--import tsx ${script}` : script} ctl`;
    console.log(`
cellquota is running (3 coordinators and 2 agents on loopback).

  admin API      ${adminUrls.join('  ')}
  peers (gRPC)   ${peers}${
    pki === null
      ? ''
      : `  (mutual TLS; certificates in ${pki.dir})
  leases (gRPC)  ${ids.map((id, i) => `${id}=127.0.0.1:${leasePort(i)}`).join(',')}  \
(each agent's certificate names its cell)`
  }
  agents         cell-a ${agentHttp[0] ?? ''}  cell-b ${agentHttp[1] ?? ''}  \
(Envoy RLS on ${join(dataDir, 'cell-a.sock')} / .../cell-b.sock)
  demo           tier 'demo' (100 req/s, burst 200, floors 25/s per cell), tenant 'acme'; the agents lease slices of it

Try:
  curl -si ${agentHttp[0] ?? ''}/v1/check -H 'content-type: application/json' \\
    -d '{"domain":"demo","descriptors":[{"entries":[{"key":"tenant","value":"acme"}]}]}'
  curl -s ${adminUrls[0] ?? ''}/v1/cluster
  curl -s ${adminUrls[0] ?? ''}/v1/tenants/acme
  ${ctl} cluster
  ${ctl} tiers put gold --rate 5000 --burst 10000

Ctrl-C stops everything; running it again reuses the data.`);
    if (values.demo) {
      const demo = runDemo(cells, agentHttp, adminUrls, (line) => console.log(line));
      await interrupted;
      await demo.stop();
    } else {
      await interrupted;
    }
    console.log('\nstopping…');
    await stopAll();
    console.log('stopped');
    return 0;
  } catch (err) {
    console.error(`cellquota dev: ${err instanceof Error ? err.message : String(err)}; logs in ${logDir}`);
    await stopAll();
    return 1;
  }
}

interface DemoCounts {
  sent: number;
  admitted: number;
  refused: number;
  errors: number;
}

/**
 * The `--demo` load: paced checks (open loop: a 10 ms timer sends what is due, whatever the answers
 * do) over HTTP/1.1 keep-alive to each agent's POST /v1/check, for tenant 'acme' at
 * DEMO_LOAD_FACTOR × its quota, DEMO_HOT of it to one cell and the rest to the other, the hot cell
 * changing every DEMO_SHIFT_S seconds. Each second: one line per cell (offered, admitted, refused,
 * its slice as the coordinators' ledger has it) and the global admitted rate against the quota.
 * With the demo tier's floors (25/s per cell) the quiet cell keeps its floor and the hot cell can
 * grow to 75/s: watch the slices swap after each move.
 */
function runDemo(
  cells: readonly string[],
  agentHttp: readonly string[],
  adminUrls: readonly string[],
  print: (line: string) => void,
): { stop(): Promise<void> } {
  const agent = new HttpAgent({ keepAlive: true, maxSockets: 32 });
  const body = JSON.stringify({ domain: 'demo', descriptors: [{ entries: [{ key: 'tenant', value: 'acme' }] }] });
  const counts: DemoCounts[] = cells.map(() => ({ sent: 0, admitted: 0, refused: 0, errors: 0 }));
  const credit = cells.map(() => 0);
  const total = DEMO_QUOTA * DEMO_LOAD_FACTOR;
  const startedAt = Date.now();
  let hot = 0;
  let inFlight = 0;
  let last = performance.now();
  let stopped = false;

  const send = (i: number): void => {
    const url = new URL(agentHttp[i] ?? '');
    const c = counts[i] as DemoCounts;
    c.sent++;
    inFlight++;
    const req = httpRequest(
      {
        agent,
        host: url.hostname,
        port: url.port,
        method: 'POST',
        path: '/v1/check',
        headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
        timeout: 2000,
      },
      (res) => {
        res.resume();
        res.on('end', () => {
          inFlight--;
          if (res.statusCode === 200) c.admitted++;
          else if (res.statusCode === 429) c.refused++;
          else c.errors++;
        });
      },
    );
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', () => {
      inFlight--;
      c.errors++;
    });
    req.end(body);
  };

  const pace = setInterval(() => {
    const now = performance.now();
    const dt = Math.min(200, now - last) / 1000;
    last = now;
    cells.forEach((_, i) => {
      const share = i === hot ? DEMO_HOT : (1 - DEMO_HOT) / Math.max(1, cells.length - 1);
      const due = (credit[i] ?? 0) + total * share * dt;
      const n = Math.floor(due);
      credit[i] = due - n;
      for (let k = 0; k < n; k++) send(i);
    });
  }, 10);

  // A cell may use max(its grant, its floor) (the agents' rule while leased): that is the slice shown,
  // marked "(floor)" when the floor is what it runs on.
  const slices = async (): Promise<Map<string, { rate: number; onFloor: boolean }>> => {
    for (const u of adminUrls) {
      try {
        const res = await fetch(`${u}/v1/tenants/acme?stale=true`, { signal: AbortSignal.timeout(500) });
        if (!res.ok) continue;
        const t = (await res.json()) as { slices?: { cellId: string; rate: number; floorRate: number }[] };
        return new Map(
          (t.slices ?? []).map((s) => [
            s.cellId,
            { rate: Math.max(s.rate, s.floorRate), onFloor: s.floorRate > s.rate },
          ]),
        );
      } catch {
        // the next replica
      }
    }
    return new Map();
  };

  let tick = 0;
  let reporting = false;
  const pad = (v: number | string, n: number): string => String(v).padStart(n);
  print(
    `\ndemo: tenant 'acme' (quota ${DEMO_QUOTA} req/s), ${total} req/s offered, ${DEMO_HOT * 100} % on one ` +
      `cell, moving every ${DEMO_SHIFT_S} s; Ctrl-C stops\n`,
  );
  const report = setInterval(() => {
    tick++;
    if (tick % DEMO_SHIFT_S === 0) hot = (hot + 1) % cells.length;
    const snapshot = counts.map((c) => ({ ...c }));
    for (const c of counts) Object.assign(c, { sent: 0, admitted: 0, refused: 0, errors: 0 });
    if (reporting) return; // the previous slices read is still out: skip a line rather than pile up
    reporting = true;
    void slices().then((sl) => {
      reporting = false;
      if (stopped) return;
      const t = `[${pad(Math.round((Date.now() - startedAt) / 1000), 4)} s]`;
      cells.forEach((cell, i) => {
        const c = snapshot[i] as DemoCounts;
        const slice = sl.get(cell);
        print(
          `${i === 0 ? t : ' '.repeat(t.length)} ${cell.padEnd(8)} offered ${pad(c.sent, 4)}/s  admitted ` +
            `${pad(c.admitted, 4)}/s  refused ${pad(c.refused, 4)}/s  slice ` +
            `${slice === undefined ? '     —' : pad(slice.rate.toFixed(1), 6)}/s` +
            (slice?.onFloor === true ? ' (floor)' : '') +
            (c.errors > 0 ? `  errors ${c.errors}` : ''),
        );
      });
      const admitted = snapshot.reduce((a, c) => a + c.admitted, 0);
      const sliceSum = [...sl.values()].reduce((a, b) => a + b.rate, 0);
      print(
        `${' '.repeat(t.length)} global   admitted ${pad(admitted, 4)}/s of the quota ${DEMO_QUOTA}/s ` +
          `(${Math.round((admitted / DEMO_QUOTA) * 100)} %), slices sum ${sliceSum.toFixed(1)}/s`,
      );
    });
  }, 1000);

  return {
    async stop(): Promise<void> {
      stopped = true;
      clearInterval(pace);
      clearInterval(report);
      const until = Date.now() + 2000;
      while (inFlight > 0 && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
      agent.destroy();
    },
  };
}

async function waitForLeader(urls: readonly string[], progress: (msg: string) => void): Promise<string> {
  const deadline = Date.now() + 60_000;
  let lastReport = 0;
  for (;;) {
    for (const u of urls) {
      try {
        const res = await fetch(`${u}/v1/cluster?stale=true`, { signal: AbortSignal.timeout(1000) });
        if (res.ok) {
          const c = (await res.json()) as { leader: string | null };
          if (c.leader !== null) return c.leader;
        }
      } catch {
        // not up yet
      }
    }
    if (Date.now() > deadline) throw new Error('no leader elected within 60 s');
    if (Date.now() - lastReport > 2000) {
      lastReport = Date.now();
      progress('waiting for the coordinators to elect a leader');
    }
    await new Promise((r) => setTimeout(r, 200));
  }
}

async function putJson(urls: readonly string[], path: string, body: unknown): Promise<void> {
  const deadline = Date.now() + 30_000;
  let last = '';
  while (Date.now() < deadline) {
    for (const u of urls) {
      try {
        const res = await fetch(`${u}${path}`, {
          method: 'PUT',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify(body),
          signal: AbortSignal.timeout(5000),
        });
        if (res.ok) return;
        last = `${res.status} ${await res.text()}`;
      } catch (err) {
        last = err instanceof Error ? err.message : String(err);
      }
    }
    await new Promise((r) => setTimeout(r, 300));
  }
  throw new Error(`PUT ${path} failed: ${last}`);
}

async function waitForHttp(url: string): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    try {
      const res = await fetch(url, { signal: AbortSignal.timeout(1000) });
      await res.arrayBuffer();
      if (res.ok) return;
    } catch {
      // not up yet
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`${url} did not answer within 60 s`);
}

const demoRules = `# cellquota dev: the demo domain. The tenant's quota is global (coordinated across cells);
# each client address is also limited locally, per cell.
domain: demo
descriptors:
  - key: tenant
    global: true
    descriptors:
      - key: remote_address
        rate_limit: {unit: second, requests_per_unit: 20}
`;

/**
 * Sends a demo check to `agentUrl` every 200 ms until one is admitted without x-ratelimit-degraded
 * (decided on a leased grant): the agent reported acme's demand and got its grant. False after 20 s.
 */
async function waitForLeasedCheck(agentUrl: string): Promise<boolean> {
  const until = Date.now() + 20_000;
  while (Date.now() < until) {
    try {
      const r = await fetch(`${agentUrl}/v1/check`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ domain: 'demo', descriptors: [{ entries: [{ key: 'tenant', value: 'acme' }] }] }),
        signal: AbortSignal.timeout(1000),
      });
      await r.arrayBuffer();
      if (r.status === 200 && r.headers.get('x-ratelimit-degraded') !== 'true') return true;
    } catch {
      // not serving yet
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  return false;
}
