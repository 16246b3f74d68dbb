// The cellquota agent as a server under test: writes bench-rules.ts's rules as YAML files and starts
// it with startAgent(parseAgentConfig(...), logger) — alone (no coordinators; the rules here are
// local ones), one serving worker by default (the same single event loop as the grpc-js baselines;
// `options.workers` for more: worker i > 0 serves on `<socket>.<i>`, or TCP port + i — all of them
// reported as `endpoints` for the load generator to spread its connections over, as Envoy spreads
// its checks over every endpoint of the cluster), its RLS server on the benchmark's target and
// nothing else (no HTTP API).
//
// One deviation from the agent's defaults: the lag guard is off (lagThresholdMs 0) unless
// `options.overloadPolicy` is given (bench/overload.ts). With it, a saturated agent takes its
// overload path — right in production, but then a throughput figure would count answers that
// skipped the decision. The load generator counts degraded answers anyway (column 'degraded').
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseAgentConfig, type AgentConfigInput } from '../../cell-agent/agent-config.js';
import { startAgent } from '../../cell-agent/agent-main.js';
import { createRootLogger } from '../../shared/logging.js';
import { rulesYaml } from './bench-rules.js';
import type { RunningServer, ServerOptions } from '../../testkit/processes/server-module.js';

export function writeRules(dir: string): string {
  const rulesDir = join(dir, 'rules');
  mkdirSync(rulesDir, { recursive: true });
  for (const { file, text } of rulesYaml()) writeFileSync(join(rulesDir, file), text);
  return rulesDir;
}

export async function start(target: string, options: ServerOptions): Promise<RunningServer> {
  const workers = options.workers ?? 1;
  const input: AgentConfigInput = {
    cell: 'bench',
    rules: writeRules(options.scratchDir),
    workers,
    logLevel: 'warn',
    ...(options.overloadPolicy === undefined
      ? { lagThresholdMs: 0 }
      : {
          overloadPolicy: options.overloadPolicy,
          ...(options.lagThresholdMs === undefined ? {} : { lagThresholdMs: options.lagThresholdMs }),
        }),
    rlsServer: options.rlsServer ?? 'lean',
    ...(options.workerYoungGenerationMb === undefined
      ? {}
      : { workerYoungGenerationMb: options.workerYoungGenerationMb }),
    ...(target.startsWith('/') ? { rlsSocket: target } : { rlsListen: target }),
  };
  const config = parseAgentConfig(input);
  const agent = await startAgent(config, createRootLogger({ level: config.logLevel, name: 'bench-agent' }));
  const endpoints = [...agent.endpoints.rlsUnix, ...agent.endpoints.rlsTcp];
  if (endpoints.length !== workers) {
    await agent.stop();
    throw new Error(
      `the agent serves on ${endpoints.length} endpoint(s) (${endpoints.join(', ')}), expected one per worker (${workers})`,
    );
  }
  return {
    stop: () => agent.stop(),
    endpoints,
    description: `cellquota agent (startAgent, ${options.rlsServer ?? 'lean'} RLS server), ${workers} worker${workers === 1 ? '' : 's'}, ${options.overloadPolicy === undefined ? 'lag guard off' : `overload policy ${options.overloadPolicy}, lag threshold ${config.lagThresholdMs} ms`}, local rules only, serving ${endpoints.join(', ')}`,
  };
}
