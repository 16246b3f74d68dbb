// `cellquota gateway`: settings from flags, CELLQUOTA_* variables and --config, then startGateway;
// prints the endpoints, stops cleanly on SIGINT / SIGTERM. Exit codes as `cellquota agent`: 0 after
// a clean stop (or --help), 2 for bad settings, rules, routes or tenants, 1 when it cannot start.
import { ConfigError, loadSettings, settingsHelp } from '../../shared/cli-config.js';
import { createRootLogger } from '../../shared/logging.js';
import { QuotaConfigError } from '../decide/quotas.js';
import { RoutesError } from '../front-door/routes.js';
import { isRulesError } from '../rules/rules-errors.js';
import { GATEWAY_SETTING_SPECS, gatewayConfigSchema } from './gateway-config.js';
import type { GatewayConfig } from './gateway-config.js';
import { startGateway } from './gateway-main.js';
import type { GatewayHandle } from './gateway-main.js';

export interface GatewayCommandIo {
  readonly stdout: { write(text: string): unknown };
  readonly stderr: { write(text: string): unknown };
  readonly signals: Pick<NodeJS.Process, 'once' | 'off'>;
}

const USAGE = `usage: cellquota gateway --listen HOST:PORT --upstream URL --rules FILE [--routes FILE] [--coordinators HOST:PORT,...] [--trusted-proxies CIDR,...] [options]

A reverse proxy in front of one upstream: every request is decided like the agent's forward-auth
(429 with Retry-After when refused), on the embedded agent's buckets and, with --coordinators, its
leased share of global quotas. Every flag can also be given as CELLQUOTA_<FLAG> or in a YAML/JSON
file named by --config.

`;

export async function runGatewayCommand(argv: readonly string[], env: NodeJS.ProcessEnv, io: GatewayCommandIo = { stdout: process.stdout, stderr: process.stderr, signals: process }): Promise<number> {
  if (argv.includes('--help') || argv.includes('-h')) {
    io.stdout.write(`${USAGE}${settingsHelp(GATEWAY_SETTING_SPECS)}\n`);
    return 0;
  }
  let config: GatewayConfig;
  try {
    config = loadSettings('cellquota gateway', GATEWAY_SETTING_SPECS, gatewayConfigSchema, argv, env);
  } catch (error) {
    if (error instanceof ConfigError) {
      io.stderr.write(`${error.message}\n`);
      return error.exitCode;
    }
    throw error;
  }
  const logger = createRootLogger({ level: config.logLevel, name: 'cellquota-gateway', base: { cell: config.cell } });
  let gateway: GatewayHandle;
  try {
    gateway = await startGateway(config, logger);
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error);
    if (error instanceof ConfigError || isRulesError(error) || error instanceof QuotaConfigError || error instanceof RoutesError) {
      io.stderr.write(`cellquota gateway: ${message}\n`);
      return 2;
    }
    io.stderr.write(`cellquota gateway: cannot start: ${message}\n`);
    return 1;
  }
  io.stdout.write(`cellquota gateway (cell ${config.cell}) is serving:\n  proxy    ${gateway.url} -> ${config.upstream.href}\n  health   ${gateway.healthUrl}/healthz, ${gateway.healthUrl}/metrics\n`);
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
    await gateway.stop();
  } catch (error) {
    io.stderr.write(`cellquota gateway: error while stopping: ${error instanceof Error ? error.message : String(error)}\n`);
    return 1;
  }
  return 0;
}
