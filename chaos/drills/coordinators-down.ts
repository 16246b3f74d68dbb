// Drill 5: every coordinator down (kill -9) for 30 s, then started again on their data. The agents
// keep answering from memory, drop to their floors when their leases run out, and lease again once a
// leader is back; no acknowledged admin write is lost across the restart.
import type { Drill } from '../drill-runner.js';

export const coordinatorsDown: Drill = {
  name: 'coordinators-down',
  title: 'all three coordinators down (kill -9) for 30 s',
  // Three processes start from the source under tsx, elect, and serve the agents' next report.
  recoveryLimitMs: 12_000,
  async run(ctx) {
    const ids = [...ctx.d.coordinators.keys()];
    const heal = ctx.fault('kill -9 every coordinator');
    await Promise.all(ids.map((id) => ctx.d.signalCoordinator(id, 'SIGKILL')));
    const downAt = ctx.now();
    await ctx.sleep(6000);
    const floors = await Promise.all([...ctx.d.agents.keys()].map((c) => ctx.d.agentQuota(c, 500)));
    ctx.check(
      'every cell on its floor',
      floors.every((q) => q?.source === 'floor'),
      `6 s into the outage: ${floors.map((q) => q?.source ?? 'no answer').join(', ')}`,
    );
    await ctx.sleep(Math.max(0, 30_000 - (ctx.now() - downAt)));
    for (const id of ids) ctx.d.startCoordinator(id);
    heal();
    const leader = await ctx.leader(30_000);
    ctx.note(`leader ${leader} after the restart`);
    await ctx.sleep(8000);
  },
};
