// Drill 8: a rolling restart of the three coordinators under load, as an upgrade would do it: each
// follower stopped (SIGTERM), started again and caught up; then leadership is transferred away from
// the leader before it restarts too. The agents' leases must never lapse.
import type { Drill } from '../drill-runner.js';

export const rollingRestart: Drill = {
  name: 'rolling-restart',
  title: 'rolling restart of all three coordinators, leadership transferred first',
  recoveryLimitMs: 5000,
  async run(ctx) {
    const leader = await ctx.leader();
    const order = [...[...ctx.d.coordinators.keys()].filter((id) => id !== leader), leader];
    const heal = ctx.fault(`rolling restart ${order.join(' → ')}`);
    for (const id of order) {
      const current = await ctx.leader();
      if (id === current) {
        const r = await fetch(`${ctx.d.adminUrl(id)}/v1/cluster/transfer-leadership`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: '{}',
          signal: AbortSignal.timeout(10_000),
        });
        const body = await r.text();
        ctx.note(`transfer leadership away from ${id}: ${r.status}`);
        if (r.status !== 200) throw new Error(`transfer-leadership on ${id}: ${r.status} ${body}`);
        const until = Date.now() + 10_000;
        while ((await ctx.d.leader(300)) === id && Date.now() < until) await ctx.sleep(100);
      }
      ctx.note(`restart ${id}`);
      await ctx.d.signalCoordinator(id, 'SIGTERM');
      ctx.d.startCoordinator(id);
      // Caught up: it names a leader and has applied what that leader had committed when asked.
      const lead = await ctx.leader(30_000);
      const target = (await ctx.d.clusterViews(1000)).get(lead) as { commitIndex?: number } | null | undefined;
      const until = Date.now() + 30_000;
      for (;;) {
        const v = (await ctx.d.clusterViews(500)).get(id) as
          { appliedIndex?: number; leader: string | null } | null | undefined;
        if (v !== null && v !== undefined && v.leader !== null && (v.appliedIndex ?? 0) >= (target?.commitIndex ?? 0))
          break;
        if (Date.now() > until) throw new Error(`${id} did not catch up within 30 s after its restart`);
        await ctx.sleep(200);
      }
      await ctx.sleep(1000);
    }
    heal();
    const leases = await Promise.all(
      [...ctx.d.agents.keys()].map(async (c) => ({
        c,
        m: await fetch(`${ctx.d.agentUrl(c)}/metrics`).then((r) => r.text()),
      })),
    );
    const expired = leases
      .filter(({ m }) => /cellquota_agent_lease_changes_total\{state="expired"\} [1-9]/.test(m))
      .map(({ c }) => c);
    ctx.check(
      'no lease lapsed during the rolling restart',
      expired.length === 0,
      expired.length === 0 ? 'no agent went fail-static' : `fail-static on ${expired.join(', ')}`,
    );
    await ctx.sleep(5000);
  },
};
