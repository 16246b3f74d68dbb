// A stand-in for a staging deployment, in a process of its own (test/chaos/remote.test.ts): three
// coordinators and three agents started by chaos/local-deployment.ts, and a target file describing
// them by address. Prints one JSON line {target, leaderPid} when ready; stops everything on SIGTERM.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { LocalDeployment } from '../../chaos/local-deployment.js';

const dir = process.argv[2];
if (dir === undefined) {
  console.error('usage: staging-deployment.ts DIR');
  process.exit(2);
}
const cells = ['cell-a', 'cell-b', 'cell-c'];
const offered = [450, 270, 180];
const d = await LocalDeployment.create({
  dir: join(dir, 'staging'),
  coordinators: ['n1', 'n2', 'n3'],
  cells,
  quota: 600,
  burst: 120,
  floorFraction: 0.3,
  offered,
});
let stopping = false;
const stop = async (code: number): Promise<never> => {
  if (!stopping) {
    stopping = true;
    // A replica the drill left paused must be resumed to be stopped.
    for (const c of d.coordinators.values()) c.proc?.kill('SIGCONT');
    await d.stop();
  }
  process.exit(code);
};
process.on('SIGTERM', () => void stop(0));
try {
  await d.start(() => undefined);
  const leader = await d.waitForLeader(30_000);
  const target = join(dir, 'target.yaml');
  writeFileSync(
    target,
    [
      'tenant: acme',
      'domain: api',
      'quota: 600',
      'burst: 120',
      'adminTier: gold',
      'cells:',
      ...cells.map(
        (c, i) => `  - {id: ${c}, rls: ${d.agent(c).socket}, http: ${d.agentUrl(c)}, rate: ${offered[i] ?? 0}}`,
      ),
      'coordinators:',
      ...['n1', 'n2', 'n3'].map((id) => `  - {id: ${id}, admin: ${d.adminUrl(id)}}`),
    ].join('\n'),
  );
  console.log(JSON.stringify({ target, leaderPid: d.coordinator(leader).proc?.pid ?? null }));
} catch (e) {
  console.error(e);
  await stop(1);
}
