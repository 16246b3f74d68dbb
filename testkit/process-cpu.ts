// CPU time of other processes, from Linux's /proc: what a benchmark reports beside a throughput so
// that a figure taken on a shared machine can be read as CPU per request of each process.
import { spawnSync } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';

let clockTicks: number | undefined;
/** The kernel's clock ticks per second (`getconf CLK_TCK`, 100 on every Linux we meet). */
export function ticksPerSecond(): number {
  if (clockTicks === undefined) {
    const out = spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' });
    const n = Number(out.stdout?.trim());
    clockTicks = Number.isFinite(n) && n > 0 ? n : 100;
  }
  return clockTicks;
}

/** The fields of /proc/PID/stat after "pid (comm) ", or null when the process is gone. */
function statFields(pid: number): string[] | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'latin1');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  } catch {
    return null;
  }
}

/**
 * User + system CPU seconds of `pid` (all its threads), or null when it is gone. With `waited`, the
 * CPU of its children that it has waited for is added (cutime + cstime: a shell after its command).
 */
export function cpuSeconds(pid: number | undefined, opts: { waited?: boolean } = {}): number | null {
  if (pid === undefined) return null;
  const f = statFields(pid);
  if (f === null) return null;
  // After "pid (comm) " the state is field 3 of stat(5): utime (14), stime (15), cutime (16) and
  // cstime (17) are at indexes 11 to 14 here.
  let ticks = Number(f[11]) + Number(f[12]);
  if (opts.waited === true) ticks += Number(f[13]) + Number(f[14]);
  return Number.isFinite(ticks) ? ticks / ticksPerSecond() : null;
}

/** CPU seconds of `pid` and every live descendant (nginx's master and its workers), or null if gone. */
export function treeCpuSeconds(pid: number | undefined): number | null {
  const own = cpuSeconds(pid);
  if (pid === undefined || own === null) return null;
  const children = new Map<number, number[]>();
  for (const name of readdirSync('/proc')) {
    const child = Number(name);
    if (!Number.isInteger(child)) continue;
    const f = statFields(child);
    const parent = f === null ? NaN : Number(f[1]);
    if (!Number.isInteger(parent)) continue;
    const list = children.get(parent);
    if (list === undefined) children.set(parent, [child]);
    else list.push(child);
  }
  let total = own;
  const stack = [...(children.get(pid) ?? [])];
  while (stack.length > 0) {
    const p = stack.pop() as number;
    total += cpuSeconds(p) ?? 0;
    stack.push(...(children.get(p) ?? []));
  }
  return total;
}
