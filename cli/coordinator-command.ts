// `cellquota coordinator`: one coordinator replica (Raft over LevelDB and gRPC, the ledger, the
// admin API). Settings from flags, CELLQUOTA_* variables or --config, validated with zod.
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { z } from 'zod';
import { collectDefaultMetrics, Registry } from 'prom-client';
import { CoordinatorMetrics } from '../coordinator/node/coordinator-metrics.js';
import { ConfigError, loadSettings, parseHostPort, setting, settingSpecs, settingsHelp } from '../shared/cli-config.js';
import { createRootLogger, logLevels } from '../shared/logging.js';
import { CoordinatorNode, storageErrno, type CoordinatorFailure } from '../coordinator/node/coordinator-node.js';
import { buildAdminServer } from '../coordinator/api/admin-server.js';
import { LiveTraffic } from '../coordinator/api/live-traffic.js';
import { TokenFile } from '../coordinator/lease/lease-auth.js';
import { guessPeerAddresses } from './peer-addresses.js';
import {
  DEFAULT_LEASE_TTL_MS,
  DEFAULT_MAX_DEMAND_KEYS,
  DEFAULT_ROUND_MS,
  MAX_REPORT_ITEMS,
} from '../coordinator/lease/lease-service.js';
import {
  BASE_COMMAND_FORMAT,
  MAX_CELLS,
  MAX_TENANTS,
  NEWEST_COMMAND_FORMAT,
} from '../coordinator/ledger/ledger-commands.js';
import {
  DEFAULT_IMPLICIT_TENANT_IDLE_MS,
  DEFAULT_MAX_IMPLICIT_TENANTS,
  MAX_IMPLICIT_TENANT_IDLE_MS,
} from '../coordinator/lease/implicit-tenants.js';
import { DEFAULT_FLOOR_CELLS, DEFAULT_SKEW_MARGIN_MS } from '../coordinator/ledger/ledger.js';
import { defaultRaftTuning } from '../coordinator/raft/raft-types.js';

const idSchema = z.string().regex(/^[a-z0-9][a-z0-9-]{0,62}$/, 'lowercase letters, digits and dashes, at most 63');
const hostPort = z.string().refine((v) => parseHostPort(v) !== null, 'must be host:port');

function idMap(value: z.ZodType<string>, what: string) {
  return z.string().transform((s, ctx) => {
    const out = new Map<string, string>();
    for (const part of s
      .split(',')
      .map((p) => p.trim())
      .filter((p) => p.length > 0)) {
      const eq = part.indexOf('=');
      const id = part.slice(0, eq);
      const v = part.slice(eq + 1);
      if (eq <= 0 || !idSchema.safeParse(id).success || !value.safeParse(v).success) {
        ctx.addIssue({ code: 'custom', message: `'${part}' is not id=${what}` });
        return z.NEVER;
      }
      if (out.has(id)) {
        ctx.addIssue({ code: 'custom', message: `id ${id} is listed twice` });
        return z.NEVER;
      }
      out.set(id, v);
    }
    return out;
  });
}

/** Every setting of `cellquota coordinator`, declared once (shared/cli-config.ts). */
export const coordinatorFields = z.object({
  id: setting(idSchema, { help: 'this replica id, one of the ids in --peers', example: 'n1' }),
  peers: setting(idMap(hostPort, 'host:port'), {
    help: 'every voting replica as id=host:port, comma-separated; the gRPC address peers and agents use',
    example: 'n1=127.0.0.1:7001,n2=127.0.0.1:7002,n3=127.0.0.1:7003',
  }),
  dataDir: setting(z.string().min(1), {
    help: 'where the Raft log, hard state and snapshots live',
    example: '/var/lib/cellquota',
  }),
  admin: setting(hostPort, {
    help: 'admin API listen address host:port',
    default: '127.0.0.1:8081',
    example: '0.0.0.0:8081',
  }),
  adminPeers: setting(idMap(z.string().url(), 'http://host:port').optional(), {
    help: 'admin URLs of the replicas as id=http://host:port, for redirecting writes to the leader',
    defaultHelp: 'the peer host with this --admin port (unknown for replicas sharing a host)',
    example: 'n1=http://10.0.0.1:8081',
  }),
  adminToken: setting(z.string().min(8, 'at least 8 characters').optional(), {
    help: 'bearer token required for admin writes (unset: no auth)',
    example: 'a-long-admin-token',
  }),
  authReads: setting(z.boolean(), { help: 'require the token for reads too', default: false, example: 'true' }),
  clusterId: setting(z.string().regex(/^[a-zA-Z0-9._-]{1,64}$/), {
    help: 'cluster name; peers of another cluster are refused',
    default: 'cellquota',
    example: 'eu-prod',
  }),
  join: setting(z.boolean(), {
    help: 'start empty and wait to be added by `cellquota ctl members add` (do not bootstrap)',
    default: false,
    example: 'true',
  }),
  tickMs: setting(z.coerce.number().int().min(1).max(10_000), { help: 'Raft tick in ms', default: 50, example: '20' }),
  electionTicks: setting(z.coerce.number().int().min(3).max(1000), {
    help: 'election timeout in ticks, randomized in [E, 2E)',
    default: defaultRaftTuning.electionTicks,
    example: '20',
  }),
  heartbeatTicks: setting(z.coerce.number().int().min(1).max(100), {
    help: 'heartbeat interval in ticks',
    default: defaultRaftTuning.heartbeatTicks,
    example: '2',
  }),
  snapshotEvery: setting(z.coerce.number().int().min(10).max(10_000_000), {
    help: 'entries between snapshots',
    default: 10_000,
    example: '50000',
  }),
  floorCells: setting(z.coerce.number().int().min(1).max(64), {
    help: 'expected number of cells the floors are split over',
    default: DEFAULT_FLOOR_CELLS,
    example: '5',
  }),
  leaseTtlMs: setting(z.coerce.number().int().min(500).max(600_000), {
    help: "how long an agent's lease lasts after its report",
    default: DEFAULT_LEASE_TTL_MS,
    example: '5000',
  }),
  leaseRoundMs: setting(z.coerce.number().int().min(10).max(10_000), {
    help: 'interval of the lease rounds (one reportAndGrant entry each)',
    default: DEFAULT_ROUND_MS,
    example: '200',
  }),
  leaseListen: setting(hostPort.optional(), {
    help:
      "host:port of the agents' lease service on its own gRPC " +
      'server, so the peer port can stay closed to the cells',
    defaultHelp: "this replica's --peers address",
    example: '0.0.0.0:7002',
  }),
  leasePeers: setting(idMap(hostPort, 'host:port').optional(), {
    help: 'lease addresses of the replicas as id=host:port, named to agents that reached a follower',
    defaultHelp: 'the peer host with the --lease-listen port (unknown for replicas sharing a host)',
    example: 'n1=10.0.0.1:7002',
  }),
  leaseTokens: setting(z.string().min(1).optional(), {
    help:
      'YAML/JSON file mapping each cell id to its bearer token (or sha256:<hex> of it): agents authenticate with ' +
      'the token instead of a certificate; re-read when it changes. With TLS it needs --lease-listen',
    example: '/etc/cellquota/lease-tokens.yaml',
  }),
  maxCells: setting(z.coerce.number().int().min(1).max(MAX_CELLS), {
    help:
      "most cells that may register (at most the ledger's limit, the default); a cell beyond it is refused until " +
      'one is removed (ctl cells remove)',
    default: MAX_CELLS,
    example: '16',
  }),
  maxDemandKeys: setting(
    z.coerce
      .number()
      .int()
      .min(1)
      .max(MAX_REPORT_ITEMS * 10),
    {
      help: 'most demand keys the leader keeps per cell; beyond it new keys get no grant until others go quiet',
      default: DEFAULT_MAX_DEMAND_KEYS,
      example: '20000',
    },
  ),
  maxImplicitTenants: setting(z.coerce.number().int().min(0).max(MAX_TENANTS), {
    help:
      'most implicit tenants (unknown-tenant policy tier:NAME) the ledger holds, winding-down ones included; ' +
      'beyond it an unknown tenant is refused as under the policy deny ' +
      '(cellquota_lease_implicit_tenants_refused_total)',
    default: DEFAULT_MAX_IMPLICIT_TENANTS,
    example: '20000',
  }),
  implicitTenantIdleMs: setting(z.coerce.number().int().min(1000).max(MAX_IMPLICIT_TENANT_IDLE_MS), {
    help:
      'an implicit tenant no cell reported demand for this long is wound down as a deletion (zero grants ' +
      'acknowledged or leases expired, then dropped from the ledger)',
    default: DEFAULT_IMPLICIT_TENANT_IDLE_MS,
    example: '60000',
  }),
  commandFormat: setting(z.coerce.number().int().min(BASE_COMMAND_FORMAT).max(NEWEST_COMMAND_FORMAT), {
    help:
      'the newest command format this replica declares and applies: the leader raises the log to a format only ' +
      'once every replica declares it, and a replica stops at a raise above its own. Lower than the build, it ' +
      "holds the raise back (an upgrade that can still be rolled back); the log's format never goes down",
    default: NEWEST_COMMAND_FORMAT,
    example: '4',
  }),
  tlsCa: setting(z.string().optional(), {
    help: 'CA bundle for mutual TLS: replicas and agents must present certificates it signed',
    example: '/etc/cellquota/ca.pem',
  }),
  tlsCert: setting(z.string().optional(), {
    help: 'this replica certificate (PEM; names the replica: URI urn:cellquota:replica:<id> or CN <id>)',
    example: '/etc/cellquota/n1.pem',
  }),
  tlsKey: setting(z.string().optional(), { help: 'this replica key (PEM)', example: '/etc/cellquota/n1-key.pem' }),
  logLevel: setting(z.enum(logLevels), { help: `one of ${logLevels.join(', ')}`, default: 'info', example: 'debug' }),
});

export const coordinatorSpecs = settingSpecs(coordinatorFields);

export const coordinatorSchema = coordinatorFields.superRefine((s, ctx) => {
  if (!s.peers.has(s.id))
    ctx.addIssue({ code: 'custom', path: ['peers'], message: `must include this replica's id ${s.id}` });
  if (s.heartbeatTicks >= s.electionTicks)
    ctx.addIssue({ code: 'custom', path: ['heartbeatTicks'], message: 'must be below --election-ticks' });
  const tls = [s.tlsCa, s.tlsCert, s.tlsKey].filter((v) => v !== undefined).length;
  if (tls !== 0 && tls !== 3)
    ctx.addIssue({ code: 'custom', path: ['tlsCa'], message: '--tls-ca, --tls-cert and --tls-key go together' });
  if (tls === 3 && s.leaseTokens !== undefined && s.leaseListen === undefined)
    ctx.addIssue({
      code: 'custom',
      path: ['leaseTokens'],
      message: 'with TLS, tokens need --lease-listen (the peer port requires replica certificates)',
    });
  if (s.leasePeers !== undefined && s.leaseListen === undefined)
    ctx.addIssue({ code: 'custom', path: ['leasePeers'], message: 'only with --lease-listen' });
  const peer = s.peers.get(s.id);
  if (
    s.leaseListen !== undefined &&
    peer !== undefined &&
    parseHostPort(peer)?.port === parseHostPort(s.leaseListen)?.port &&
    parseHostPort(s.leaseListen)?.port !== 0
  )
    ctx.addIssue({
      code: 'custom',
      path: ['leaseListen'],
      message: `must be another port than this replica's peer address ${peer}`,
    });
});

/** Exit code when the data directory failed under a running node (sysexits EX_IOERR). */
export const exitStorageFailure = 74;
/** Exit code when the Raft node failed otherwise (sysexits EX_SOFTWARE). */
export const exitInternalFailure = 70;

export function coordinatorHelp(): string {
  return (
    'cellquota coordinator --id n1 --peers n1=127.0.0.1:7001,n2=...,n3=... --data-dir DIR --admin ' +
    `127.0.0.1:8081\n\n${settingsHelp(coordinatorSpecs)}`
  );
}

export async function runCoordinatorCommand(argv: readonly string[], env: NodeJS.ProcessEnv): Promise<number> {
  if (argv.includes('--help') || argv.includes('-h')) {
    console.log(coordinatorHelp());
    return 0;
  }
  const s = loadSettings('cellquota coordinator', coordinatorSpecs, coordinatorSchema, argv, env);
  const logger = createRootLogger({ level: s.logLevel, name: 'cellquota-coordinator', base: { node: s.id } });
  const tls =
    s.tlsCa !== undefined && s.tlsCert !== undefined && s.tlsKey !== undefined
      ? { ca: readFileSync(s.tlsCa), cert: readFileSync(s.tlsCert), key: readFileSync(s.tlsKey) }
      : undefined;
  const adminAddr = parseHostPort(s.admin);
  if (adminAddr === null) throw new Error('unreachable: admin validated');
  // A replica's admin URL and lease address: as listed (--admin-peers, --lease-peers), else its peer
  // host with this replica's port, unless replicas share that host (peer-addresses.ts).
  const adminGuess = guessPeerAddresses(s.peers, s.id, adminAddr.port);
  const adminUrlOf = (id: string): string | null => {
    const explicit = s.adminPeers?.get(id);
    if (explicit !== undefined) return explicit.replace(/\/$/, '');
    const derived = adminGuess.addressOf(id);
    return derived === null ? null : `http://${derived}`;
  };
  // The lease service on its own address: a follower names the leader's lease address to agents.
  const leaseListen = s.leaseListen;
  const leasePort = leaseListen === undefined ? null : (parseHostPort(leaseListen)?.port ?? null);
  const leaseGuess = guessPeerAddresses(s.peers, s.id, leasePort);
  const leaseAddressOf = (id: string): string | null => s.leasePeers?.get(id) ?? leaseGuess.addressOf(id);
  let tokens: TokenFile | undefined;
  if (s.leaseTokens !== undefined) {
    const path = resolve(s.leaseTokens);
    try {
      tokens = new TokenFile(path, (cells, error) => {
        if (error === null) logger.info({ path, cells }, 'lease tokens reloaded');
        else
          logger.error(
            { path, err: error.message, keeping: cells },
            'lease tokens file is invalid; keeping the previous tokens',
          );
      });
    } catch (err) {
      throw new ConfigError(
        `cellquota coordinator: --lease-tokens ${path}: ${err instanceof Error ? err.message : String(err)}`,
      );
    }
  }
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: 'cellquota_coordinator_process_' });
  const metrics = new CoordinatorMetrics(registry);
  // The leader's live traffic (reports → overshoot windows, fail-open rates): the live view and metrics.
  let nodeRef: CoordinatorNode | null = null;
  const traffic = new LiveTraffic(
    () => (nodeRef as CoordinatorNode).ledger(),
    () => nodeRef?.isLeader() ?? false,
  );
  const dataDir = resolve(s.dataDir);
  // Crash-stop. The node has logged the fatal line, refuses every request and fails readiness; a
  // process that can no longer persist must not linger (a zombie leader would keep clients
  // waiting, a zombie follower would look alive). Exit explicitly, non-zero, once the log is
  // flushed, without closing the storage (nothing more is written to a directory in an unknown
  // state); the supervisor (systemd, Kubernetes) restarts the process, which recovers from what
  // is durable or, if the directory is corrupt below the commit index, refuses to start.
  const crashStop = (f: CoordinatorFailure): void => {
    const code = f.kind === 'storage' ? exitStorageFailure : exitInternalFailure;
    process.exitCode = code;
    const exit = (): never => process.exit(code);
    setTimeout(exit, 2000);
    logger.flush(() => exit());
  };
  let node: CoordinatorNode;
  try {
    node = await CoordinatorNode.start(
      {
        id: s.id,
        clusterId: s.clusterId,
        peers: s.peers,
        dataDir,
        tickMs: s.tickMs,
        electionTicks: s.electionTicks,
        heartbeatTicks: s.heartbeatTicks,
        snapshotEveryEntries: s.snapshotEvery,
        snapshotTrailingEntries: Math.min(1000, Math.floor(s.snapshotEvery / 2)),
        requestTimeoutMs: 5000,
        floorCells: s.floorCells,
        skewMarginMs: DEFAULT_SKEW_MARGIN_MS,
        commandFormat: s.commandFormat,
        join: s.join,
        adminUrlOf,
        ...(s.adminToken === undefined ? {} : { adminToken: s.adminToken }),
        lease: {
          ttlMs: s.leaseTtlMs,
          roundMs: s.leaseRoundMs,
          onReport: (req, receiptMs) => traffic.onReport(req, receiptMs),
          maxCells: s.maxCells,
          maxDemandKeys: s.maxDemandKeys,
          maxImplicitTenants: s.maxImplicitTenants,
          implicitTenantIdleMs: s.implicitTenantIdleMs,
          onRefused: (reason) => metrics.leaseRefused.inc({ reason }),
          ...(leaseListen === undefined ? {} : { listen: leaseListen, addressOf: leaseAddressOf }),
          ...(tokens === undefined ? {} : { tokens }),
        },
        ...(tls === undefined ? {} : { tls }),
        onFatal: crashStop,
      },
      logger,
      metrics,
    );
  } catch (err) {
    // Cannot start (e.g. StorageCorruptionError: committed data is missing; or the disk is still
    // failing): one structured line naming the directory, then the error as before (exit 1).
    const code = (err as { code?: unknown }).code;
    logger.fatal(
      { err, dataDir, code: typeof code === 'string' ? code : null, errno: storageErrno(err) },
      `coordinator cannot start on ${dataDir}: ${err instanceof Error ? err.message : String(err)}`,
    );
    logger.flush();
    throw err;
  }
  nodeRef = node;
  traffic.registerMetrics(registry);
  traffic.start();
  metrics.sample(registry, {
    term: () => node.cluster().term,
    isLeader: () => node.isLeader(),
    commitIndex: () => node.cluster().commitIndex,
    appliedIndex: () => node.cluster().appliedIndex,
    reachablePeers: () => node.cluster().members.filter((m) => m.id !== s.id && m.reachable === true).length,
    votingRefused: () => node.cluster().votingRefused,
    tenants: () => node.ledger().tenantCount,
    demandKeysDropped: () => node.leaseStats()?.demandKeysDropped ?? 0,
    implicitTenantsRefused: () => node.leaseStats()?.implicitTenantsRefused ?? 0,
    implicitTenantsRetired: () => node.leaseStats()?.implicitTenantsRetired ?? 0,
    implicitTenantsRevived: () => node.leaseStats()?.implicitTenantsRevived ?? 0,
    implicitTenants: () => node.ledger().implicitTenantCount,
    slicesByCell: () =>
      node
        .ledger()
        .listCells()
        .map((c) => [c.id, node.ledger().cellSliceCount(c.id)] as const),
    releasedSlicesDropped: () => node.leaseStats()?.releasedSlicesDropped ?? 0,
    releasesParked: () => node.leaseStats()?.releasesParked ?? 0,
  });
  const app = await buildAdminServer({
    backend: node,
    logger,
    adminUrlOf,
    registry,
    ...(s.adminToken === undefined ? {} : { token: s.adminToken }),
    authReads: s.authReads,
    traffic,
  });
  await app.listen({ host: adminAddr.host, port: adminAddr.port });
  logger.info(
    { admin: `http://${s.admin}`, peer: s.peers.get(s.id), lease: s.leaseListen ?? s.peers.get(s.id) },
    'admin API listening',
  );
  const unknownAdmin = adminGuess.ambiguous.filter((id) => s.adminPeers?.get(id) === undefined);
  if (unknownAdmin.length > 0)
    logger.warn(
      { replicas: unknownAdmin },
      'these replicas share a host, so their admin URLs cannot be derived from --peers: a write sent to this ' +
        'replica while one of them leads is answered NO_LEADER instead of redirected; list them in --admin-peers',
    );
  const unknownLease =
    leasePort === null ? [] : leaseGuess.ambiguous.filter((id) => s.leasePeers?.get(id) === undefined);
  if (unknownLease.length > 0)
    logger.warn(
      { replicas: unknownLease },
      'these replicas share a host, so their lease addresses cannot be derived from --peers: an agent that reaches ' +
        'this replica while one of them leads is not told where the leader is; list them in --lease-peers',
    );
  return new Promise<number>((resolveExit) => {
    let stopping = false;
    const stop = (signal: string): void => {
      if (stopping) return;
      stopping = true;
      logger.info({ signal }, 'stopping');
      void (async () => {
        traffic.stop();
        await app.close();
        await node.stop();
        resolveExit(0);
      })();
    };
    process.once('SIGINT', () => stop('SIGINT'));
    process.once('SIGTERM', () => stop('SIGTERM'));
  });
}
