// The agent's lean RLS server (cell-agent/rls/lean-server.ts) with the decision taken out: the
// benchmark's server 'lean-transport'. Every request goes through the agent's own transport — the
// HTTP/2 stream handling, gRPC's framing, grpc-timeout, the message bound — and is decoded into
// the codec's reused objects, exactly as in the agent; then, instead of the check service's
// decision, every check gets the same answer, encoded once: the answer the agent gives a tenant's
// first request in the 'bench' domain (one OK status, the 1e9/s rule as current_limit,
// limit_remaining, duration_until_reset), so the answers on the wire are the agent's size. A request that does not decode
// gets INVALID_ARGUMENT, as from the agent.
//
// Why: beside bare-h2 (a bare node:http2 answer, no decoding) and the agent, it splits the agent's
// gap to bare-h2 in two, measured in the same run: lean-transport ÷ bare-h2 is what the agent's
// transport and decoding cost; agent ÷ lean-transport, and the difference of their CPU per check,
// what the decision and the answer's encoding cost in the serving thread (bench/agent-rls.ts).
//
// In a worker thread with the young generation the agent gives its serving workers by default
// (--worker-young-generation-mb), as the agent's serving thread runs: the two differ in the decision
// alone. (bare-h2 runs on the main thread; in a worker it measured the same, bench/README.md.)
import { once } from 'node:events';
import { startLeanRlsServer } from '../../cell-agent/rls/lean-server.js';
import type { LeanCheckService } from '../../cell-agent/rls/lean-server.js';
import { encodeRateLimitResponse } from '../../cell-agent/rls/rls-codec.js';
import { DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_WORKER_YOUNG_GENERATION_MB } from '../../cell-agent/agent-config.js';
import type { RlsServerHandle } from '../../cell-agent/rls/rls-common.js';
import { moduleWorker } from '../../shared/module-worker.js';
import { RLS_CODE } from '../../cell-agent/messages/rls-messages.js';
import type { RlsResponse } from '../../cell-agent/messages/rls-messages.js';
import type { CheckOutcome } from '../../cell-agent/decide/check-service.js';
import { createRootLogger } from '../../shared/logging.js';
import type { RunningServer, ServerOptions } from '../../testkit/processes/server-module.js';
import { UNLIMITED_PER_SECOND } from './bench-rules.js';

/** RateLimitResponse.RateLimit.Unit SECOND. */
const UNIT_SECOND = 1;

/** What the agent answers a fresh tenant of the 'bench' domain (test/bench/lean-transport-bench.test.ts). */
export const LEAN_TRANSPORT_RESPONSE: RlsResponse = Object.freeze({
  overallCode: RLS_CODE.OK,
  statuses: Object.freeze([
    Object.freeze({
      code: RLS_CODE.OK,
      currentLimit: Object.freeze({ requestsPerUnit: UNLIMITED_PER_SECOND, unit: UNIT_SECOND, name: '' }),
      limitRemaining: UNLIMITED_PER_SECOND - 1,
      durationUntilReset: Object.freeze({ seconds: 1, nanos: 0 }),
    }),
  ]),
  responseHeadersToAdd: Object.freeze([]),
  requestHeadersToAdd: Object.freeze([]),
  rawBody: null,
});

/** The answer every decoded check gets: the response above, encoded once as the lean server writes it. */
const ANSWER: CheckOutcome = Object.freeze({
  kind: 'answer',
  response: LEAN_TRANSPORT_RESPONSE,
  overLimit: false,
  verdict: 'ok',
  scope: 'local',
  retryAfterNs: 0n,
  statusLimits: Object.freeze([]),
  encoded: encodeRateLimitResponse(LEAN_TRANSPORT_RESPONSE, true),
});

/** The check service the lean server calls, deciding nothing. */
const CONSTANT_SERVICE: LeanCheckService = {
  shed: () => null,
  checkInPlace: () => ANSWER,
  rejected: () => undefined,
};

/** Serves the constant answer through the lean server on `target` (a Unix socket path or host:port). */
export async function serveLeanTransport(target: string): Promise<RlsServerHandle> {
  const logger = createRootLogger({ level: 'warn', name: 'bench-lean-transport' });
  const at = target.lastIndexOf(':');
  return startLeanRlsServer(
    CONSTANT_SERVICE,
    {
      ...(target.startsWith('/')
        ? { unix: { path: target, mode: 0o600 } }
        : { tcp: { host: target.slice(0, at), port: Number(target.slice(at + 1)) } }),
      maxMessageBytes: DEFAULT_MAX_MESSAGE_BYTES,
    },
    logger,
  );
}

export async function start(target: string, _options?: ServerOptions): Promise<RunningServer> {
  const worker = moduleWorker(import.meta.url, './lean-transport-worker', {
    workerData: { target },
    resourceLimits: { maxYoungGenerationSizeMb: DEFAULT_WORKER_YOUNG_GENERATION_MB },
  });
  try {
    const [msg] = (await once(worker, 'message')) as [unknown]; // rejects on the worker's 'error'
    if (msg !== 'ready') throw new Error(`lean-transport worker: unexpected first message ${String(msg)}`);
  } catch (err) {
    await worker.terminate();
    throw err;
  }
  return {
    stop: async () => {
      await worker.terminate();
    },
    description: `the agent's lean RLS server in a worker thread with the agent's young generation (${DEFAULT_WORKER_YOUNG_GENERATION_MB} MiB), every request decoded as in the agent, then answered with one constant encoded once (the agent's answer to a fresh tenant of the 'bench' rule): the agent's serving thread without the decision`,
  };
}
