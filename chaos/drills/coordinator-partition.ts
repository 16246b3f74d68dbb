// Drill 3: the leader partitioned from the other two coordinators (every peer link cut both ways;
// agents still reach it) for 15 s. It must lose leadership (CheckQuorum), the majority side elects
// a leader, agents follow it; healed, the old leader rejoins as a follower.
import type { Drill } from '../drill-runner.js';

export const coordinatorPartition: Drill = {
  name: 'coordinator-partition',
  title: 'the leader partitioned from the other two coordinators for 15 s',
  recoveryLimitMs: 5000,
  async run(ctx) {
    const leader = await ctx.leader();
    const links = ctx.d.peerLinks(leader);
    const heal = ctx.fault(`partition ${leader} from the other coordinators`);
    for (const p of [...links.inbound, ...links.outbound]) p.set({ cutUp: true, cutDown: true });
    const cutAt = ctx.now();
    let next = leader;
    while (ctx.now() - cutAt < 10_000) {
      const views = await ctx.d.clusterViews(300);
      const others = [...views.entries()].filter(([id, v]) => id !== leader && v !== null);
      const named = others.map(([, v]) => v?.leader ?? null);
      if (named.length > 0 && named.every((n) => n !== null && n !== leader && n === named[0])) {
        next = named[0] as string;
        break;
      }
      await ctx.sleep(100);
    }
    ctx.check(
      'majority elects a leader',
      next !== leader,
      next !== leader
        ? `${next} leads the majority ${((ctx.now() - cutAt) / 1000).toFixed(2)} s after the cut`
        : 'no leader on the majority side within 10 s',
    );
    let deposed = '';
    while (ctx.now() - cutAt < 10_000) {
      const v = (await ctx.d.clusterViews(300)).get(leader);
      if (v !== null && v !== undefined && v.role !== 'leader') {
        deposed = `${leader} is ${v.role} ${((ctx.now() - cutAt) / 1000).toFixed(2)} s after the cut`;
        break;
      }
      await ctx.sleep(100);
    }
    ctx.check(
      'isolated leader steps down',
      deposed !== '',
      deposed || `${leader} still calls itself leader 10 s after the cut`,
    );
    await ctx.sleep(Math.max(0, 15_000 - (ctx.now() - cutAt)));
    for (const p of [...links.inbound, ...links.outbound]) p.heal();
    heal();
    await ctx.sleep(8000);
    const v = (await ctx.d.clusterViews(500)).get(leader);
    ctx.check(
      'rejoined as a follower',
      v !== null && v !== undefined && v.leader !== null,
      `${leader} after the heal: ${JSON.stringify(v)}`,
    );
  },
};
