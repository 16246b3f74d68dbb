// One worker thread of bench/servers/bare-h2.ts with several workers: serves the constant answer on
// workerData.target and says 'ready'; the server is closed when the thread is terminated.
import { parentPort, workerData } from 'node:worker_threads';
import { serveBare } from './bare-h2.js';

const { target } = workerData as { target: string };
await serveBare(target);
parentPort?.postMessage('ready');
