// `cellquota dev` (what `npm start` runs): a whole local deployment on loopback — three
// coordinator replicas and two cell agents (cell-a, cell-b) as child processes, data under
// ./.cellquota (reused on the next run), a demo tier and tenant — then the endpoints and an
// example check. Ctrl-C stops everything.
//
// Until the lease client connects agents to the coordinators, each agent serves the demo tenant on
// a static half of its quota (the two halves add up to the quota: the global bound holds).
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, mkdirSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';

interface Child {
  readonly name: string;
  readonly proc: ChildProcess;
  readonly log: string;
}

const devUsage = `cellquota dev [--data-dir ./.cellquota] [--peer-port 7001] [--admin-port 8081] [--agent-port 9091]

Starts 3 coordinators on 127.0.0.1 (peers on --peer-port..+2, admin API on --admin-port..+2) and
2 agents (cell-a, cell-b: HTTP on --agent-port..+1, gRPC RLS on <data-dir>/cell-*.sock and on
--agent-port+10..+11), creates the demo tier and tenant, prints the endpoints and waits; Ctrl-C
stops everything.
Logs go to <data-dir>/logs/. Running it again reuses the data.`;

export async function runDevCommand(argv: readonly string[], env: NodeJS.ProcessEnv): Promise<number> {
  const { values } = parseArgs({
    args: [...argv],
    strict: true,
    options: {
      'data-dir': { type: 'string', default: env['CELLQUOTA_DATA_DIR'] ?? './.cellquota' },
      'peer-port': { type: 'string', default: '7001' },
      'admin-port': { type: 'string', default: '8081' },
      'agent-port': { type: 'string', default: '9091' },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  if (values.help) {
    console.log(devUsage);
    return 0;
  }
  const peerPort = Number(values['peer-port']);
  const adminPort = Number(values['admin-port']);
  const agentPort = Number(values['agent-port']);
  if ([peerPort, adminPort, agentPort].some((p) => !Number.isInteger(p) || p < 1 || p > 65000)) {
    console.error('cellquota dev: --peer-port, --admin-port and --agent-port must be ports below 65000');
    return 2;
  }
  const dataDir = resolve(values['data-dir']);
  const logDir = join(dataDir, 'logs');
  mkdirSync(logDir, { recursive: true });
  const ids = ['n1', 'n2', 'n3'];
  const peers = ids.map((id, i) => `${id}=127.0.0.1:${peerPort + i}`).join(',');
  const adminPeers = ids.map((id, i) => `${id}=http://127.0.0.1:${adminPort + i}`).join(',');
  const adminUrls = ids.map((_, i) => `http://127.0.0.1:${adminPort + i}`);
  const script = process.argv[1];
  if (script === undefined) throw new Error('cannot find the cellquota script to start children');
  const children: Child[] = [];

  const startChild = (name: string, args: string[]): Child => {
    const log = join(logDir, `${name}.log`);
    const out = createWriteStream(log, { flags: 'a' });
    const proc = spawn(process.execPath, [...process.execArgv, script, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...env, CELLQUOTA_CONFIG: undefined } });
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
    startChild(`coordinator-${id}`, ['coordinator', '--id', id, '--peers', peers, '--data-dir', join(dataDir, id), '--admin', `127.0.0.1:${adminPort + i}`, '--admin-peers', adminPeers]);
    console.log(`  starting coordinator ${id}: peer 127.0.0.1:${peerPort + i}, admin ${adminUrls[i] ?? ''}`);
  });
  const interrupted = new Promise<'interrupted'>((r) => {
    process.once('SIGINT', () => r('interrupted'));
    process.once('SIGTERM', () => r('interrupted'));
  });

  try {
    const leader = await Promise.race([waitForLeader(adminUrls, (msg) => console.log(`  … ${msg}`)), interrupted]);
    if (leader === 'interrupted') {
      await stopAll();
      return 130;
    }
    console.log(`  leader: ${leader}`);
    await putJson(adminUrls, '/v1/tiers/demo', { rate: 100, burst: 200, floorFraction: 0.5 });
    await putJson(adminUrls, '/v1/tenants/acme', { tier: 'demo' });

    // The agents: the demo rules and the static tenant table (the coordinators' demo, until leases).
    const rulesFile = join(dataDir, 'rules.yaml');
    const tenantsFile = join(dataDir, 'tenants.yaml');
    writeFileSync(rulesFile, demoRules);
    writeFileSync(tenantsFile, demoTenants);
    const cells = ['cell-a', 'cell-b'];
    const agentHttp = cells.map((_, i) => `http://127.0.0.1:${agentPort + i}`);
    const coordinators = ids.map((_, i) => `127.0.0.1:${peerPort + i}`).join(',');
    cells.forEach((cell, i) => {
      startChild(`agent-${cell}`, [
        'agent', '--cell', cell, '--rules', rulesFile, '--tenants', tenantsFile, '--static-share', '0.5',
        '--rls-socket', join(dataDir, `${cell}.sock`), '--rls-listen', `127.0.0.1:${agentPort + 10 + i}`,
        '--http', `127.0.0.1:${agentPort + i}`, '--coordinators', coordinators, '--response-headers',
      ]);
      console.log(`  starting agent ${cell}: http ${agentHttp[i] ?? ''}, rls ${join(dataDir, `${cell}.sock`)} and 127.0.0.1:${agentPort + 10 + i}`);
    });
    await Promise.race([Promise.all(agentHttp.map((u) => waitForHttp(`${u}/healthz`))), interrupted]);
    const ctl = `node ${script.endsWith('.ts') ? `--import tsx ${script}` : script} ctl`;
    console.log(`
cellquota is running (3 coordinators and 2 agents on loopback).

  admin API      ${adminUrls.join('  ')}
  peers (gRPC)   ${peers}
  agents         cell-a ${agentHttp[0] ?? ''}  cell-b ${agentHttp[1] ?? ''}  (Envoy RLS on ${join(dataDir, 'cell-a.sock')} / .../cell-b.sock)
  demo           tier 'demo' (100 req/s, burst 200), tenant 'acme'; each agent serves half of it (static share)

Try:
  curl -si ${agentHttp[0] ?? ''}/v1/check -H 'content-type: application/json' \\
    -d '{"domain":"demo","descriptors":[{"entries":[{"key":"tenant","value":"acme"}]}]}'
  curl -s ${adminUrls[0] ?? ''}/v1/cluster
  curl -s ${adminUrls[0] ?? ''}/v1/tenants/acme
  ${ctl} cluster
  ${ctl} tiers put gold --rate 5000 --burst 10000

Ctrl-C stops everything; running it again reuses the data.`);
    await interrupted;
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
        const res = await fetch(`${u}${path}`, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body), signal: AbortSignal.timeout(5000) });
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

const demoTenants = `# cellquota dev: the static tier table the agents use until the lease client connects them to
# the coordinators (same figures as the coordinators' demo tier and tenant).
tiers:
  demo: {rate: 100, burst: 200}
tenants:
  acme: demo
`;
