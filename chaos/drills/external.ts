// The drill against a deployment reached by address (`npm run chaos -- --target FILE --fault CMD`):
// the fault is the operator's command (a pod deletion, a NetworkPolicy applied, a container paused),
// run by the shell; after `faultSeconds` the heal command, if any; then the system has
// `recoverySeconds` to come back. Load, operators' writes, sampling and verdicts are the same as for
// the local drills.
import { spawn } from 'node:child_process';
import type { Drill, DrillContext } from '../drill-runner.js';
import type { RemoteDeployment } from '../remote-deployment.js';

export interface ExternalDrillOptions {
  readonly fault: string;
  readonly heal: string | null;
  readonly faultSeconds: number;
  readonly recoverySeconds: number;
  /** Stated time for normal allocation to return after the heal. */
  readonly recoveryLimitSeconds: number;
}

/** Runs `cmd` with sh -c; resolves with its exit code and the last lines of its output. */
async function shell(cmd: string): Promise<{ code: number | null; output: string }> {
  return new Promise((ok) => {
    const p = spawn('sh', ['-c', cmd], { stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    const keep = (b: Buffer): void => {
      output = (output + b.toString()).slice(-2000);
    };
    p.stdout.on('data', keep);
    p.stderr.on('data', keep);
    p.on('error', (e) => ok({ code: null, output: `${output}${e.message}` }));
    p.on('exit', (code) => ok({ code, output }));
  });
}

async function runCommand(ctx: DrillContext<RemoteDeployment>, what: string, cmd: string): Promise<void> {
  const r = await shell(cmd);
  const tail = r.output.trim().split('\n').slice(-3).join(' | ');
  ctx.check(`${what} command`, r.code === 0, `\`${cmd}\` exited ${r.code}${tail === '' ? '' : `: ${tail}`}`);
  if (r.code !== 0) throw new Error(`${what} command failed (exit ${r.code}): ${cmd}`);
}

export function externalDrill(o: ExternalDrillOptions): Drill<RemoteDeployment> {
  return {
    name: 'external',
    title: `by address: ${o.fault}${o.heal === null ? '' : `, healed by ${o.heal}`}`,
    recoveryLimitMs: o.recoveryLimitSeconds * 1000,
    async run(ctx) {
      const heal = ctx.fault(o.fault);
      await runCommand(ctx, 'fault', o.fault);
      await ctx.sleep(o.faultSeconds * 1000);
      if (o.heal !== null) await runCommand(ctx, 'heal', o.heal);
      heal();
      await ctx.sleep(o.recoverySeconds * 1000);
    },
  };
}
