// The worker thread of bench/servers/lean-transport.ts: serves the constant answer through the lean
// server on workerData.target and says 'ready'; the server goes when the thread is terminated.
import { parentPort, workerData } from 'node:worker_threads';
import { serveLeanTransport } from './lean-transport.js';

const { target } = workerData as { target: string };
await serveLeanTransport(target);
parentPort?.postMessage('ready');
