// The settings thread (agent-settings.ts): validates the agent's settings with zod, posts the
// answer, and ends, taking zod and the schemas with its isolate.
import { parentPort, workerData } from 'node:worker_threads';
import { readAgentSettings } from './agent-settings-read.js';
import type { SettingsRequest } from './agent-settings.js';

if (parentPort === null) throw new Error('agent-settings-thread.ts runs as a worker thread');
parentPort.postMessage(readAgentSettings(workerData as SettingsRequest));
parentPort.close();
