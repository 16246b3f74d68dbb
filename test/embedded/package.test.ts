// The package as a user installs it: `npm pack`, the tarball installed into a fresh app with
// `npm install ./cellquota-*.tgz`, then the three entry points imported there, the limiter run, and a
// TypeScript consumer type-checked against the shipped .d.ts. The pack runs on a copy of the sources
// (with this checkout's node_modules linked), so it never rewrites this checkout's dist/ under other
// tests. To keep the test to seconds, the copy builds only what the entry points import (tsc with
// tsconfig.build.json's options on embedded/*.ts) and packs with --ignore-scripts; `npm pack` itself
// runs the whole build through `prepare`.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { cp, mkdir, mkdtemp, readdir, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);
const ROOT = resolve(import.meta.dirname, '../..');
const SOURCES = [
  'package.json',
  'package-lock.json',
  'tsconfig.json',
  'tsconfig.build.json',
  'bin',
  'proto',
  'coordinator',
  'cell-agent',
  'shared',
  'embedded',
  'cli',
];

const CONSUMER_JS = `
import { createLimiter } from 'cellquota';
import cellquota from 'cellquota/fastify';
import { rateLimit } from 'cellquota/express';
import Fastify from 'fastify';
const rules = { domain: 'd', descriptors: [{ key: 'remote_address', rate_limit: { unit: 'minute', requests_per_unit: 2 } }] };
const l = await createLimiter({ rules });
const one = () => l.check({ descriptors: [[{ key: 'remote_address', value: '192.0.2.1' }]] }).allowed;
const direct = [one(), one(), one()];
await l.close();
const app = Fastify();
await app.register(cellquota, { rules });
app.get('/', async () => 'ok');
const url = await app.listen({ port: 0, host: '127.0.0.1' });
const codes = [];
for (let i = 0; i < 3; i++) codes.push((await fetch(url)).status);
await app.close();
console.log(JSON.stringify({ direct, codes, express: typeof rateLimit({ rules }) }));
process.exit(0);
`;

const CONSUMER_TS = `
import { createLimiter, type LimitDecision, type Limiter } from 'cellquota';
import cellquota, { type CellquotaFastifyOptions } from 'cellquota/fastify';
import { rateLimit, type RateLimitMiddleware } from 'cellquota/express';
export async function f(): Promise<boolean> {
  const l: Limiter = await createLimiter({ rules: 'rules.yaml', trustedProxies: undefined } as never);
  const d: LimitDecision = l.check({ descriptors: [[{ key: 'k', value: 'v' }]], hits: 1 });
  const o: CellquotaFastifyOptions = { rules: 'rules.yaml', trustedProxies: ['10.0.0.0/8'], headers: 'both' };
  const m: RateLimitMiddleware = rateLimit({ rules: 'rules.yaml', ipv6Prefix: 56 });
  void cellquota; void o; void m;
  return d.allowed && d.retryAfterSeconds >= 0;
}
`;

void test('npm pack → npm install ./cellquota-*.tgz in a fresh app: the three entry points import and work, with types', async () => {
  const work = await mkdtemp(join(tmpdir(), 'cq-pack-'));
  try {
    const src = join(work, 'src');
    await mkdir(src);
    for (const name of SOURCES) await cp(join(ROOT, name), join(src, name), { recursive: true });
    await symlink(join(ROOT, 'node_modules'), join(src, 'node_modules'), 'dir');
    await writeFile(
      join(src, 'tsconfig.entry.json'),
      JSON.stringify({
        extends: './tsconfig.build.json',
        include: [],
        files: ['embedded/index.ts', 'embedded/fastify.ts', 'embedded/express.ts'],
      }),
    );
    await run(process.execPath, [join(ROOT, 'node_modules/typescript/bin/tsc'), '-p', 'tsconfig.entry.json'], {
      cwd: src,
    });
    await run('npm', ['pack', '--ignore-scripts', '--pack-destination', work, '--loglevel', 'error'], {
      cwd: src,
      maxBuffer: 16 << 20,
    });
    const tarball = (await readdir(work)).find((f) => /^cellquota-.*\.tgz$/.test(f));
    assert.ok(tarball !== undefined, 'npm pack wrote a tarball');

    const app = join(work, 'app');
    await mkdir(app);
    await writeFile(join(app, 'package.json'), JSON.stringify({ name: 'fresh-app', private: true, type: 'module' }));
    await run(
      'npm',
      ['install', `../${tarball}`, '--prefer-offline', '--no-audit', '--no-fund', '--loglevel', 'error'],
      { cwd: app, maxBuffer: 16 << 20 },
    );
    await writeFile(join(app, 'main.mjs'), CONSUMER_JS);
    const { stdout } = await run(process.execPath, ['main.mjs'], { cwd: app });
    assert.deepEqual(JSON.parse(stdout.trim().split('\n').pop() ?? ''), {
      direct: [true, true, false],
      codes: [200, 200, 429],
      express: 'function',
    });

    await writeFile(join(app, 'consumer.ts'), CONSUMER_TS);
    await writeFile(
      join(app, 'tsconfig.json'),
      JSON.stringify({
        compilerOptions: {
          module: 'NodeNext',
          moduleResolution: 'NodeNext',
          target: 'ES2022',
          strict: true,
          noEmit: true,
        },
      }),
    );
    await run(process.execPath, [join(ROOT, 'node_modules/typescript/bin/tsc'), '-p', '.'], { cwd: app }).catch(
      (e: { stdout?: string }) => {
        assert.fail(`the consumer does not type-check against the shipped .d.ts:\n${e.stdout ?? 'no output'}`);
      },
    );
  } finally {
    await rm(work, { recursive: true, force: true });
  }
});
