// The gRPC server of one serving thread: Envoy's RateLimitService/ShouldRateLimit and the gRPC health
// service (grpc.health.v1.Health: Check, List, Watch), on a Unix socket and/or a TCP address.
//
// Two implementations behind one handle: the lean server on node:http2 (lean-server.ts, the
// default) and grpc-js (grpcjs-server.ts, `--rls-server grpc-js`, kept while the benchmark compares
// the two; imported only when chosen, so a lean worker never loads grpc-js). Both decode and encode
// with rls-codec.ts and share the health state and the Unix socket handling (rls-common.ts).
import type { Logger } from '../../shared/logging.js';
import type { CheckService } from '../decide/check-service.js';
import { startLeanRlsServer } from './lean-server.js';
import type { RlsListenOptions, RlsServerHandle } from './rls-common.js';

export {
  HEALTH_SERVICE_NAME,
  RLS_METHOD_PATH,
  RLS_SERVER_KINDS,
  RLS_SERVICE_NAME,
  SocketPathError,
  MAX_UNIX_PATH_BYTES,
} from './rls-common.js';
export type {
  RlsEndpoints,
  RlsListenOptions,
  RlsServerHandle,
  RlsServerKind,
  TcpListen,
  UnixListen,
} from './rls-common.js';

/** Starts the server on the configured addresses. Rejects if any address cannot be bound. */
export async function startRlsServer(
  service: CheckService,
  opts: RlsListenOptions,
  logger: Logger,
): Promise<RlsServerHandle> {
  if (opts.server === 'grpc-js') {
    const { startGrpcJsRlsServer } = await import('./grpcjs-server.js');
    return startGrpcJsRlsServer(service, opts, logger);
  }
  return startLeanRlsServer(service, opts, logger);
}
