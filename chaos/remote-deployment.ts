// A deployment reached by address (staging): its cells' RLS servers and HTTP APIs and its
// coordinators' admin APIs, described in a target file. Nothing is started or stopped here: the
// operator injects the fault with their own tools (a pod deletion, a NetworkPolicy, a paused
// container) through the `--fault` / `--heal` commands, and the drill runner loads the cells, writes
// through the admin API, samples the slices and the leader, and judges the same invariants as locally.
//
// Target file (YAML or JSON):
//   tenant: chaos-acme            # a tenant the cells know, with a global quota
//   domain: api
//   quota: 600                    # its rate and burst (the bound is quota·1 s + burst)
//   burst: 120
//   adminTier: gold               # optional: operators' writes to tenants chaos-lin-0..5 on this tier
//   adminToken: ...               # optional: bearer token for admin writes
//   cells:
//     - {id: eu-west, rls: 10.0.0.5:8089, http: http://10.0.0.5:9091, rate: 300}
//   coordinators:
//     - {id: n1, admin: http://10.0.1.1:8081}
import { readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import { z } from 'zod';
import { agentLeaseStatus, type AgentLeaseStatus } from './agent-lease-probe.js';
import type { DrillSpec, DrillTarget } from './drill-target.js';
import { sleep } from '../testkit/wait.js';

const name = z.string().regex(/^[a-zA-Z0-9._:-]{1,128}$/, 'letters, digits and . _ : - (at most 128)');
const url = z
  .string()
  .url()
  .refine((u) => u.startsWith('http://') || u.startsWith('https://'), 'an http(s) URL');

export const targetFileSchema = z.strictObject({
  tenant: name,
  domain: name,
  quota: z.number().gt(0),
  burst: z.number().min(0),
  adminTier: name.optional(),
  adminToken: z.string().min(8).optional(),
  cells: z
    .array(
      z.strictObject({
        id: name,
        rls: z.string().min(1).describe('host:port, or a Unix socket path'),
        http: url,
        rate: z.number().gt(0).max(100_000).describe('checks per second offered to this cell'),
      }),
    )
    .min(1)
    .max(64),
  coordinators: z
    .array(z.strictObject({ id: name, admin: url }))
    .min(1)
    .max(9),
});
export type TargetFile = z.output<typeof targetFileSchema>;

/** Reads and validates a target file; the error names the field. */
export function loadTargetFile(path: string): TargetFile {
  const raw: unknown = parseYaml(readFileSync(path, 'utf8'));
  const r = targetFileSchema.safeParse(raw);
  if (!r.success)
    throw new Error(`${path}: ${r.error.issues.map((i) => `${i.path.join('.') || '(top)'}: ${i.message}`).join('; ')}`);
  return r.data;
}

export class RemoteDeployment implements DrillTarget {
  constructor(readonly target: TargetFile) {}

  get spec(): DrillSpec {
    const t = this.target;
    return {
      cells: t.cells.map((c) => c.id),
      coordinators: t.coordinators.map((c) => c.id),
      tenant: t.tenant,
      domain: t.domain,
      quota: t.quota,
      burst: t.burst,
      offered: t.cells.map((c) => c.rate),
      adminTier: t.adminTier ?? null,
      adminToken: t.adminToken ?? null,
    };
  }

  /** Checks that every cell and coordinator answers before any load is sent. */
  async start(progress: (msg: string) => void): Promise<void> {
    for (const c of this.target.cells) {
      const r = await fetch(`${c.http}/healthz`, { signal: AbortSignal.timeout(5000) }).catch((e: unknown) => {
        throw new Error(`cell ${c.id}: ${c.http}/healthz unreachable: ${String(e)}`);
      });
      if (!r.ok) throw new Error(`cell ${c.id}: ${c.http}/healthz answered ${r.status}`);
    }
    const leader = await this.waitForLeader(20_000);
    progress(
      `target: ${this.target.cells.length} cells, ${this.target.coordinators.length} coordinators, leader ${leader}; tenant ${this.target.tenant} (${this.target.quota}/s, burst ${this.target.burst})`,
    );
  }

  async stop(): Promise<void> {
    // Nothing of the deployment belongs to the drill.
  }

  rlsTargets(): string[] {
    return this.target.cells.map((c) => c.rls);
  }

  adminUrls(): string[] {
    return this.target.coordinators.map((c) => c.admin);
  }

  async agentLease(cell: string, timeoutMs: number): Promise<AgentLeaseStatus | null> {
    const c = this.target.cells.find((x) => x.id === cell);
    return c === undefined ? null : agentLeaseStatus(c.http, timeoutMs);
  }

  async agentQuota(cell: string, timeoutMs: number): Promise<{ source: string; rate: number; burst: number } | null> {
    const c = this.target.cells.find((x) => x.id === cell);
    if (c === undefined) return null;
    try {
      const r = await fetch(`${c.http}/v1/quotas/tenant/${this.target.tenant}`, {
        signal: AbortSignal.timeout(timeoutMs),
      });
      return r.ok ? ((await r.json()) as { source: string; rate: number; burst: number }) : null;
    } catch {
      return null;
    }
  }

  /** The leader named by the replica with the highest term among those that answer. */
  async leader(timeoutMs: number): Promise<string | null> {
    const views = await Promise.all(
      this.target.coordinators.map(async (c) => {
        try {
          const r = await fetch(`${c.admin}/v1/cluster?stale=true`, {
            signal: AbortSignal.timeout(timeoutMs),
            headers: this.target.adminToken === undefined ? {} : { authorization: `Bearer ${this.target.adminToken}` },
          });
          return r.ok ? ((await r.json()) as { leader: string | null; term: number }) : null;
        } catch {
          return null;
        }
      }),
    );
    let best: { leader: string | null; term: number } | null = null;
    for (const v of views)
      if (v !== null && (best === null || v.term > best.term || (v.term === best.term && best.leader === null)))
        best = v;
    return best?.leader ?? null;
  }

  async waitForLeader(timeoutMs: number): Promise<string> {
    const until = Date.now() + timeoutMs;
    for (;;) {
      const l = await this.leader(1000);
      if (l !== null) return l;
      if (Date.now() > until) throw new Error(`no coordinator names a leader within ${timeoutMs} ms`);
      await sleep(200);
    }
  }
}
