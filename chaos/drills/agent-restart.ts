// Drill 7: the agent of the busiest cell killed (-9) and started again under load. It comes back on
// its static share (no larger than its floor) with empty buckets, so it cannot over-admit while it
// has no lease; then it leases again. Its checks fail while it is down — Envoy applies its failure
// mode there — and are excused from the error count for that span and the new process's first 2 s;
// every cell's latency is left out until the new process holds a lease again and 2 s more.
import type { Drill } from '../drill-runner.js';

export const agentRestart: Drill = {
  name: 'agent-restart',
  title: "the busiest cell's agent killed and restarted under load",
  recoveryLimitMs: 8000,
  async run(ctx) {
    const cell = 'cell-a';
    const heal = ctx.fault(`kill -9 agent ${cell}, start it again`);
    const from = ctx.now();
    await ctx.d.signalAgent(cell, 'SIGKILL');
    ctx.d.startAgent(cell);
    await ctx.d.waitForAgent(cell, false, 30_000);
    // The load process reconnects within 100 ms of the socket's return; the new process then warms up
    // (its code is compiled and optimised under load) for a moment, excused like the load's own warm-up.
    ctx.excuseErrors(cell, from, ctx.now() + 2000);
    heal();
    await ctx.d.waitForAgent(cell, true, 30_000);
    ctx.note(`${cell} leased again`);
    // On this one machine the new process's start-up (module loading, TypeScript compiled by tsx, its
    // worker thread, its lease client's first exchanges, its code optimised under load) takes CPU from
    // the other cells' agents too; in a deployment each cell's agent has its cluster's machines to
    // itself. Its latency is left out until it holds a lease again and 2 s more, as the leader-kill
    // drill leaves out a restarted replica's until it follows again (CI: the 1 s after answering + 2 s
    // had p99 374 ms on a machine where the restart took 11 s, the agent leasing 0.5 s before it).
    ctx.excuseLatency(from, ctx.now() + 2000);
    await ctx.sleep(6000);
  },
};
