// The embedded limiter's check() cost as `npm run bench -- embedded` has always measured it, shared
// with `npm run bench -- decision` (one function: the two benchmarks report the same measurement):
// CPU time (process.cpuUsage: user + system of the whole process, so scavenges count) of batches of
// 10,000 back-to-back checks, the median batch's mean per call, over `addresses` client addresses
// (each its own prebuilt descriptor list, taken in turn). With few addresses every bucket, descriptor
// and string stays in the CPU's caches; with many they do not (see bench/README.md, "decision").
import type { Limiter } from '../embedded/limiter.js';

export const CHECK_COST_BATCH = 10_000;

/** Rules with a shared limiter (`limiter: all`) and a per-address one, limits far above any load. */
export const CHECK_COST_RULES = {
  domain: 'd',
  descriptors: [
    { key: 'limiter', value: 'all', rate_limit: { unit: 'second' as const, requests_per_unit: 4_000_000_000 } },
    { key: 'remote_address', rate_limit: { unit: 'second' as const, requests_per_unit: 4_000_000_000 } },
  ],
};

/** Median over batches of the mean CPU ns per check(); levels 2 adds the shared limiter's descriptor. */
export function checkCostNs(limiter: Limiter, opts: { levels: 1 | 2; addresses: number; iterations: number }): number {
  const ips = Array.from({ length: opts.addresses }, (_, i) => `198.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`);
  const descs = ips.map((ip) =>
    opts.levels === 1
      ? [[{ key: 'remote_address', value: ip }]]
      : [[{ key: 'limiter', value: 'all' }], [{ key: 'remote_address', value: ip }]],
  );
  const n = descs.length;
  const batches: number[] = [];
  let refused = 0;
  for (let b = 0; b < Math.max(1, opts.iterations / CHECK_COST_BATCH); b++) {
    const c0 = process.cpuUsage();
    for (let i = 0; i < CHECK_COST_BATCH; i++) {
      if (!limiter.check({ descriptors: descs[(b * CHECK_COST_BATCH + i) % n] as never }).allowed) refused++;
    }
    const c1 = process.cpuUsage(c0);
    batches.push(((c1.user + c1.system) * 1000) / CHECK_COST_BATCH);
  }
  if (refused > 0) throw new Error(`check cost: ${refused} checks refused (limits are meant to be far above the load)`);
  batches.sort((a, b) => a - b);
  return batches[Math.floor(batches.length / 2)] ?? NaN;
}
