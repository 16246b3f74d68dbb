// Child process for the crash test: runs the deterministic workload against real storage, printing
// "done <k>" after operation k has resolved, until it is killed. Usage: crash-child.ts DIR LAYOUT
import { layouts } from './storage-helpers.js';
import { applyOp, crashBootstrap, newWorkloadModel, nextOp } from './crash-workload.js';

const dir = process.argv[2];
const layout = layouts.find((l) => l.name === process.argv[3]);
if (dir === undefined || layout === undefined) throw new Error('usage: crash-child.ts DIR LAYOUT');
const storage = await layout.open(dir, {
  nodeId: 'n1',
  clusterId: 'crash',
  bootstrap: crashBootstrap,
  logger: { warn: () => undefined },
});
await storage.load();
const model = newWorkloadModel();
for (let k = 1; ; k++) {
  const op = nextOp(model, k);
  if (op.kind === 'save') await storage.save(op.rd);
  else await storage.compact(op.snapshot, op.keepFrom);
  applyOp(model, op);
  process.stdout.write(`done ${k}\n`);
}
