// Raft core throughput in memory: three nodes in one process, messages delivered at once, no
// disk. It measures the consensus code alone — what the core costs per committed entry — with one
// client (propose, wait for commit, repeat) and with many proposals in flight (batching).
import { Harness } from '../testkit/raft/raft-harness.js';
import type { BenchReport } from './bench-report.js';

function commitsPerSecond(inFlight: number, total: number): { commitsPerSec: number; entries: number } {
  const h = new Harness(['n1', 'n2', 'n3']);
  h.elect('n1');
  const payload = 'x'.repeat(128);
  const started = process.hrtime.bigint();
  let proposed = 0;
  while (proposed < total) {
    for (let i = 0; i < inFlight && proposed < total; i++) {
      const r = h.propose('n1', payload);
      if (!r.ok) throw new Error(`proposal refused: ${r.reason}`);
      proposed++;
    }
    h.stabilize();
  }
  h.tick('n1');
  h.stabilize();
  const secs = Number(process.hrtime.bigint() - started) / 1e9;
  const applied = h.node('n3').applied.length;
  if (applied !== total) throw new Error(`only ${applied} of ${total} entries applied on a follower`);
  return { commitsPerSec: Math.round(total / secs), entries: total };
}

export function runRaftCoreBench(opts: { smoke: boolean; progress: (msg: string) => void }): BenchReport {
  const total = opts.smoke ? 2_000 : 50_000;
  const rows: Record<string, number | string>[] = [];
  for (const inFlight of [1, 16, 256]) {
    opts.progress(`raft-core: ${total} commits with ${inFlight} in flight`);
    const r = commitsPerSecond(inFlight, total);
    rows.push({ inFlight, entries: r.entries, commitsPerSec: r.commitsPerSec });
  }
  return {
    name: 'raft-core',
    title: 'Raft core in memory (3 nodes, one process, no disk, 128-byte entries)',
    rows,
    notes: ["Goal from the team's Raft notes: ≥ 10,000 commits/s with one client in flight."],
  };
}
