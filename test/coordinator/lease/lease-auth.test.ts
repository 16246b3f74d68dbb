// Only the right cell may speak for a cell: real coordinator and agent processes with mutual TLS
// (certificates from scripts/make-certs.sh) and the lease service on its own port (--lease-listen),
// then per-cell tokens on a one-replica cluster. Skipped, with a note, when openssl is missing.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { createHash, randomUUID } from 'node:crypto';
import * as grpc from '@grpc/grpc-js';
import pino from 'pino';
import { CoordinatorCluster } from '../../../testkit/coordinator-cluster.js';
import {
  loadQuotaLeaseService,
  type ReportRequestMessage,
  type ReportResponseMessage,
} from '../../../shared/lease-proto.js';
import { PeerTransport } from '../../../coordinator/transport/peer-transport.js';
import { freePort } from '../../../testkit/ports.js';
import { AgentProcess } from '../../../testkit/agent-process.js';
import { waitFor } from '../../../testkit/wait.js';

const repo = resolve(import.meta.dirname, '../../..');
const cli = join(repo, 'cli/main.ts');
const ids = ['n1', 'n2', 'n3'];

function hasOpenssl(): boolean {
  try {
    execFileSync('openssl', ['version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}
const skip = hasOpenssl()
  ? false
  : 'openssl is not on PATH: cannot make certificates, the authentication tests are skipped';

const RULES = 'domain: api\ndescriptors:\n  - key: tenant\n    global: true\n';

async function leaseState(a: AgentProcess): Promise<number | null> {
  const text = await (await fetch(`${a.url}/metrics`, { signal: AbortSignal.timeout(2000) })).text();
  const m = /^cellquota_agent_lease_state (\S+)$/m.exec(text);
  return m === null ? null : Number(m[1]);
}

const svc = loadQuotaLeaseService();
const LeaseClientCtor = grpc.makeGenericClientConstructor(svc.definition, 'QuotaLease');

type Outcome = { ok: true; res: ReportResponseMessage } | { ok: false; code: grpc.status; details: string };

/** One raw Report call, as any program on the network could make it. */
async function report(
  address: string,
  creds: grpc.ChannelCredentials,
  req: Partial<ReportRequestMessage> & { cellId: string },
  token?: string,
): Promise<Outcome> {
  const client = new LeaseClientCtor(address, creds);
  const md = new grpc.Metadata();
  if (token !== undefined) md.set('authorization', `Bearer ${token}`);
  const full: ReportRequestMessage = { incarnation: 'raw', sentAtMs: Date.now(), acks: [], velocity: [], ...req };
  try {
    return await new Promise<Outcome>((ok) => {
      client.makeUnaryRequest(
        svc.report.path,
        svc.report.requestSerialize,
        svc.report.responseDeserialize,
        full,
        md,
        { deadline: Date.now() + 3000 },
        (err: grpc.ServiceError | null, res?: ReportResponseMessage) =>
          ok(
            err === null && res !== undefined
              ? { ok: true, res }
              : { ok: false, code: err?.code ?? grpc.status.UNKNOWN, details: err?.details ?? '' },
          ),
      );
    });
  } finally {
    client.close();
  }
}

/** Reports to whichever address leads (followers answer FAILED_PRECONDITION). */
async function reportToLeader(
  addresses: readonly string[],
  creds: grpc.ChannelCredentials,
  req: Partial<ReportRequestMessage> & { cellId: string },
  token?: string,
): Promise<Outcome> {
  let last: Outcome = { ok: false, code: grpc.status.UNKNOWN, details: 'no address' };
  for (const a of addresses) {
    last = await report(a, creds, req, token);
    if (last.ok || last.code !== grpc.status.FAILED_PRECONDITION) return last;
  }
  return last;
}

function refusedCount(metrics: string, reason: string): number {
  const m = new RegExp(`^cellquota_lease_reports_refused_total\\{reason="${reason}"\\} (\\S+)$`, 'm').exec(metrics);
  return m === null ? 0 : Number(m[1]);
}

void test(
  "mutual TLS: a cell speaks only for itself; no certificate, no lease; a replica cannot take another's id; ctl cells remove frees the floor slot",
  { skip },
  async () => {
    const leasePorts = new Map<string, number>();
    for (const id of ids) leasePorts.set(id, await freePort());
    const c = await CoordinatorCluster.create(ids, ['--floor-cells', '2', '--lease-ttl-ms', '1000'], (r) => [
      '--tls-ca',
      join(r.dataDir, '..', 'pki', 'ca.pem'),
      '--tls-cert',
      join(r.dataDir, '..', 'pki', `replica-${r.id}.pem`),
      '--tls-key',
      join(r.dataDir, '..', 'pki', `replica-${r.id}.key`),
      '--lease-listen',
      `127.0.0.1:${leasePorts.get(r.id) ?? 0}`,
    ]);
    const agents: AgentProcess[] = [];
    let impostor: PeerTransport | null = null;
    try {
      const pki = join(c.root, 'pki');
      execFileSync(
        join(repo, 'scripts/make-certs.sh'),
        [pki, '--replicas', ids.join(','), '--cells', 'c1,c2,c3', '--days', '1'],
        { stdio: 'pipe' },
      );
      const pem = (name: string): Buffer => readFileSync(join(pki, name));
      const asCell = (cell: string): grpc.ChannelCredentials =>
        grpc.credentials.createSsl(pem('ca.pem'), pem(`cell-${cell}.key`), pem(`cell-${cell}.pem`));
      writeFileSync(join(c.root, 'rules.yaml'), RULES);
      c.startAll();
      const leader = await c.waitForLeader(30_000);
      assert.equal((await c.write('PUT', '/v1/tiers/gold', { rate: 100, burst: 100, floorFraction: 0.5 })).status, 200);
      assert.equal((await c.write('PUT', '/v1/tenants/acme', { tier: 'gold' })).status, 200);
      const leaseAddrs = ids.map((id) => `127.0.0.1:${leasePorts.get(id) ?? 0}`);

      // c2, with its own certificate, reports demand until it holds a grant, then goes quiet until the
      // grant shrinks: a shrink it has not acknowledged (the larger grant stays counted until it does).
      const grown = await waitFor(
        'a grant for c2',
        async () => {
          const r = await reportToLeader(leaseAddrs, asCell('c2'), {
            cellId: 'c2',
            velocity: [{ key: 'tenant/acme', allowedPerS: 0, refusedPerS: 80 }],
          });
          return r.ok
            ? (r.res.grants.find((g) => g.key === 'tenant/acme' && g.epoch > 0 && g.rate > g.floorRate) ?? null)
            : null;
        },
        { timeoutMs: 90_000, everyMs: 150 },
      );
      const c2Grant = await waitFor(
        'a shrink for c2',
        async () => {
          const r = await reportToLeader(leaseAddrs, asCell('c2'), {
            cellId: 'c2',
            acks: [{ key: 'tenant/acme', epoch: grown.epoch }],
            velocity: [{ key: 'tenant/acme', allowedPerS: 0, refusedPerS: 0 }],
          });
          return r.ok ? (r.res.grants.find((g) => g.key === 'tenant/acme' && g.epoch > grown.epoch) ?? null) : null;
        },
        { timeoutMs: 90_000, everyMs: 150 },
      );
      const sliceOf = async (cell: string): Promise<Record<string, unknown> | undefined> =>
        (
          (await c.http(leader, 'GET', '/v1/tenants/acme')).body['slices'] as Record<string, unknown>[] | undefined
        )?.find((s) => s['cellId'] === cell);
      const cellsNow = async (): Promise<Record<string, unknown>[]> =>
        (await c.http(leader, 'GET', '/v1/cells')).body['cells'] as Record<string, unknown>[];
      const before = await sliceOf('c2');
      assert.equal(
        before?.['acknowledged'],
        false,
        `c2 has not acknowledged epoch ${c2Grant.epoch}: ${JSON.stringify(before)}`,
      );
      const c2ReportedAt = (await cellsNow()).find((x) => x['id'] === 'c2')?.['lastReportAt'];

      // c1's certificate carrying c2's report and acknowledgement: refused by every replica.
      const forged = {
        cellId: 'c2',
        acks: [{ key: 'tenant/acme', epoch: c2Grant.epoch }],
        velocity: [{ key: 'tenant/acme', allowedPerS: 0, refusedPerS: 1000 }],
      };
      for (const a of leaseAddrs) {
        const r = await report(a, asCell('c1'), forged);
        assert.ok(
          !r.ok && r.code === grpc.status.PERMISSION_DENIED,
          `forged report refused with PERMISSION_DENIED at ${a}: ${JSON.stringify(r)}`,
        );
        assert.match(r.ok ? '' : r.details, /names cell c1, not c2/);
      }
      // Without a client certificate, or from a stranger's CA, the lease port does not even talk.
      const noCert = await report(leaseAddrs[0] as string, grpc.credentials.createSsl(pem('ca.pem')), forged);
      assert.ok(!noCert.ok, 'no client certificate: no answer');
      const plaintext = await report(leaseAddrs[0] as string, grpc.credentials.createInsecure(), forged);
      assert.ok(!plaintext.ok, 'plaintext: no answer');
      const after = await sliceOf('c2');
      assert.deepEqual(
        { epoch: after?.['epoch'], acknowledged: after?.['acknowledged'], rate: after?.['rate'] },
        { epoch: before?.['epoch'], acknowledged: false, rate: before?.['rate'] },
        'the ledger is unchanged: the forged ack did not count',
      );
      assert.equal(
        (await cellsNow()).find((x) => x['id'] === 'c2')?.['lastReportAt'],
        c2ReportedAt,
        'nor did the forged report renew c2',
      );
      const metrics = await (await fetch(`${c.adminUrl(leader)}/metrics`)).text();
      assert.ok(
        refusedCount(metrics, 'permission_denied') >= 1,
        'counted in cellquota_lease_reports_refused_total{reason="permission_denied"}',
      );

      // Real agents: c1 with its certificate is leased; one with c2's certificate as --cell c1 does not
      // start; c3 without a certificate gets no lease and says why.
      const coordinators = ids.map((id, i) => `${id}=${leaseAddrs[i] ?? ''}`).join(',');
      const tlsFor = (cell: string): string[] => [
        '--tls-ca',
        join(pki, 'ca.pem'),
        '--tls-cert',
        join(pki, `cell-${cell}.pem`),
        '--tls-key',
        join(pki, `cell-${cell}.key`),
      ];
      const good = await AgentProcess.start({
        cell: 'c1',
        rules: join(c.root, 'rules.yaml'),
        coordinators,
        workers: 0,
        args: tlsFor('c1'),
      });
      const wrong = await AgentProcess.start({
        cell: 'c1',
        rules: join(c.root, 'rules.yaml'),
        coordinators,
        workers: 0,
        args: tlsFor('c2'),
      });
      const bare = await AgentProcess.start({
        cell: 'c3',
        rules: join(c.root, 'rules.yaml'),
        coordinators,
        workers: 0,
        args: ['--tls-ca', join(pki, 'ca.pem')],
      });
      agents.push(good, wrong, bare);
      await waitFor('agent c1 leased over mutual TLS', async () => (await leaseState(good)) === 1, {
        timeoutMs: 90_000,
        everyMs: 150,
      });
      assert.equal(await wrong.exit, 2, `an agent whose certificate names another cell exits 2:\n${wrong.output}`);
      assert.match(wrong.output, /names cell c2, not --cell c1/);
      await waitFor(
        'the agent without a certificate logs why it has no lease',
        () =>
          Promise.resolve(
            /lease report failed.*presents no identity|presents no identity.*lease report failed/.test(bare.output),
          ),
        { timeoutMs: 90_000, everyMs: 150 },
      );
      assert.notEqual(await leaseState(bare), 1, 'no certificate, no lease');
      assert.equal(
        (await cellsNow()).some((x) => x['id'] === 'c3'),
        false,
        'and no registration',
      );

      // A replica certificate (n2's) presenting itself as n3 to n1: refused.
      impostor = new PeerTransport({
        selfId: 'n3',
        clusterId: 'cellquota',
        listen: '127.0.0.1:0',
        peers: new Map([['n1', `127.0.0.1:${c.replica('n1').peerPort}`]]),
        onMessages: () => undefined,
        logger: pino({ level: 'silent' }),
        tls: { ca: pem('ca.pem'), cert: pem('replica-n2.pem'), key: pem('replica-n2.key') },
      });
      await impostor.start();
      await waitFor(
        'n1 refuses the impostor',
        () =>
          Promise.resolve(
            (impostor?.stats().peers['n1']?.refused ?? 0) > 0 &&
              /declares id n3 but its certificate names n2/.test(c.replica('n1').output),
          ),
        { timeoutMs: 90_000, everyMs: 150 },
      );
      assert.equal(impostor.stats().peers['n1']?.connected, false);

      // ctl cells remove: c2 (slot 0, silent since its raw reports) is dropped once its lease is over;
      // c3 then takes its floor slot (with --floor-cells 2 it would otherwise get none).
      assert.deepEqual(
        (await cellsNow()).map((x) => [x['id'], x['slot']]),
        [
          ['c2', 0],
          ['c1', 1],
        ],
      );
      const ctl = execFileSync(
        process.execPath,
        ['--import', 'tsx', cli, 'ctl', '--admin', c.adminUrl(leader), 'cells', 'remove', 'c2'],
        { encoding: 'utf8' },
      );
      assert.match(ctl, /cell c2 (removed|is being removed)/);
      await waitFor('c2 dropped', async () => !(await cellsNow()).some((x) => x['id'] === 'c2'), {
        timeoutMs: 90_000,
        everyMs: 150,
      });
      const c3 = await waitFor(
        'c3 registered',
        async () => {
          const r = await reportToLeader(leaseAddrs, asCell('c3'), { cellId: 'c3' });
          return r.ok ? r : null;
        },
        { timeoutMs: 90_000, everyMs: 150 },
      );
      assert.ok(c3.ok);
      assert.equal(
        (await cellsNow()).find((x) => x['id'] === 'c3')?.['slot'],
        0,
        'the new cell has the freed floor slot',
      );
    } finally {
      await impostor?.stop();
      for (const a of agents) a.proc.kill('SIGKILL');
      await c.cleanup();
    }
  },
);

void test(
  "per-cell tokens: the right token is leased, a wrong or missing one is UNAUTHENTICATED, another cell's is PERMISSION_DENIED; the cell bound refuses a registration clearly",
  { skip },
  async () => {
    const leasePort = await freePort();
    const c = await CoordinatorCluster.create(
      ['n1'],
      ['--max-cells', '1', '--lease-listen', `127.0.0.1:${leasePort}`],
      (r) => ['--lease-tokens', join(r.dataDir, '..', 'tokens.yaml')],
    );
    const tokens = { c1: randomUUID(), c2: randomUUID() };
    const agents: AgentProcess[] = [];
    try {
      // The token file: c1's token in the clear, c2's only as its sha256.
      const tokenFile = join(c.root, 'tokens.yaml');
      writeFileSync(
        tokenFile,
        `c1: ${tokens.c1}\nc2: sha256:${createHash('sha256').update(tokens.c2).digest('hex')}\n`,
      );
      writeFileSync(join(c.root, 'rules.yaml'), RULES);
      c.startAll();
      await c.waitForLeader(30_000);
      const addr = `127.0.0.1:${leasePort}`;
      const plain = grpc.credentials.createInsecure();
      const missing = await report(addr, plain, { cellId: 'c1' });
      assert.ok(!missing.ok && missing.code === grpc.status.UNAUTHENTICATED, `no token: ${JSON.stringify(missing)}`);
      const wrong = await report(addr, plain, { cellId: 'c1' }, 'not-the-token-of-anyone');
      assert.ok(!wrong.ok && wrong.code === grpc.status.UNAUTHENTICATED, `wrong token: ${JSON.stringify(wrong)}`);
      const other = await report(addr, plain, { cellId: 'c1' }, tokens.c2);
      assert.ok(
        !other.ok && other.code === grpc.status.PERMISSION_DENIED,
        `c2's token for c1: ${JSON.stringify(other)}`,
      );

      const tokenPath = join(c.root, 'c1.token');
      writeFileSync(tokenPath, `${tokens.c1}\n`);
      const agent = await AgentProcess.start({
        cell: 'c1',
        rules: join(c.root, 'rules.yaml'),
        coordinators: addr,
        workers: 0,
        args: ['--lease-token-file', tokenPath],
      });
      agents.push(agent);
      await waitFor('agent c1 leased with its token', async () => (await leaseState(agent)) === 1, {
        timeoutMs: 90_000,
        everyMs: 150,
      });
      // --max-cells 1: c2 (a valid token) cannot register while c1 is.
      const full = await report(addr, plain, { cellId: 'c2' }, tokens.c2);
      assert.ok(!full.ok && full.code === grpc.status.RESOURCE_EXHAUSTED, `the cell bound: ${JSON.stringify(full)}`);
      assert.match(full.ok ? '' : full.details, /--max-cells/);
      const metrics = await (await fetch(`${c.adminUrl('n1')}/metrics`)).text();
      assert.equal(refusedCount(metrics, 'unauthenticated'), 2);
      assert.equal(refusedCount(metrics, 'permission_denied'), 1);
      assert.ok(refusedCount(metrics, 'too_many_cells') >= 1);
    } finally {
      for (const a of agents) a.proc.kill('SIGKILL');
      await c.cleanup();
    }
  },
);
