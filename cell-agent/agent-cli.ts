// `cellquota agent`: settings from flags, CELLQUOTA_* variables and --config (shared/cli-config.ts),
// then startAgent; prints the endpoints, stops cleanly on SIGINT / SIGTERM.
//
// Exit codes: 0 after a clean stop (or --help), 2 for bad settings, bad rules or a bad tenants file,
// 1 when the agent cannot start otherwise (a socket in use, an address that cannot be bound, ...).
// Runnable directly: `tsx cell-agent/agent-cli.ts --cell eu-west --rules rules.yaml --rls-socket /run/ratelimit.sock`.
import { realpathSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { ConfigError, loadSettings, settingsHelp } from '../shared/cli-config.js';
import { createRootLogger } from '../shared/logging.js';
import { AGENT_SETTING_SPECS, agentConfigSchema } from './agent-config.js';
import type { AgentConfig } from './agent-config.js';
import { startAgent } from './agent-main.js';
import type { AgentHandle } from './agent-main.js';
import { QuotaConfigError } from './decide/quotas.js';
import { isRulesError } from './rules/rules-errors.js';
import { RoutesError } from './front-door/routes.js';

export interface AgentCommandIo {
  readonly stdout: { write(text: string): unknown };
  readonly stderr: { write(text: string): unknown };
  /** Where SIGINT / SIGTERM come from (process by default). */
  readonly signals: Pick<NodeJS.Process, 'once' | 'off'>;
}

const USAGE = `usage: cellquota agent --cell ID --rules PATH [--rls-socket PATH] [--rls-listen HOST:PORT] [--http HOST:PORT] [options]

Answers Envoy's rate-limit checks (envoy.service.ratelimit.v3.RateLimitService) from shared memory.
Every flag can also be given as CELLQUOTA_<FLAG> or in a YAML/JSON file named by --config.

`;

export async function runAgentCommand(argv: readonly string[], env: NodeJS.ProcessEnv, io: AgentCommandIo = { stdout: process.stdout, stderr: process.stderr, signals: process }): Promise<number> {
  if (argv.includes('--help') || argv.includes('-h')) {
    io.stdout.write(`${USAGE}${settingsHelp(AGENT_SETTING_SPECS)}\n`);
    return 0;
  }
  let config: AgentConfig;
  try {
    config = loadSettings('cellquota agent', AGENT_SETTING_SPECS, agentConfigSchema, argv, env);
  } catch (error) {
    if (error instanceof ConfigError) {
      io.stderr.write(`${error.message}\n`);
      return error.exitCode;
    }
    throw error;
  }
  const logger = createRootLogger({ level: config.logLevel, name: 'cellquota-agent', base: { cell: config.cell } });
  let agent: AgentHandle;
  try {
    agent = await startAgent(config, logger);
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error);
    if (isRulesError(error) || error instanceof QuotaConfigError || error instanceof RoutesError || error instanceof ConfigError) {
      io.stderr.write(`cellquota agent: ${message}\n`);
      return 2;
    }
    io.stderr.write(`cellquota agent: cannot start: ${message}\n`);
    return 1;
  }

  const e = agent.endpoints;
  const lines = [`cellquota agent (cell ${config.cell}) is serving:`];
  for (const p of e.rlsUnix) lines.push(`  rls unix  ${p}`);
  for (const a of e.rlsTcp) lines.push(`  rls tcp   ${a}`);
  if (e.http !== null) lines.push(`  http      ${e.http}  (forward-auth: ${e.http}/v1/forward-auth; ${isLoopbackHost(config.http?.host ?? '') ? 'loopback only' : 'reachable from the network: no authentication, keep it on a trusted network'})`);
  lines.push(config.coordinators.length === 0
    ? '  (no coordinators: global quotas run on static slices)'
    : `  (coordinators ${config.coordinators.map((c) => `${c.id === undefined ? '' : `${c.id}=`}${c.host}:${c.port}`).join(',')}: global quotas run on static slices until the leader grants leased slices)`);
  io.stdout.write(`${lines.join('\n')}\n`);

  const signal = await new Promise<NodeJS.Signals>((resolveSignal) => {
    const on = (s: NodeJS.Signals): void => {
      io.signals.off('SIGINT', on);
      io.signals.off('SIGTERM', on);
      resolveSignal(s);
    };
    io.signals.once('SIGINT', on);
    io.signals.once('SIGTERM', on);
  });
  logger.info({ signal }, 'stopping');
  try {
    await agent.stop();
  } catch (error) {
    io.stderr.write(`cellquota agent: error while stopping: ${error instanceof Error ? error.message : String(error)}\n`);
    return 1;
  }
  return 0;
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
      process.stderr.write(`cellquota agent: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
      process.exitCode = 1;
    },
  );
}
