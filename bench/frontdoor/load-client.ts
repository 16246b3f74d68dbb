// The front-door benchmark's load client: wrk (C, one thread, keep-alive connections) when it is
// installed, autocannon in this process otherwise; the same client for every row of one run.
// wrk is preferred because the client shares the machine's two cores with the processes measured:
// autocannon costs several times wrk's CPU per request, and every microsecond the client spends is
// one the front doors do not get. The client's own CPU is measured too (wrk: its shell's cutime and
// cstime after it exits; autocannon: this process's CPU over the run).
import { spawn, spawnSync } from 'node:child_process';
import autocannon from 'autocannon';
import { cpuSeconds, ticksPerSecond } from '../../testkit/process-cpu.js';

export interface LoadResult {
  readonly requests: number;
  readonly reqPerSec: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly errors: number;
  readonly non2xx: number;
  /** CPU seconds the client itself used. */
  readonly clientCpuSeconds: number;
}

export interface LoadClient {
  readonly name: string;
  run(url: string, connections: number, seconds: number): Promise<LoadResult>;
}

export function haveWrk(): boolean {
  const r = spawnSync('wrk', ['--version'], { stdio: 'ignore' });
  return r.error === undefined;
}

/** A wrk duration like "1.23ms", "850.00us", "2.01s" in milliseconds. */
function wrkMs(text: string): number {
  const m = /^([\d.]+)(us|ms|s|m)$/.exec(text);
  if (m === null) throw new Error(`wrk: unreadable latency '${text}'`);
  const n = Number(m[1]);
  const scale: Record<string, number> = { us: 0.001, ms: 1, s: 1000, m: 60_000 };
  return n * (scale[m[2] as string] as number);
}

/** The figures of one `wrk --latency` report. */
export function parseWrk(out: string): Omit<LoadResult, 'clientCpuSeconds'> {
  const num = (re: RegExp): number | undefined => {
    const m = re.exec(out);
    return m === null ? undefined : Number(m[1]);
  };
  const requests = num(/^\s*(\d+) requests in /m);
  const rps = num(/^Requests\/sec:\s+([\d.]+)/m);
  const p50 = /^\s+50%\s+(\S+)/m.exec(out)?.[1];
  const p99 = /^\s+99%\s+(\S+)/m.exec(out)?.[1];
  if (requests === undefined || rps === undefined || p50 === undefined || p99 === undefined) {
    throw new Error(`wrk: unreadable report:\n${out}`);
  }
  const socket = /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/.exec(out);
  const errors = socket === null ? 0 : socket.slice(1).reduce((s, x) => s + Number(x), 0);
  return {
    requests,
    reqPerSec: rps,
    p50Ms: wrkMs(p50),
    p99Ms: wrkMs(p99),
    errors,
    non2xx: num(/Non-2xx or 3xx responses: (\d+)/) ?? 0,
  };
}

export const wrkClient: LoadClient = {
  name: 'wrk (1 thread)',
  run: (url, connections, seconds) =>
    new Promise((resolve, reject) => {
      // The shell waits for wrk and then prints its own /proc stat, whose cutime + cstime are wrk's CPU.
      const script = 'wrk "$@"; s=$?; cat /proc/$$/stat; exit $s';
      const args = ['-t1', `-c${connections}`, `-d${Math.max(1, Math.round(seconds))}s`, '--latency', url];
      const p = spawn('sh', ['-c', script, 'sh', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      p.stdout.on('data', (c: Buffer) => (out += c.toString()));
      p.stderr.on('data', (c: Buffer) => (out += c.toString()));
      p.once('error', reject);
      p.once('exit', (code) => {
        if (code !== 0) return reject(new Error(`wrk exited ${code}:\n${out}`));
        try {
          const stat = out.slice(out.lastIndexOf('\n', out.length - 2) + 1);
          const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
          const clientCpuSeconds = (Number(fields[13]) + Number(fields[14])) / ticksPerSecond();
          resolve({ ...parseWrk(out), clientCpuSeconds });
        } catch (error) {
          reject(error instanceof Error ? error : new Error(String(error)));
        }
      });
    }),
};

export const autocannonClient: LoadClient = {
  name: 'autocannon (in the benchmark process)',
  run: async (url, connections, seconds) => {
    const before = cpuSeconds(process.pid) ?? 0;
    const r = await autocannon({ url, connections, duration: seconds });
    return {
      requests: r.requests.total,
      reqPerSec: r.requests.average,
      p50Ms: r.latency.p50,
      p99Ms: r.latency.p99,
      errors: r.errors + r.timeouts,
      non2xx: r.non2xx,
      clientCpuSeconds: (cpuSeconds(process.pid) ?? 0) - before,
    };
  },
};
