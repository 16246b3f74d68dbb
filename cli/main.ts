// The `cellquota` command: one binary, one subcommand per role.
// Each subcommand's module is imported only when it runs: an agent does not hold the coordinator's
// code (Raft, storage, the allocator) in memory, nor a coordinator the agent's.
import { ConfigError } from '../shared/cli-config.js';

const usage = `cellquota — cell-based, multi-cluster quota coordinator

Usage:
  cellquota coordinator --id n1 --peers n1=HOST:PORT,... --data-dir DIR [--admin HOST:PORT]
  cellquota agent --cell ID --rules PATH [--rls-socket PATH] [--rls-listen HOST:PORT] [--http HOST:PORT] \
[--coordinators HOST:PORT,...]
  cellquota gateway --listen HOST:PORT --upstream URL --rules FILE [--routes FILE] [--coordinators HOST:PORT,...] \
[--trusted-proxies CIDR,...]
  cellquota dev [--data-dir ./.cellquota]       the whole local deployment on loopback
  cellquota ctl <cluster|tiers|tenants|cells|members|transfer-leadership> ...

Each command takes --help. Every flag can also come from CELLQUOTA_<FLAG> or a --config file.`;

export async function main(argv: readonly string[], env: NodeJS.ProcessEnv): Promise<number> {
  const [cmd, ...rest] = argv;
  switch (cmd) {
    case 'coordinator':
      return (await import('./coordinator-command.js')).runCoordinatorCommand(rest, env);
    case 'agent':
      return (await import('../cell-agent/agent-cli.js')).runAgentCommand(rest, env);
    case 'gateway':
      return (await import('../cell-agent/gateway/gateway-cli.js')).runGatewayCommand(rest, env);
    case 'ctl':
      return (await import('./ctl-command.js')).runCtlCommand(rest, env);
    case 'dev':
      return (await import('./dev-command.js')).runDevCommand(rest, env);
    case undefined:
    case '--help':
    case '-h':
    case 'help':
      console.log(usage);
      return cmd === undefined ? 2 : 0;
    default:
      console.error(`cellquota: unknown command '${cmd}'\n\n${usage}`);
      return 2;
  }
}

main(process.argv.slice(2), process.env).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    if (err instanceof ConfigError) {
      console.error(err.message);
      process.exitCode = err.exitCode;
      return;
    }
    console.error(err instanceof Error ? (err.stack ?? err.message) : String(err));
    process.exitCode = 1;
  },
);
