// Drill 6: the central-store cascade, turned on cellquota: every call from the agents to the
// coordinators takes 4 s (answers delayed 4 s on every agent link) for 20 s. The agents' decisions
// must not wait on it: same latency, no errors; their lease calls time out, they drop to their
// floors, and lease again when the coordinators answer in time.
import type { Drill } from '../drill-runner.js';

export const slowCoordinator: Drill = {
  name: 'slow-coordinator',
  title: 'every coordinator call from the agents takes 4 s, for 20 s',
  recoveryLimitMs: 8000,
  async run(ctx) {
    const links = [...ctx.d.agentProxies.values()];
    const heal = ctx.fault('every agent → coordinator answer delayed 4 s');
    for (const p of links) p.set({ delayDownMs: 4000 });
    const at = ctx.now();
    await ctx.sleep(8000);
    const q = await Promise.all([...ctx.d.agents.keys()].map((c) => ctx.d.agentQuota(c, 500)));
    ctx.check(
      'cells on their floors while the coordinator is slow',
      q.every((x) => x?.source === 'floor'),
      `8 s in: ${q.map((x) => x?.source ?? 'no answer').join(', ')}`,
    );
    await ctx.sleep(Math.max(0, 20_000 - (ctx.now() - at)));
    for (const p of links) p.heal();
    heal();
    await ctx.sleep(8000);
  },
};
