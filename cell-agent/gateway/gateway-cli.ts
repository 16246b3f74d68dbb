// `cellquota gateway`: settings from flags, CELLQUOTA_* variables and --config, then startGateway;
// prints the endpoints, stops cleanly on SIGINT / SIGTERM. Exit codes as `cellquota agent`: 0 after
// a clean stop (or --help), 2 for bad settings, rules, routes or tenants, 1 when it cannot start.
import { loadSettings, settingsHelp } from '../../shared/cli-config.js';
import { createRootLogger } from '../../shared/logging.js';
import { GATEWAY_SETTING_SPECS, gatewayConfigSchema } from './gateway-config.js';
import { startGateway } from './gateway-main.js';
import { serveUntilSignal, settingsOrExit, startOrExit } from '../serve-command.js';
import type { ServeCommandIo } from '../serve-command.js';

export type GatewayCommandIo = ServeCommandIo;

const SYNOPSIS =
  'cellquota gateway --listen HOST:PORT --upstream URL --rules FILE [--routes FILE] ' +
  '[--coordinators HOST:PORT,...] [--trusted-proxies CIDR,...] [options]';
const USAGE = `usage: ${SYNOPSIS}

A reverse proxy in front of one upstream: every request is decided like the agent's forward-auth
(429 with Retry-After when refused), on the embedded agent's buckets and, with --coordinators, its
leased share of global quotas. Every flag can also be given as CELLQUOTA_<FLAG> or in a YAML/JSON
file named by --config.

`;

export async function runGatewayCommand(
  argv: readonly string[],
  env: NodeJS.ProcessEnv,
  io: GatewayCommandIo = { stdout: process.stdout, stderr: process.stderr, signals: process },
): Promise<number> {
  if (argv.includes('--help') || argv.includes('-h')) {
    io.stdout.write(`${USAGE}${settingsHelp(GATEWAY_SETTING_SPECS)}\n`);
    return 0;
  }
  const settings = settingsOrExit(io, () =>
    loadSettings('cellquota gateway', GATEWAY_SETTING_SPECS, gatewayConfigSchema, argv, env),
  );
  if (!settings.ok) return settings.exitCode;
  const config = settings.value;
  const logger = createRootLogger({ level: config.logLevel, name: 'cellquota-gateway', base: { cell: config.cell } });
  const started = await startOrExit(io, 'cellquota gateway', () => startGateway(config, logger));
  if (!started.ok) return started.exitCode;
  const gateway = started.value;
  io.stdout.write(
    `cellquota gateway (cell ${config.cell}) is serving:\n` +
      `  proxy    ${gateway.url} -> ${config.upstream.href}\n` +
      `  health   ${gateway.healthUrl}/healthz, ${gateway.healthUrl}/metrics\n`,
  );
  return serveUntilSignal(io, logger, 'cellquota gateway', () => gateway.stop());
}
