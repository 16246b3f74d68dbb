// Drill 4: one cell (the busiest) cut off from every coordinator for 30 s (its links blackholed,
// both ways). Its lease runs out and it drops to its floor; the coordinator releases its grant only
// once that lease has surely expired and gives it to the others; healed, it leases again.
import type { Drill } from '../drill-runner.js';

export const cellCutoff: Drill = {
  name: 'cell-cutoff',
  title: 'cell-a cut off from every coordinator for 30 s',
  recoveryLimitMs: 5000,
  async run(ctx) {
    const cell = 'cell-a';
    const links = ctx.d.cellLinks(cell);
    const heal = ctx.fault(`blackhole ${cell} ↔ every coordinator`);
    for (const p of links) p.set({ cutUp: true, cutDown: true });
    const cutAt = ctx.now();
    let onFloor = '';
    while (ctx.now() - cutAt < 10_000) {
      const q = await ctx.d.agentQuota(cell, 300);
      if (q?.source === 'floor') {
        onFloor = `${cell} on its floor (${q.rate}/s) ${((ctx.now() - cutAt) / 1000).toFixed(1)} s after the cut`;
        break;
      }
      await ctx.sleep(100);
    }
    ctx.check(
      'cut-off cell drops to its floor',
      onFloor !== '',
      onFloor || `${cell} not on its floor 10 s after the cut`,
    );
    await ctx.sleep(Math.max(0, 30_000 - (ctx.now() - cutAt)));
    for (const p of links) p.heal();
    heal();
    await ctx.d.waitForAgent(cell, true, 15_000);
    ctx.note(`${cell} leased again`);
    await ctx.sleep(5000);
  },
};
