// Planted bugs: each flag re-creates one breach of the global bound found so far, so the quota
// simulation (test/sim/quota-sim.ts, `npm run sim:quota -- --bug NAME`) can show it would catch it.
// All are off. Nothing in the agent, the coordinator or their configuration can turn one on: no
// flag, setting, file or environment variable reaches this module; only the simulation calls
// plantBug(). Each check in production code is one property read of this object.
export const PLANTED_BUGS = [
  /** A global quota's bucket named by the domain and rule path that reached it (two buckets per tenant). */
  'rule-path-buckets',
  /** A cell with coordinators runs a tenant it holds no grant for on a static share the ledger does not count. */
  'uncounted-static-share',
  /** A bucket for a grant that moved in starts full (a burst the cell did not refill itself). */
  'full-start-moved-grant',
  /** The deciders do not read the lease deadline: a grant holds until the main thread posts the floors. */
  'deadline-off-hot-path',
  /**
   * A new lease leader stamps its own wall clock at once (no read barrier, no grace): an offset releases leases
   * early.
   */
  'release-by-wall-clock',
  /** The lease leader counts every grant it sent as acknowledged (a shrink frees capacity before it is applied). */
  'forged-ack',
  /**
   * A lease's floor takes over when a bucket next meets it, not at the lease's end: the time since refills at the
   * grant's rate.
   */
  'floor-as-of-now',
  /** The lease leader drops (dropReleasedSlices) the slice of every grant an agent acknowledged, as if released. */
  'forged-release',
] as const;

export type PlantedBug = (typeof PLANTED_BUGS)[number];

export const planted: Record<PlantedBug, boolean> = {
  'rule-path-buckets': false,
  'uncounted-static-share': false,
  'full-start-moved-grant': false,
  'deadline-off-hot-path': false,
  'release-by-wall-clock': false,
  'forged-ack': false,
  'floor-as-of-now': false,
  'forged-release': false,
};

/** The simulation only: plant `bug` (null: none), removing any other. */
export function plantBug(bug: PlantedBug | null): void {
  for (const name of PLANTED_BUGS) planted[name] = name === bug;
}
