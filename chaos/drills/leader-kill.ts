// Drill 1: kill -9 of the coordinator leader under load. The agents keep deciding from memory; a new
// leader is elected and carries on from the replicated ledger; the killed replica comes back and
// catches up.
import type { Drill } from '../drill-runner.js';

export const leaderKill: Drill = {
  name: 'leader-kill',
  title: 'kill -9 of the coordinator leader under load',
  recoveryLimitMs: 5000,
  async run(ctx) {
    const leader = await ctx.leader();
    const heal = ctx.fault(`kill -9 leader ${leader}`);
    await ctx.d.signalCoordinator(leader, 'SIGKILL');
    const killedAt = ctx.now();
    const next = await ctx.leader(10_000);
    ctx.check('new leader', next !== leader, `${next} leads ${((ctx.now() - killedAt) / 1000).toFixed(2)} s after the kill`);
    heal();
    await ctx.sleep(4000);
    ctx.note(`restart ${leader}`);
    ctx.d.startCoordinator(leader);
    await ctx.sleep(6000);
  },
};
