// What a drill records: one sample per interval of what the cells admitted and refused, the slices
// the agents had in force, the coordinator leader and the decision latency, plus the faults and
// heals as marked events. Written as JSON next to its chart (chaos/timeline-chart.ts).

/** One sampling interval (normally 250 ms); rates are per second over the interval. */
export interface TimelineSample {
  /** ms since the drill started (end of the interval). */
  readonly t: number;
  /** Admitted checks per second, per cell id. */
  readonly admitted: Readonly<Record<string, number>>;
  /** Refused (OVER_LIMIT) checks per second, per cell id. */
  readonly refused: Readonly<Record<string, number>>;
  /** Failed checks (transport error, gRPC error, timeout) per second, per cell id. */
  readonly errors: Readonly<Record<string, number>>;
  /** Answers marked `x-ratelimit-degraded` (fail-open) per second, per cell id. */
  readonly degraded: Readonly<Record<string, number>>;
  /** Admitted per second over every cell. */
  readonly global: number;
  /** Decision latency p99 over every answer in the interval, ms (null: no answers). */
  readonly p99Ms: number | null;
  /** The slice (req/s) each cell's agent has in force for the drill's tenant (null: unknown). */
  readonly slices: Readonly<Record<string, number | null>>;
  /** Each cell's lease state as the agent reports it: 1 leased, 0 on floors (null: unknown). */
  readonly leased: Readonly<Record<string, number | null>>;
  /** The coordinator that a majority of the reachable ones name as leader (null: none known). */
  readonly leader: string | null;
}

/** A fault injected, a fault healed, or a note; `end` makes it an interval. */
export interface TimelineEvent {
  readonly t: number;
  readonly end?: number;
  readonly kind: 'fault' | 'heal' | 'note';
  readonly label: string;
}

export interface Timeline {
  readonly drill: string;
  readonly title: string;
  /** The tenant's global quota (req/s). */
  readonly quota: number;
  /** The documented bound: admitted in any 1 s window ≤ quota + bound. */
  readonly bound: number;
  readonly cells: readonly string[];
  readonly coordinators: readonly string[];
  /** ISO time the drill started. */
  readonly startedAt: string;
  readonly samples: readonly TimelineSample[];
  readonly events: readonly TimelineEvent[];
}
