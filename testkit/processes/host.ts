// Runs one server under test in a process of its own (forked by testkit/processes/server-process.ts):
// imports the module named in the 'start' message, calls its start(target, options), reports
// 'ready' (or 'failed'), and on 'stop' — or when the parent goes away — stops it and exits.
import { pathToFileURL } from 'node:url';
import type { RunningServer, ServerOptions, StartServer } from './server-module.js';

export type ToHost =
  | { readonly type: 'start'; readonly modulePath: string; readonly target: string; readonly options: ServerOptions }
  | { readonly type: 'stop' };
export type FromHost =
  | { readonly type: 'ready'; readonly description: string; readonly endpoints: readonly string[] }
  | { readonly type: 'failed'; readonly message: string }
  | { readonly type: 'stopped' };

function send(msg: FromHost): void {
  if (process.send !== undefined && process.connected) process.send(msg);
}

let running: RunningServer | null = null;
let stopping: Promise<void> | null = null;

function stopAndExit(code: number): void {
  stopping ??= (async () => {
    const timer = setTimeout(() => process.exit(code), 5000);
    try {
      await running?.stop();
    } catch (err) {
      console.error(`server stop failed: ${err instanceof Error ? err.message : String(err)}`);
    }
    clearTimeout(timer);
    send({ type: 'stopped' });
    process.exit(code);
  })();
}

async function startServer(msg: Extract<ToHost, { type: 'start' }>): Promise<void> {
  try {
    const mod = (await import(pathToFileURL(msg.modulePath).href)) as { start?: StartServer };
    if (typeof mod.start !== 'function') throw new Error(`${msg.modulePath} exports no start()`);
    running = await mod.start(msg.target, msg.options);
    send({ type: 'ready', description: running.description ?? '', endpoints: running.endpoints ?? [msg.target] });
  } catch (err) {
    send({ type: 'failed', message: err instanceof Error ? (err.stack ?? err.message) : String(err) });
    stopAndExit(1);
  }
}

process.on('disconnect', () => stopAndExit(0));
process.on('SIGTERM', () => stopAndExit(0));
process.on('message', (msg: ToHost) => {
  if (msg.type === 'start') void startServer(msg);
  else stopAndExit(0);
});
