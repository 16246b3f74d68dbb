// Drill 1: kill -9 of the coordinator leader under load. The agents keep deciding from memory; a new
// leader is elected and carries on from the replicated ledger; the killed replica comes back and
// catches up. Timed: the kill → a new leader, and the kill → each cell's first lease answer from it
// (the next grant), which must come before the cell's lease runs out.
import type { Drill, DrillContext } from '../drill-runner.js';

/** How often the drill asks the agents for their lease status while it waits for the next grant. */
const LEASE_POLL_MS = 25;
/** The killed replica is restarted this long after the new leader is known. */
const RESTART_AFTER_MS = 4000;

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
    ctx.check(
      'new leader',
      next !== leader,
      `${next} leads ${((ctx.now() - killedAt) / 1000).toFixed(2)} s after the kill`,
    );
    heal();
    const healedAt = ctx.now();
    await checkNextGrant(ctx, next, killedAt, leaderKill.recoveryLimitMs);
    await ctx.sleep(Math.max(0, RESTART_AFTER_MS - (ctx.now() - healedAt)));
    ctx.note(`restart ${leader}`);
    ctx.d.startCoordinator(leader);
    await ctx.sleep(6000);
  },
};

/** Waits until every cell has had a lease answer from `next`, and checks that each came within
 * `limitMs` of the kill without the cell's lease running out. */
async function checkNextGrant(ctx: DrillContext, next: string, killedAt: number, limitMs: number): Promise<void> {
  const cells = ctx.d.spec.cells;
  const grantAt = new Map<string, number>();
  const lapsed = new Set<string>();
  while (grantAt.size < cells.length && ctx.now() - killedAt < limitMs) {
    const statuses = await Promise.all(cells.map((c) => ctx.d.agentLease(c, 200)));
    const t = ctx.now();
    cells.forEach((c, i) => {
      const s = statuses[i];
      if (s === null || s === undefined || grantAt.has(c)) return;
      if (s.state !== 'leased') lapsed.add(c);
      if (s.leader === next && s.state === 'leased') grantAt.set(c, t);
    });
    if (grantAt.size < cells.length) await ctx.sleep(LEASE_POLL_MS);
  }
  const parts = cells.map((c) => {
    const at = grantAt.get(c);
    return `${c} ${at === undefined ? `none within ${(limitMs / 1000).toFixed(1)} s` : `${((at - killedAt) / 1000).toFixed(2)} s`}${lapsed.has(c) ? ' (its lease ran out first)' : ''}`;
  });
  const ok = grantAt.size === cells.length && lapsed.size === 0;
  ctx.check('next grant', ok, `first lease answer from ${next} after the kill: ${parts.join(', ')}`);
}
