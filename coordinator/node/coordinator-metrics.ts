// Prometheus metrics of one coordinator replica (prom-client), named by Prometheus conventions:
// gauges sampled from the node at scrape time, and histograms/counters fed by the node's hooks.
import { Counter, Gauge, Histogram, type Registry } from 'prom-client';

export interface CoordinatorMetricsSource {
  term(): number;
  isLeader(): boolean;
  commitIndex(): number;
  appliedIndex(): number;
  reachablePeers(): number;
  votingRefused(): boolean;
  tenants(): number;
  /** Demand entries the lease service did not keep (--max-demand-keys), since this process started. */
  readonly demandKeysDropped?: () => number;
  /** Demand entries of new implicit tenants refused (--max-implicit-tenants), since this process started. */
  readonly implicitTenantsRefused?: () => number;
  /** Tenant keys the ledger holds slices of with no tenant record (what --max-implicit-tenants bounds). */
  readonly implicitTenants?: () => number;
  /** Idle implicit tenants this replica, as leader, proposed to wind down, since this process started. */
  readonly implicitTenantsRetired?: () => number;
  /** Winding-down tenant keys this replica, as leader, took back on demand, since this process started. */
  readonly implicitTenantsRevived?: () => number;
  /** Per registered cell (at most MAX_CELLS), the slices the ledger holds for it. */
  readonly slicesByCell?: () => Iterable<readonly [string, number]>;
  /** Slices this replica, as leader, dropped because their cell's agent released them, since this process started. */
  readonly releasedSlicesDropped?: () => number;
  /** Releases this replica, as leader, took in a session's first TTL + margin, for the agent to send again later. */
  readonly releasesParked?: () => number;
}

export class CoordinatorMetrics {
  readonly proposals: Counter<'result'>;
  readonly proposalSeconds: Histogram;
  readonly fsyncSeconds: Histogram;
  readonly leaderChanges: Counter;
  readonly snapshotsInstalled: Counter;
  readonly leaseRefused: Counter<'reason'>;

  constructor(registry: Registry) {
    this.proposals = new Counter({
      name: 'cellquota_raft_proposals_total',
      help: 'Proposals by outcome (ok, error: refused, not leader, timeout, dropped)',
      labelNames: ['result'],
      registers: [registry],
    });
    this.proposalSeconds = new Histogram({
      name: 'cellquota_raft_proposal_duration_seconds',
      help: 'Time from proposal to applied on the leader',
      buckets: [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
      registers: [registry],
    });
    this.fsyncSeconds = new Histogram({
      name: 'cellquota_storage_fsync_duration_seconds',
      help: 'Duration of each synced LevelDB batch (write + fsync)',
      buckets: [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1],
      registers: [registry],
    });
    this.leaderChanges = new Counter({
      name: 'cellquota_raft_leader_changes_total',
      help: 'Times this replica saw the leader change',
      registers: [registry],
    });
    this.leaseRefused = new Counter({
      name: 'cellquota_lease_reports_refused_total',
      help:
        'Lease reports refused before any round, by reason: unauthenticated (no identity), permission_denied (an ' +
        "identity, not the cell's), cell_removed, too_many_cells",
      labelNames: ['reason'],
      registers: [registry],
    });
    for (const reason of ['unauthenticated', 'permission_denied', 'cell_removed', 'too_many_cells'])
      this.leaseRefused.inc({ reason }, 0);
    this.snapshotsInstalled = new Counter({
      name: 'cellquota_raft_snapshots_installed_total',
      help: 'Snapshots received from the leader and installed',
      registers: [registry],
    });
  }

  /** Gauges read from the node at every scrape. */
  sample(registry: Registry, src: CoordinatorMetricsSource): void {
    const gauge = (name: string, help: string, fn: () => number): void => {
      new Gauge({
        name,
        help,
        registers: [registry],
        collect() {
          this.set(fn());
        },
      });
    };
    gauge('cellquota_raft_term', 'Current Raft term of this replica', () => src.term());
    gauge('cellquota_raft_is_leader', '1 if this replica is the Raft leader', () => (src.isLeader() ? 1 : 0));
    gauge('cellquota_raft_commit_index', 'Highest log index known committed', () => src.commitIndex());
    gauge('cellquota_raft_applied_index', 'Highest log index applied to the ledger', () => src.appliedIndex());
    gauge('cellquota_raft_reachable_peers', 'Peers with an open outbound stream', () => src.reachablePeers());
    gauge(
      'cellquota_raft_voting_refused',
      '1 if this replica refuses to vote (its data directory is unconfirmed or was found wiped, or its log ' +
        'lost entries it may have acknowledged and it has not caught up yet)',
      () => (src.votingRefused() ? 1 : 0),
    );
    gauge('cellquota_ledger_tenants', 'Tenants in the ledger', () => src.tenants());
    const implicit = src.implicitTenants;
    if (implicit !== undefined)
      gauge(
        'cellquota_ledger_implicit_tenants',
        'Implicit tenants (unknown-tenant policy tier:NAME) the ledger holds slices of, winding-down ones included',
        () => implicit(),
      );
    const slicesByCell = src.slicesByCell;
    if (slicesByCell !== undefined)
      new Gauge({
        name: 'cellquota_ledger_slices',
        help:
          'Slices the ledger holds per registered cell (label cell: at most MAX_CELLS values): with --max-lease-keys ' +
          'agents, about the keys the cell holds, as released slices are dropped (command format 7)',
        labelNames: ['cell'],
        registers: [registry],
        collect() {
          this.reset();
          for (const [cell, n] of slicesByCell()) this.set({ cell }, n);
        },
      });
    /** A counter that mirrors a running total of the node's (reset and set at each scrape). */
    const total = (name: string, help: string, fn: (() => number) | undefined): void => {
      if (fn === undefined) return;
      new Counter({
        name,
        help,
        registers: [registry],
        collect() {
          this.reset();
          this.inc(fn());
        },
      });
    };
    total(
      'cellquota_lease_implicit_tenants_refused_total',
      'Reported demand of new unknown tenants the leader did not take because --max-implicit-tenants implicit ' +
        'tenants were held (refused as under the unknown-tenant policy deny)',
      src.implicitTenantsRefused,
    );
    total(
      'cellquota_lease_implicit_tenants_retired_total',
      'Idle implicit tenants (no demand within --implicit-tenant-idle-ms) the leader proposed to wind down',
      src.implicitTenantsRetired,
    );
    total(
      'cellquota_lease_implicit_tenants_revived_total',
      'Winding-down tenant keys the leader took back as implicit tenants because cells asked for them again',
      src.implicitTenantsRevived,
    );
    total(
      'cellquota_lease_released_slices_dropped_total',
      "Slices the leader dropped from the ledger because their cell's agent released them (--max-lease-keys)",
      src.releasedSlicesDropped,
    );
    total(
      'cellquota_lease_releases_parked_total',
      "Releases the leader took in an agent session's first lease TTL + skew margin, when it drops no slice yet: " +
        'the agent sends them again after that (releases_parked), and they are dropped then',
      src.releasesParked,
    );
    total(
      'cellquota_lease_demand_keys_dropped_total',
      'Reported demand keys the leader did not keep because the cell had --max-demand-keys keys already ' +
        '(those keys get no grant until others go quiet)',
      src.demandKeysDropped,
    );
  }
}
