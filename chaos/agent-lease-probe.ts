// What an agent's /healthz says about its lease (cell-agent's LeaseClient.status()): which replica
// answered its last report and how many reports were answered. A drill reads it to time the first
// grant after a fault (e.g. kill -9 of the leader → the first answer from the new leader).
import { z } from 'zod';

const leaseStatus = z.object({
  state: z.string(),
  leader: z.string().nullable(),
  leaseRemainingMs: z.number(),
  reportsOk: z.number().int().nonnegative(),
});
const healthBody = z.object({ lease: leaseStatus.nullable().optional() });

export type AgentLeaseStatus = z.infer<typeof leaseStatus>;

/** The lease status from `${httpUrl}/healthz` (served with 200 or 503), or null when the agent does
 * not answer, answers something else, or runs without coordinators. */
export async function agentLeaseStatus(httpUrl: string, timeoutMs: number): Promise<AgentLeaseStatus | null> {
  try {
    const r = await fetch(`${httpUrl}/healthz`, { signal: AbortSignal.timeout(timeoutMs) });
    const parsed = healthBody.safeParse(await r.json());
    return parsed.success ? (parsed.data.lease ?? null) : null;
  } catch {
    return null;
  }
}
