// Drill 2: the leader paused (SIGSTOP) for 10 s, then resumed. Meanwhile operators' writes are sent
// to it directly and wait in its socket; the other two elect a leader and go on. Resumed, the old
// leader must step down (it hears the higher term), and nothing it took while isolated may commit:
// none of those writes is acknowledged by it, and none of their values is ever read.
import { ADMIN_KEYS } from '../admin-workload.js';
import type { Drill } from '../drill-runner.js';

const PAUSE_MS = 10_000;
const PINNED_CLIENT = 99;

export const leaderPause: Drill = {
  name: 'leader-pause',
  title: 'the leader paused 10 s (SIGSTOP), then resumed',
  recoveryLimitMs: 5000,
  async run(ctx) {
    const leader = await ctx.leader();
    const before = (await ctx.d.clusterViews()).get(leader);
    const heal = ctx.fault(`SIGSTOP leader ${leader} for ${PAUSE_MS / 1000} s`);
    await ctx.d.signalCoordinator(leader, 'SIGSTOP');
    const pausedAt = ctx.now();
    // Writes to the paused leader itself, not following redirects: a 200 could only come from it.
    const url = ctx.d.adminUrl(leader);
    const pinned = [0, 1, 2, 3, 4, 5].map(async (i) => {
      await ctx.sleep(i * 300);
      return ctx.admin.write(PINNED_CLIENT, ADMIN_KEYS[i % ADMIN_KEYS.length] as string, url, {
        timeoutMs: PAUSE_MS + 8000,
        followRedirects: false,
      });
    });
    const next = await ctx.leader(10_000);
    ctx.check('new leader while paused', next !== leader, `${next} leads while ${leader} is paused`);
    await ctx.sleep(Math.max(0, pausedAt + PAUSE_MS - ctx.now()));
    await ctx.d.signalCoordinator(leader, 'SIGCONT');
    const resumedAt = ctx.now();
    heal();
    // It steps down: its own view names another leader in a higher term.
    let steppedDown = '';
    const until = Date.now() + 5000;
    while (Date.now() < until) {
      const v = (await ctx.d.clusterViews(300)).get(leader);
      if (v !== null && v !== undefined && v.role !== 'leader' && v.term > (before?.term ?? 0)) {
        steppedDown = `${leader} is ${v.role} in term ${v.term} (was leader in ${before?.term ?? '?'}), ${((ctx.now() - resumedAt) / 1000).toFixed(2)} s after SIGCONT`;
        break;
      }
      await ctx.sleep(50);
    }
    ctx.check(
      'paused leader stepped down',
      steppedDown !== '',
      steppedDown || `${leader} still claims leadership 5 s after SIGCONT`,
    );
    const outcomes = await Promise.all(pinned);
    const acked = outcomes.filter((o) => o.outcome === 'ok');
    ctx.check(
      'nothing it took while isolated was acknowledged by it',
      acked.length === 0,
      `${outcomes.length} writes sent to ${leader} while paused: ${outcomes.map((o) => `${o.outcome}${o.status === null ? '' : ` ${o.status}`}`).join(', ')}`,
    );
    await ctx.sleep(5000);
    const seen = ctx.admin.valuesRead();
    // A final read of every register, so the check sees the settled state too.
    for (const key of ADMIN_KEYS) await ctx.admin.read(0, key, null);
    const visible = outcomes.filter((o) => ctx.admin.valuesRead().has(o.value) || seen.has(o.value));
    ctx.check(
      'nothing it took while isolated committed',
      visible.length === 0,
      visible.length === 0
        ? `none of the ${outcomes.length} values written to the paused leader was ever read`
        : `values read that only the paused leader took: ${visible.map((o) => o.value).join(', ')}`,
    );
  },
};
