// /v1/forward-auth on node:http, ahead of fastify: the agent's HTTP server hands every request whose
// path is the forward-auth path straight here (fastify's serverFactory, http-api.ts), and all others
// to fastify. A forward-auth request is one subrequest per proxied request (nginx auth_request, Caddy
// forward_auth, Traefik ForwardAuth), so its cost is what the front door pays: fastify's routing,
// hooks and reply objects cost about as much as the decision itself, and nothing of them is needed
// to answer a bodiless question with a status and a few headers (`npm run bench -- frontdoor`).
//
// The answer is forward-auth.ts's, as the gateway gives it. The auth request's body is never read:
// one over the body limit, or of unknown length, is answered with `Connection: close`, so the
// connection's remaining bytes are never parsed. An exception answers 500 (a proxy then refuses the
// request: nothing is let through by a failure here) and is logged at most once a second.
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from '../../shared/logging.js';
import type { AddressSet } from '../../shared/client-address.js';
import type { CheckService } from '../decide/check-service.js';
import { FORWARD_AUTH_PATH, answerFor, forwardedRequest } from './forward-auth.js';
import type { DenyStatus } from './forward-auth.js';
import type { Routes } from './routes.js';

export interface ForwardAuthDeps {
  readonly routes: () => Routes;
  readonly trusted: AddressSet;
  readonly denyStatus: DenyStatus;
  readonly ipv6Prefix?: number;
}

/** Whether a request URL is for forward-auth: the path itself, a sub-path, or either with a query. */
export function isForwardAuthUrl(url: string | undefined): boolean {
  if (url === undefined || !url.startsWith(FORWARD_AUTH_PATH)) return false;
  const next = url.charCodeAt(FORWARD_AUTH_PATH.length);
  return Number.isNaN(next) || next === 0x2f /* / */ || next === 0x3f; /* ? */
}

const REFUSED_BODY = 'Too Many Requests\n';
// shared by every unlimited answer; node:http only reads it
const NOT_LIMITED_HEADERS = ['content-length', '0'];
const UNDECIDABLE_BODY = 'refused: the request cannot be rate-limited\n';

export function forwardAuthHandler(
  deps: ForwardAuthDeps,
  check: CheckService,
  bodyLimit: number,
  logger: Logger,
  /** The peer of every request, in place of the socket's (a Unix socket has no address). */
  fixedPeer?: string,
): (req: IncomingMessage, res: ServerResponse) => void {
  const keyOptions = {
    trusted: deps.trusted,
    ...(deps.ipv6Prefix === undefined ? {} : { ipv6Prefix: deps.ipv6Prefix }),
  };
  let lastErrorLogMs = 0;
  return (req, res) => {
    try {
      const length = req.headers['content-length'];
      if ((length !== undefined && Number(length) > 0) || req.headers['transfer-encoding'] !== undefined) {
        // Not read: close after the answer so the body is never parsed as the next request.
        res.shouldKeepAlive = false;
        if (length === undefined || !(Number(length) <= bodyLimit)) {
          res.writeHead(413, { 'content-type': 'text/plain', connection: 'close' }).end('payload too large\n');
          return;
        }
      }
      const fwd = forwardedRequest(
        req.headers,
        fixedPeer ?? req.socket.remoteAddress,
        req.method ?? 'GET',
        req.url ?? FORWARD_AUTH_PATH,
        keyOptions,
      );
      const request = deps.routes().requestFor(fwd);
      if (request.descriptors.length === 0) {
        res.writeHead(200, NOT_LIMITED_HEADERS).end();
        return;
      }
      const out = check.check(request);
      if (out.kind === 'error') {
        // A request the agent will not decide (a forwarded header over an input bound): refused,
        // never let through — its sender could choose the oversized value.
        res
          .writeHead(deps.denyStatus, {
            'content-type': 'text/plain',
            'retry-after': '1',
            'x-cellquota-error': out.message.slice(0, 200),
          })
          .end(UNDECIDABLE_BODY);
        return;
      }
      // One writeHead with the answer's own flat header array: no header object, no setHeader.
      const answer = answerFor(out, deps.denyStatus);
      if (answer.allowed) {
        answer.headers.push('content-length', '0');
        res.writeHead(200, answer.headers).end();
        return;
      }
      answer.headers.push('content-type', 'text/plain');
      res.writeHead(answer.status, answer.headers).end(REFUSED_BODY);
    } catch (error) {
      const now = Date.now();
      if (now - lastErrorLogMs >= 1000) {
        lastErrorLogMs = now;
        logger.error({ err: error, url: req.url }, 'forward-auth failed; answered 500');
      }
      if (!res.headersSent) res.writeHead(500, { 'content-type': 'text/plain' });
      res.end('internal error\n');
    }
  };
}
