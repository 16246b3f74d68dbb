// The front-door benchmark's nginx: one process, one worker, one config with a server per row, each
// forward-auth server being deploy/examples/front-door/nginx/cellquota.conf as an operator would
// include it, with only its addresses swapped (so the example is what is measured):
//   plain        proxy_pass to the app, nothing else
//   limitReq     the same with nginx's own limit_req (the baseline of the forward-auth target)
//   forwardAuth  the example as it is: the agent over TCP
//   unix         the example with the agent's --forward-auth-socket in place of its TCP address
//   ceiling      the example with the auth subrequest answered by this nginx itself (`return 200` on
//                a Unix socket): an auth service that costs next to nothing, so the ratio this row
//                reaches is the most any forward-auth service can reach on this machine
//   emptyNode    the example with an empty node:http server (200, no decision) on a Unix socket:
//                the floor of any auth service written on node:http
import { join } from 'node:path';

export interface NginxPorts {
  readonly plain: number;
  readonly limitReq: number;
  readonly forwardAuth: number;
  readonly unix: number;
  readonly ceiling: number;
  readonly emptyNode: number;
}

export interface NginxConfInput {
  /** deploy/examples/front-door/nginx/cellquota.conf's text. */
  readonly example: string;
  readonly dir: string;
  readonly ports: NginxPorts;
  readonly upstreamPort: number;
  readonly agentPort: number;
  readonly agentSocket: string;
  readonly ceilingSocket: string;
  readonly emptyNodeSocket: string;
}

const APP_UPSTREAM = 'upstream app { server 127.0.0.1:8080; keepalive 32; }';

export function nginxConf(c: NginxConfInput): string {
  const overSocket = (port: number, name: string, socket: string): string =>
    swapAll(c.example, [
      ['listen 80;', `listen 127.0.0.1:${port};`],
      [APP_UPSTREAM, ''], // the app's upstream declared once, in the TCP copy
      ['upstream cellquota {', `upstream ${name} {`],
      ['http://cellquota/', `http://${name}/`],
      ['127.0.0.1:9091', `unix:${socket}`],
    ]);
  const forwardAuth = swapAll(c.example, [
    ['listen 80;', `listen 127.0.0.1:${c.ports.forwardAuth};`],
    ['127.0.0.1:8080', `127.0.0.1:${c.upstreamPort}`],
    ['127.0.0.1:9091', `127.0.0.1:${c.agentPort}`],
  ]);
  const proxyToApp =
    'proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; ' +
    'proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;';
  const temp = ['client_body', 'proxy', 'fastcgi', 'uwsgi', 'scgi']
    .map((t) => `${t}_temp_path ${join(c.dir, t)};`)
    .join(' ');
  return `worker_processes 1;
error_log ${join(c.dir, 'logs/error.log')} warn;
pid ${join(c.dir, 'nginx.pid')};
events { worker_connections 4096; }
http {
  access_log off;
  # nginx closes a client connection after 1,000 requests by default; a close with a request in
  # flight counts as an error in the load client, which is its artefact, not the proxy's
  keepalive_requests 10000000;
  ${temp}
  limit_req_zone $binary_remote_addr zone=visitors:10m rate=100000000r/s;
${forwardAuth}
${overSocket(c.ports.unix, 'cellquota_unix', c.agentSocket)}
${overSocket(c.ports.ceiling, 'cellquota_ceiling', c.ceilingSocket)}
${overSocket(c.ports.emptyNode, 'cellquota_empty_node', c.emptyNodeSocket)}
  server {
    listen unix:${c.ceilingSocket};
    location / { return 200; }
  }
  server {
    listen 127.0.0.1:${c.ports.plain};
    location / { ${proxyToApp} }
  }
  server {
    listen 127.0.0.1:${c.ports.limitReq};
    location / { limit_req zone=visitors burst=100000000 nodelay; ${proxyToApp} }
  }
}
`;
}

/** `text` with every `from` replaced by its `to`; each `from` must occur (the example changed otherwise). */
function swapAll(text: string, pairs: readonly (readonly [string, string])[]): string {
  let out = text;
  for (const [from, to] of pairs) {
    if (!out.includes(from)) throw new Error(`the nginx example no longer contains ${from}`);
    out = out.split(from).join(to);
  }
  return out;
}
