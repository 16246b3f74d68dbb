// `--forward-auth-socket PATH`: /v1/forward-auth on a Unix socket, for a proxy on the same host
// (nginx `upstream cellquota { server unix:PATH; keepalive 32; }`). Every proxied request costs one
// subrequest, and over TCP loopback each write pays the kernel's whole TCP path for both ends; a
// Unix socket skips it (`npm run bench -- frontdoor` measures both, CPU per request of nginx and
// the agent). The socket answers forward-auth only — the check API, /metrics and /healthz stay on
// --http — and is bound like the RLS socket: at a temporary path, its mode (--socket-mode) and owner
// set, then renamed into place; a stale socket is replaced, a live one or any other file refused.
// A Unix socket's peer has no address; it is a process on this host, so it counts as UNIX_PEER
// (127.0.0.1): with --trusted-proxies 127.0.0.1 (or loopback) its X-Forwarded-For is read, as the
// same proxy's over TCP loopback would be.
import { createServer } from 'node:http';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { bindUnix, removeIfOurs } from '../rls/rls-common.js';
import type { UnixListen } from '../rls/rls-common.js';
import { isForwardAuthUrl } from './forward-auth-http.js';

/** The peer a request over the socket is taken to come from (forward-auth-http.ts's fixedPeer). */
export const UNIX_PEER = '127.0.0.1';

export interface ForwardAuthSocket {
  readonly path: string;
  close(): Promise<void>;
}

const NOT_HERE = 'not found: this socket answers /v1/forward-auth only\n';

export async function startForwardAuthSocket(
  listen: UnixListen,
  handler: (req: IncomingMessage, res: ServerResponse) => void,
): Promise<ForwardAuthSocket> {
  const server = createServer((req, res) => {
    if (isForwardAuthUrl(req.url)) handler(req, res);
    else res.writeHead(404, { 'content-type': 'text/plain' }).end(NOT_HERE);
  });
  server.keepAliveTimeout = 72_000; // as the HTTP port's
  let bound;
  try {
    bound = await bindUnix(
      listen,
      (tmp) =>
        new Promise<void>((resolve, reject) => {
          server.once('error', reject);
          server.listen(tmp, () => {
            server.off('error', reject);
            resolve();
          });
        }),
    );
  } catch (error) {
    if (server.listening) server.close();
    throw error;
  }
  const ours = bound;
  return {
    path: ours.path,
    close: async () => {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      server.closeIdleConnections();
      await closed;
      await removeIfOurs(ours);
    },
  };
}
