// The ceiling: grpc-js answering ShouldRateLimit with one fixed OK response and no work at all —
// the request's bytes are never decoded, the answer's bytes were encoded once at start (the
// benchmark's server 'ceiling'). With `codec: 'protobufjs'` (server 'ceiling-pbjs', not measured by
// default) the request is decoded and the constant answer encoded by proto-loader/protobufjs, as in
// a typical grpc-js handler: that shows how much of a server's cost is protobufjs.
import type { RunningServer, ServerOptions } from '../../testkit/processes/server-module.js';
import {
  rawRlsService,
  startRlsServer,
  stopRlsServer,
  type RateLimitResponseMsg,
  type ShouldRateLimit,
} from './rls-grpc.js';
import type * as grpc from '@grpc/grpc-js';

/** RateLimitResponse{overall_code: OK, statuses: [{code: OK}]}: 08 01 | 12 02 (08 01). */
const FIXED_OK_BYTES = Buffer.from([0x08, 0x01, 0x12, 0x02, 0x08, 0x01]);
const FIXED_OK: RateLimitResponseMsg = { overallCode: 'OK', statuses: [{ code: 'OK' }] };

export async function start(target: string, options?: ServerOptions): Promise<RunningServer> {
  if (options?.codec === 'protobufjs') {
    const handler: ShouldRateLimit = (_call, callback) => callback(null, FIXED_OK);
    const server = await startRlsServer(target, handler);
    return {
      stop: () => stopRlsServer(server),
      description:
        'grpc-js, request decoded and constant {overall_code: OK} encoded by proto-loader/protobufjs, no other work',
    };
  }
  const handler: grpc.handleUnaryCall<Buffer, Buffer> = (_call, callback) => callback(null, FIXED_OK_BYTES);
  const server = await startRlsServer(target, handler, rawRlsService());
  return {
    stop: () => stopRlsServer(server),
    description:
      'grpc-js, default server options; handler answers pre-encoded bytes of {overall_code: OK, statuses: [{code: OK}]}, request bytes never decoded',
  };
}
