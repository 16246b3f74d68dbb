// A worker thread running one of the project's modules: the compiled .js beside the caller, or the
// .ts source through tsx when the caller itself runs from source (tests, `npx tsx`). Node 20 does
// not apply the parent's `--import tsx` loader to a worker's .ts entry, so the worker registers it
// first and then imports the entry.
import { Worker } from 'node:worker_threads';
import type { WorkerOptions } from 'node:worker_threads';

/**
 * Starts `name` (a module path without extension, relative to `callerUrl`, e.g. './agent-worker')
 * in a worker thread with `options` (workerData, resourceLimits, ...).
 */
export function moduleWorker(callerUrl: string, name: string, options: WorkerOptions = {}): Worker {
  const fromSource = callerUrl.endsWith('.ts');
  const entry = new URL(`${name}${fromSource ? '.ts' : '.js'}`, callerUrl);
  if (!fromSource) return new Worker(entry, options);
  const api = import.meta.resolve('tsx/esm/api');
  const boot =
    `import(${JSON.stringify(api)})` + `.then((m) => { m.register(); return import(${JSON.stringify(entry.href)}); });`;
  return new Worker(boot, { ...options, eval: true });
}
