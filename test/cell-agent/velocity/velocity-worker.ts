// Worker for the velocity concurrency test: records `ops` samples round-robin over `keys` at one
// fixed clock reading, reporting new slots to the parent as the agent's workers do.
import { parentPort, workerData } from 'node:worker_threads';
import { VelocityTable } from '../../../cell-agent/velocity/velocity-table.js';
import type { VelocityShared } from '../../../cell-agent/velocity/velocity-table.js';

const data = workerData as {
  shared: VelocityShared;
  keys: string[];
  ops: number;
  nowNs: bigint;
  go: SharedArrayBuffer;
};
const table = VelocityTable.attach(data.shared);
table.onNewKey = (slot, gen, key) => parentPort?.postMessage({ kind: 'vkey', slot, gen, key });
parentPort?.postMessage({ kind: 'ready' });
Atomics.wait(new Int32Array(data.go), 0, 0);
let dropped = 0;
for (let i = 0; i < data.ops; i++) {
  const key = data.keys[i % data.keys.length] ?? '';
  if (!table.record(key, 1, i % 3 === 0 ? 2 : 0, data.nowNs)) dropped++;
}
parentPort?.postMessage({ kind: 'done', dropped });
