// One app replica for the replicas test: a fastify hello-world with the cellquota plugin on `/`, one
// global quota per tenant (`global: true`, the tenant from the x-tenant header), leased from the
// coordinators as cell CELL (every tier and tenant is the coordinators', written by the test through their
// admin API). Settings come as one JSON argument; it prints `listening <url>` once it
// serves; GET /lease answers the lease state; it exits on SIGTERM.
import Fastify from 'fastify';
import cellquota from '../../embedded/fastify.js';
import { createLimiter } from '../../embedded/limiter.js';

interface Settings {
  readonly cell: string;
  readonly coordinators: string;
}

const settings = JSON.parse(process.argv[2] ?? '{}') as Settings;
const limiter = await createLimiter({
  rules: { domain: 'api', descriptors: [{ key: 'tenant', global: true }] },
  cell: settings.cell,
  coordinators: settings.coordinators,
});
const app = Fastify();
await app.register(async (scope) => {
  await scope.register(cellquota, {
    limiter,
    descriptors: (request) => [[{ key: 'tenant', value: String(request.headers['x-tenant'] ?? 'none') }]],
    headersOnAllowed: false,
  });
  scope.get('/', (_request, reply) => {
    void reply.send('hello');
  });
});
app.get('/lease', (_request, reply) => {
  void reply.send({ lease: limiter.status().lease });
});
const url = await app.listen({ host: '127.0.0.1', port: 0 });
console.log(`listening ${url}`);
process.on('SIGTERM', () => {
  void app
    .close()
    .then(() => limiter.close())
    .then(() => process.exit(0));
});
