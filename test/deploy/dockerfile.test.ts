// deploy/Dockerfile: multi-stage; the runtime installs production dependencies without running
// package scripts (`prepare` would need TypeScript); it holds dist/, bin/, proto/ and package.json
// (dist/ is ESM through its "type": "module"); it runs as the non-root user the manifests expect;
// and every file it copies from the context gets past deploy/Dockerfile.dockerignore.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { deployDir, isWorkload, listFiles, overlayDirs, render, repoRoot } from './deploy-fixtures.js';

interface Instruction {
  readonly op: string;
  readonly args: string;
}

interface Stage {
  readonly from: string;
  readonly name: string | null;
  readonly instructions: Instruction[];
}

function parseDockerfile(text: string): Stage[] {
  const lines = text.split('\n').filter((l) => !/^\s*#/.test(l));
  const joined = lines.join('\n').replace(/\\\n/g, ' ');
  const stages: Stage[] = [];
  for (const line of joined
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l.length > 0)) {
    const m = /^([A-Z]+)\s+(.*)$/.exec(line);
    assert.ok(m !== null, `not a Dockerfile instruction: ${line}`);
    const op = m[1] ?? '';
    const args = (m[2] ?? '').trim();
    if (op === 'FROM') {
      const f = /^(\S+)(?:\s+AS\s+(\S+))?$/i.exec(args);
      assert.ok(f !== null, `FROM ${args}`);
      stages.push({ from: f[1] ?? '', name: f[2] ?? null, instructions: [] });
    } else {
      const current = stages.at(-1);
      assert.ok(current !== undefined, `${op} before FROM`);
      current.instructions.push({ op, args });
    }
  }
  return stages;
}

/** Docker's ignore semantics: last matching pattern wins, `!` re-includes, a path is excluded with its parents. */
function dockerignore(text: string): (path: string) => boolean {
  const rules = text
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l.length > 0 && !l.startsWith('#'))
    .map((l) => {
      const negate = l.startsWith('!');
      const pattern = (negate ? l.slice(1) : l).replace(/^\/+|\/+$/g, '');
      const re = new RegExp(
        `^${pattern
          .split('**')
          .map((part) =>
            part
              .replace(/[.+^${}()|[\]\\]/g, '\\$&')
              .replace(/\*/g, '[^/]*')
              .replace(/\?/g, '[^/]'),
          )
          .join('.*')}$`,
      );
      return { negate, re };
    });
  return (path: string): boolean => {
    const parts = path.split('/');
    const prefixes = parts.map((_, i) => parts.slice(0, i + 1).join('/'));
    let excluded = false;
    for (const r of rules) if (prefixes.some((p) => r.re.test(p))) excluded = !r.negate;
    return !excluded;
  };
}

const dockerfile = readFileSync(join(deployDir, 'Dockerfile'), 'utf8');
const stages = parseDockerfile(dockerfile);
const final = stages.at(-1) as Stage;
const runs = (s: Stage): string[] => s.instructions.filter((i) => i.op === 'RUN').map((i) => i.args);
const copies = (s: Stage): { from: string | null; src: string[]; dest: string }[] =>
  s.instructions
    .filter((i) => i.op === 'COPY')
    .map((i) => {
      const words = i.args.split(/\s+/);
      const from = words.find((w) => w.startsWith('--from='))?.slice('--from='.length) ?? null;
      const rest = words.filter((w) => !w.startsWith('--'));
      return { from, src: rest.slice(0, -1), dest: rest.at(-1) ?? '' };
    });

void test('Dockerfile: multi-stage on a pinned Node 20 image; the build stage runs npm ci and npm run build', () => {
  assert.ok(stages.length >= 2, 'multi-stage');
  for (const s of stages)
    assert.match(s.from, /^node:20[-.\w]*$/, `${s.from}: Node 20, a pinned tag (package.json engines: >=20)`);
  const build = stages.find((s) => runs(s).some((r) => r.includes('npm run build')));
  assert.ok(build !== undefined && build !== final, 'a build stage');
  assert.ok(
    runs(build).some((r) => /\bnpm ci\b/.test(r)),
    'npm ci in the build stage',
  );
  const pkg = JSON.parse(readFileSync(join(repoRoot, 'package.json'), 'utf8')) as { scripts: Record<string, string> };
  assert.match(
    pkg.scripts['prepare'] ?? '',
    /npm run build/,
    'prepare builds, hence --ignore-scripts where TypeScript is absent',
  );
  const tsBuild = JSON.parse(readFileSync(join(repoRoot, 'tsconfig.build.json'), 'utf8')) as { include: string[] };
  const copied = new Set(copies(build).flatMap((c) => c.src));
  for (const dir of tsBuild.include)
    assert.ok(copied.has(dir), `the build stage copies ${dir} (tsconfig.build.json include)`);
  for (const f of ['package.json', 'package-lock.json', 'tsconfig.json', 'tsconfig.build.json'])
    assert.ok(copied.has(f), `the build stage copies ${f}`);
});

void test('Dockerfile: the runtime gets production dependencies without package scripts, plus dist/, bin/, proto/ and package.json', () => {
  const install = stages.flatMap((s) => runs(s).filter((r) => /\bnpm ci\b/.test(r) && r.includes('--omit=dev')));
  assert.equal(install.length, 1, 'one production install');
  assert.ok(install[0]?.includes('--ignore-scripts'), '`prepare` (npm run build) needs TypeScript, a dev dependency');
  const finalCopies = copies(final);
  const dests = new Map(finalCopies.flatMap((c) => c.src.map((s) => [s.replace(/^\/(src|app)\//, ''), c] as const)));
  for (const need of ['dist', 'bin', 'proto', 'node_modules', 'package.json'])
    assert.ok(dests.has(need), `the runtime stage copies ${need}`);
  const distFrom = dests.get('dist')?.from;
  assert.ok(
    distFrom !== null &&
      distFrom !== undefined &&
      stages.some((s) => s.name === distFrom && runs(s).some((r) => r.includes('npm run build'))),
    'dist comes from the build stage',
  );
  const modulesFrom = dests.get('node_modules')?.from;
  assert.ok(
    modulesFrom !== null &&
      modulesFrom !== undefined &&
      stages.some((s) => s.name === modulesFrom && runs(s).some((r) => r.includes('--omit=dev'))),
    'node_modules comes from the production install',
  );
  assert.ok(!runs(final).some((r) => /\bnpm (ci|install)\b/.test(r)), 'no install in the runtime stage');
  const bin = readFileSync(join(repoRoot, 'bin/cellquota.mjs'), 'utf8');
  assert.match(bin, /\.\.\/dist\/cli\/main\.js/, 'bin/cellquota.mjs loads dist/');
  const tsconfig = JSON.parse(readFileSync(join(repoRoot, 'tsconfig.json'), 'utf8')) as {
    compilerOptions: { outDir: string };
  };
  assert.equal(tsconfig.compilerOptions.outDir, 'dist');
});

void test("Dockerfile: ENTRYPOINT node bin/cellquota.mjs, as a numeric non-root user that matches the manifests' runAsUser/runAsGroup", () => {
  const entry = final.instructions.filter((i) => i.op === 'ENTRYPOINT');
  assert.equal(entry.length, 1);
  assert.deepEqual(JSON.parse(entry[0]?.args ?? '') as unknown, ['node', 'bin/cellquota.mjs']);
  const user = final.instructions.filter((i) => i.op === 'USER').at(-1)?.args ?? '';
  const m = /^(\d+):(\d+)$/.exec(user);
  assert.ok(m !== null, `USER uid:gid, numeric (so the kubelet can verify runAsNonRoot), got '${user}'`);
  const [uid, gid] = [Number(m[1]), Number(m[2])];
  assert.ok(uid > 0 && gid > 0, 'not root');
  const workdir = final.instructions.filter((i) => i.op === 'WORKDIR').at(-1)?.args;
  assert.equal(workdir, '/app', 'the preStop hook runs `node bin/cellquota.mjs` relative to /app');
  for (const dir of overlayDirs()) {
    for (const w of render(dir).filter(isWorkload)) {
      const pod = w.spec.template.spec;
      if (!pod.containers.some((c) => c.image.replace(/:.*$/, '').endsWith('cellquota'))) continue;
      assert.equal(pod.securityContext?.runAsUser, uid, `${w.metadata.name}: runAsUser = the image's user`);
      assert.equal(pod.securityContext?.runAsGroup, gid, `${w.metadata.name}: runAsGroup = the image's group`);
    }
  }
});

void test('Dockerfile.dockerignore: every file the Dockerfile copies from the context is sent, and node_modules, dist and test data are not', () => {
  const sent = dockerignore(readFileSync(join(deployDir, 'Dockerfile.dockerignore'), 'utf8'));
  const sources = stages.flatMap((s) =>
    copies(s)
      .filter((c) => c.from === null)
      .flatMap((c) => c.src),
  );
  assert.ok(sources.length > 0);
  for (const src of sources) {
    const full = join(repoRoot, src);
    assert.ok(statSync(full, { throwIfNoEntry: false }) !== undefined, `COPY ${src}: missing from the repository`);
    const files = statSync(full).isDirectory()
      ? listFiles(full, (n) => n.endsWith('.ts') || n.endsWith('.proto') || n.endsWith('.mjs')).map((f) =>
          f.slice(repoRoot.length + 1),
        )
      : [src];
    assert.ok(files.length > 0, src);
    for (const f of files) assert.ok(sent(f), `${f} (COPY ${src}) is excluded by the .dockerignore`);
  }
  for (const notSent of [
    'node_modules/yaml/package.json',
    'dist/cli/main.js',
    'test/deploy/manifests.test.ts',
    'bench/results/x.json',
    '.git/HEAD',
    '.cellquota/n1/CURRENT',
    'cell-agent/node_modules/x.js',
  ]) {
    assert.ok(!sent(notSent), `${notSent} must stay out of the build context`);
  }
});
