// `cellquota agent`: settings from flags, CELLQUOTA_* variables and --config (shared/cli-config.ts),
// then startAgent; prints the endpoints, stops cleanly on SIGINT / SIGTERM.
//
// Exit codes: 0 after a clean stop (or --help), 2 for bad settings, bad rules or a bad tenants file,
// 1 when the agent cannot start otherwise (a socket in use, an address that cannot be bound, ...).
// Runnable directly: `tsx cell-agent/agent-cli.ts --cell eu-west --rules rules.yaml --rls-socket /run/ratelimit.sock`.
import { realpathSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { settingsHelp } from '../shared/cli-config.js';
import { createRootLogger } from '../shared/logging.js';
import { releaseStartupMemory } from '../shared/release-memory.js';
import type { CoordinatorAddress } from './agent-config.js';
import { AGENT_ALONE_NOTE, AGENT_COORDINATED_NOTE } from './agent-config.js';
import { startAgent } from './agent-main.js';
import { loadAgentSettings } from './agent-settings.js';
import { serveUntilSignal, settingsOrExitAsync, startOrExit } from './serve-command.js';
import type { ServeCommandIo } from './serve-command.js';

export type AgentCommandIo = ServeCommandIo;

const SYNOPSIS =
  'cellquota agent --cell ID --rules PATH [--rls-socket PATH] [--rls-listen HOST:PORT] [--http HOST:PORT] [options]';
const USAGE = `usage: ${SYNOPSIS}

Answers Envoy's rate-limit checks (envoy.service.ratelimit.v3.RateLimitService) from shared memory.
Every flag can also be given as CELLQUOTA_<FLAG> or in a YAML/JSON file named by --config.

`;

const coordinatorAddress = (c: CoordinatorAddress): string =>
  `${c.id === undefined ? '' : `${c.id}=`}${c.host}:${c.port}`;
const HTTP_REACHABLE_NOTE = 'reachable from the network: no authentication, keep it on a trusted network';

export async function runAgentCommand(
  argv: readonly string[],
  env: NodeJS.ProcessEnv,
  io: AgentCommandIo = { stdout: process.stdout, stderr: process.stderr, signals: process },
): Promise<number> {
  if (argv.includes('--help') || argv.includes('-h')) {
    const { AGENT_SETTING_SPECS } = await import('./agent-config.js');
    io.stdout.write(`${USAGE}${settingsHelp(AGENT_SETTING_SPECS)}\n`);
    return 0;
  }
  // Validated in a thread of their own, so this one never holds zod (agent-settings.ts).
  const settings = await settingsOrExitAsync(io, () => loadAgentSettings('cellquota agent', argv, env));
  if (!settings.ok) return settings.exitCode;
  const config = settings.value;
  const logger = createRootLogger({ level: config.logLevel, name: 'cellquota-agent', base: { cell: config.cell } });
  const started = await startOrExit(io, 'cellquota agent', () => startAgent(config, logger));
  if (!started.ok) return started.exitCode;
  const agent = started.value;
  // Start-up is done (every worker serves): what it left in this thread's heap is given back before
  // the agent says it serves (shared/release-memory.ts), unless this thread answers checks itself (the
  // HTTP API, forward-auth): the collection would leave its hot path slower for good.
  if (config.http === undefined) await releaseStartupMemory(logger);

  const e = agent.endpoints;
  const lines = [`cellquota agent (cell ${config.cell}) is serving:`];
  for (const p of e.rlsUnix) lines.push(`  rls unix  ${p}`);
  for (const a of e.rlsTcp) lines.push(`  rls tcp   ${a}`);
  if (e.http !== null)
    lines.push(
      `  http      ${e.http}  (forward-auth: ${e.http}/v1/forward-auth; ` +
        `${isLoopbackHost(config.http?.host ?? '') ? 'loopback only' : HTTP_REACHABLE_NOTE})`,
    );
  if (e.http !== null && config.forwardAuthSocket !== undefined)
    lines.push(`  forward-auth unix  ${config.forwardAuthSocket}  (/v1/forward-auth only)`);
  lines.push(
    config.coordinators.length === 0
      ? `  (${AGENT_ALONE_NOTE})`
      : `  (coordinators ${config.coordinators.map(coordinatorAddress).join(',')}: ${AGENT_COORDINATED_NOTE})`,
  );
  io.stdout.write(`${lines.join('\n')}\n`);

  return serveUntilSignal(io, logger, 'cellquota agent', () => agent.stop());
}

function isLoopbackHost(host: string): boolean {
  return host === 'localhost' || host === '::1' || host === '[::1]' || /^127\./.test(host);
}

function isMain(): boolean {
  const entry = process.argv[1];
  if (entry === undefined) return false;
  try {
    return realpathSync(entry) === realpathSync(fileURLToPath(import.meta.url));
  } catch {
    return false;
  }
}

if (isMain()) {
  runAgentCommand(process.argv.slice(2), process.env).then(
    (code) => {
      process.exitCode = code;
    },
    (error: unknown) => {
      process.stderr.write(
        `cellquota agent: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`,
      );
      process.exitCode = 1;
    },
  );
}
