// Test fixture, not a test: `cellquota agent` (the real command, same flags) in a process that a
// test can freeze. An IPC message {block: ms, marker: path} from the parent writes the wall-clock
// time to `marker` (synchronously: an IPC answer would only leave after the loop) and then
// busy-loops THIS process's main thread for ms milliseconds (its lease client, timers, HTTP API and worker supervision stop) while the
// agent's worker threads keep serving RLS: the stall SIGSTOP cannot produce (it stops every thread).
// The switch lives here only: the agent itself has no such hook, flag or variable.
import { writeFileSync } from 'node:fs';
import { runAgentCommand } from '../../../cell-agent/agent-cli.js';

process.on('message', (m: unknown) => {
  const msg = m as { block?: unknown; marker?: unknown } | null;
  if (typeof msg?.block !== 'number' || typeof msg.marker !== 'string') return;
  writeFileSync(msg.marker, String(Date.now()));
  const until = performance.now() + msg.block;
  while (performance.now() < until) {
    // the main thread does nothing else meanwhile
  }
});

runAgentCommand(process.argv.slice(2), process.env).then(
  (code) => process.exit(code),
  (error: unknown) => {
    process.stderr.write(
      `blockable agent: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`,
    );
    process.exit(1);
  },
);
