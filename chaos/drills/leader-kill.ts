// Drill 1: kill -9 of the coordinator leader under load. The agents keep deciding from memory; a new
// leader is elected and carries on from the replicated ledger; the killed replica comes back and
// catches up. Timed: the kill → a new leader, and the kill → each cell's first lease answer from it
// (the next grant), which must come before the cell's lease runs out when the cell still held
// enough of it at the kill to outlast an election (a lease already failing to renew before the kill,
// on a loaded machine, is reported, not judged).
import type { Drill, DrillContext } from '../drill-runner.js';

/** How often the drill asks the agents for their lease status while it waits for the next grant. */
const LEASE_POLL_MS = 25;
/** A cell holding at least this much lease at the kill must get its next grant before it runs out:
 * an election (~1 s here) and a round over the coordinators fit in it. */
const LEASE_ENOUGH_AT_KILL_MS = 2000;
/** The killed replica is restarted this long after the new leader is known. */
const RESTART_AFTER_MS = 4000;

export const leaderKill: Drill = {
  name: 'leader-kill',
  title: 'kill -9 of the coordinator leader under load',
  recoveryLimitMs: 5000,
  async run(ctx) {
    const leader = await ctx.leader();
    const atKill = await Promise.all(ctx.d.spec.cells.map((c) => ctx.d.agentLease(c, 200)));
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
    const leftAtKill = new Map(ctx.d.spec.cells.map((c, i) => [c, atKill[i]?.leaseRemainingMs ?? 0]));
    await checkNextGrant(ctx, next, killedAt, leftAtKill, leaderKill.recoveryLimitMs);
    await ctx.sleep(Math.max(0, RESTART_AFTER_MS - (ctx.now() - healedAt)));
    ctx.note(`restart ${leader}`);
    const restartedAt = ctx.now();
    ctx.d.startCoordinator(leader);
    // On this one machine the restarted replica's start-up (module loading, TypeScript compiled by tsx,
    // its log replayed, catching up) takes CPU from the agents too, as a restarted agent's does in the
    // agent-restart drill; in a deployment a coordinator has its own machine. Its latency is left out
    // until the replica answers as a follower, and 2 s more while it catches up.
    let back = false;
    while (!back && ctx.now() - restartedAt < 15_000) {
      const v = (await ctx.d.clusterViews(500)).get(leader);
      back = v !== null && v !== undefined && v.role === 'follower' && v.leader !== null;
      if (!back) await ctx.sleep(100);
    }
    ctx.note(back ? `${leader} follows again` : `${leader} not following 15 s after its restart`);
    ctx.excuseLatency(restartedAt, ctx.now() + 2000);
    await ctx.sleep(Math.max(0, 6000 - (ctx.now() - restartedAt)));
  },
};

/** Waits until every cell has had a lease answer from `next`, and checks that each came within
 * `limitMs` of the kill, and before the lease ran out for each cell that held enough of it at the kill
 * (`leftAtKill`: ms of lease each cell had just before the kill). */
async function checkNextGrant(
  ctx: DrillContext,
  next: string,
  killedAt: number,
  leftAtKill: ReadonlyMap<string, number>,
  limitMs: number,
): Promise<void> {
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
  const seconds = (ms: number): string => `${(ms / 1000).toFixed(2)} s`;
  const parts = cells.map((c) => {
    const at = grantAt.get(c);
    const when = at === undefined ? `none within ${seconds(limitMs)}` : seconds(at - killedAt);
    const left = leftAtKill.get(c) ?? 0;
    return `${c} ${when}${lapsed.has(c) ? ` (its lease ran out first; it had ${seconds(left)} left at the kill)` : ''}`;
  });
  const judged = [...lapsed].filter((c) => (leftAtKill.get(c) ?? 0) >= LEASE_ENOUGH_AT_KILL_MS);
  const ok = grantAt.size === cells.length && judged.length === 0;
  ctx.check('next grant', ok, `first lease answer from ${next} after the kill: ${parts.join(', ')}`);
}
