// The agent's lease with the coordinators, as metrics (registered on the agent's registry, metrics.ts):
//
//   cellquota_agent_lease_state                      0 none yet (static shares), 1 leased, 2 expired (floors)
//   cellquota_agent_on_floor                         1 while global quotas run on floors or static shares
//   cellquota_agent_lease_changes_total{state}       lease state changes
import { Counter, Gauge } from 'prom-client';
import type { Registry } from 'prom-client';

/** The gauge's value for each of the lease client's states (lease/lease-client.ts LeaseState). */
const LEASE_STATE_VALUE = Object.freeze({ none: 0, leased: 1, expired: 2 });
export type LeaseGaugeState = keyof typeof LEASE_STATE_VALUE;

export interface LeaseMetrics {
  /** The lease client's state changed. */
  stateChanged(state: LeaseGaugeState): void;
}

/** Registers the lease metrics, at "none yet" and on floor until the first state change. */
export function createLeaseMetrics(registry: Registry): LeaseMetrics {
  const state = new Gauge({
    name: 'cellquota_agent_lease_state',
    help: 'lease with the coordinator: 0 none yet (static shares), 1 leased, 2 expired (fail-static on floors)',
    registers: [registry],
  });
  const onFloor = new Gauge({
    name: 'cellquota_agent_on_floor',
    help: '1 while global quotas run on floors or static shares (no live lease), else 0',
    registers: [registry],
  });
  const changes = new Counter({
    name: 'cellquota_agent_lease_changes_total',
    help: 'lease state changes',
    labelNames: ['state'],
    registers: [registry],
  });
  state.set(LEASE_STATE_VALUE.none);
  onFloor.set(1);
  return {
    stateChanged: (next) => {
      state.set(LEASE_STATE_VALUE[next]);
      onFloor.set(next === 'leased' ? 0 : 1);
      changes.inc({ state: next });
    },
  };
}
