// `cellquota agent` as a command: settings validation (exit 2), --help, and a real process that
// prints its endpoints, serves, reports that its quotas come from the coordinators, and stops cleanly on SIGTERM.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseAgentConfig } from '../../../cell-agent/agent-config.js';
import { runAgentCommand } from '../../../cell-agent/agent-cli.js';
import { RlsClient, d, unixTarget } from '../../../testkit/rls-client.js';
import { waitFor } from '../../../testkit/wait.js';
import { tempDir } from '../../../testkit/temp-dir.js';

const RULES = 'domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n';

/** A rules directory for domain api: RULES (key k, 1 an hour) in a.yaml, then one file per key given. */
function domainFiles(dir: ReturnType<typeof tempDir>, name: string, keys: readonly string[]): string {
  mkdirSync(join(dir.path, name));
  dir.file(`${name}/a.yaml`, RULES);
  keys.forEach((key, i) =>
    dir.file(
      `${name}/${String.fromCharCode(98 + i)}.yaml`,
      `domain: api\ndescriptors:\n  - key: ${key}\n    rate_limit: {unit: hour, requests_per_unit: 2}\n`,
    ),
  );
  return join(dir.path, name);
}

function io(): { out: string[]; err: string[]; io: Parameters<typeof runAgentCommand>[2] } {
  const out: string[] = [];
  const err: string[] = [];
  return {
    out,
    err,
    io: {
      stdout: { write: (t: string) => out.push(t) },
      stderr: { write: (t: string) => err.push(t) },
      signals: process,
    },
  };
}

void test('bad settings exit 2 with the setting and its source named', async () => {
  const dir = tempDir();
  try {
    const rules = dir.file('rules.yaml', RULES);
    const cases: [string[], NodeJS.ProcessEnv, RegExp][] = [
      [['--rules', rules, '--rls-socket', '/tmp/x.sock'], {}, /cell: required/],
      [['--cell', 'c', '--rules', rules], {}, /nothing to serve/],
      [['--cell', 'c', '--rules', rules, '--http', 'nohost'], {}, /--http: 'nohost' is not HOST:PORT/],
      [['--cell', 'c', '--rules', rules, '--http', '127.0.0.1:0'], { CELLQUOTA_WORKERS: '-1' }, /CELLQUOTA_WORKERS/],
      [
        ['--cell', 'c', '--rules', rules, '--rls-socket', '/tmp/x.sock', '--workers', '0'],
        {},
        /--workers 0 serves no RLS/,
      ],
      [
        ['--cell', 'c', '--rules', rules, '--rls-socket', '/tmp/x.sock', '--forward-auth-socket', '/tmp/fa.sock'],
        {},
        /--forward-auth-socket serves beside the HTTP API: give --http too/,
      ],
      [
        ['--cell', 'c', '--rules', rules, '--http', '127.0.0.1:0', '--trusted-proxies', '10.0.0.0/8,10.1.2.3/40'],
        {},
        /--trusted-proxies: bad trusted proxy "10.1.2.3\/40": prefix length/,
      ],
      [
        ['--cell', 'c', '--rules', rules, '--http', '127.0.0.1:0', '--forward-auth-deny-status', '500'],
        {},
        /--forward-auth-deny-status: '500' is not one of 429, 401, 403/,
      ],
      [
        [
          '--cell',
          'c',
          '--rules',
          rules,
          '--http',
          '127.0.0.1:0',
          '--routes',
          dir.file('routes.yaml', 'routes: [{rate_limits: [{actions: [{remote_adress: {}}]}]}]\n'),
        ],
        {},
        /routes\.yaml:1:\d+: routes\.0\.rate_limits\.0\.actions\.0: unknown action 'remote_adress'/,
      ],
      [
        ['--cell', 'c', '--rules', rules, '--http', '127.0.0.1:0', '--coordinators', '10.0.0.1:7001,bad'],
        {},
        /--coordinators: 'bad' is not HOST:PORT/,
      ],
      [
        ['--cell', 'c', '--rules', rules, '--http', '127.0.0.1:0', '--unknown-tenant', 'maybe'],
        {},
        /--unknown-tenant: 'maybe' is not deny, allow or tier:NAME/,
      ],
      [['--cell', 'c', '--rules', rules, '--http', '127.0.0.1:0', '--static-share', '1.5'], {}, /--static-share/],
      [
        ['--cell', 'c', '--rules', rules, '--http', '127.0.0.1:0', '--socket-mode', '999'],
        {},
        /--socket-mode: '999' is not an octal mode/,
      ],
      [['--cell', 'c', '--rules', rules, '--http', '127.0.0.1:0', '--bogus', '1'], {}, /unknown flag --bogus/],
      [
        [
          '--cell',
          'c',
          '--rules',
          dir.file(
            'bad.yaml',
            'domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n',
          ),
          '--http',
          '127.0.0.1:0',
        ],
        {},
        /invalid rate limit unit 'fortnight'/,
      ],
      [
        [
          '--cell',
          'c',
          '--rules',
          rules,
          '--http',
          '127.0.0.1:0',
          '--tenants',
          dir.file('t.yaml', 'tenants: {a: gold}\n'),
        ],
        {},
        /unknown tier 'gold'/,
      ],
      // Two files of one domain: refused unless --merge-domains; merged, a key in both is still an error.
      [
        ['--cell', 'c', '--rules', domainFiles(dir, 'split', ['m']), '--http', '127.0.0.1:0'],
        {},
        /b.yaml:1:9: duplicate domain 'api' in config file/,
      ],
      [
        ['--cell', 'c', '--rules', domainFiles(dir, 'clash', ['j', 'j']), '--http', '127.0.0.1:0', '--merge-domains'],
        {},
        /c\.yaml:3:5: duplicate descriptor composite key 'api\.j'/,
      ],
      [
        ['--cell', 'c', '--rules', rules, '--http', '127.0.0.1:0', '--unknown-tenant', 'tier:gold'],
        {},
        /names tier 'gold'/,
      ],
      // With coordinators they hold every quota: a file or share beside them could only disagree.
      [
        [
          '--cell',
          'c',
          '--rules',
          rules,
          '--http',
          '127.0.0.1:0',
          '--coordinators',
          '127.0.0.1:7001',
          '--tenants',
          dir.file('t2.yaml', 'tiers: {gold: {rate: 1, burst: 1}}\n'),
        ],
        {},
        /--tenants: not with --coordinators/,
      ],
      [
        [
          '--cell',
          'c',
          '--rules',
          rules,
          '--http',
          '127.0.0.1:0',
          '--coordinators',
          '127.0.0.1:7001',
          '--static-share',
          '0.5',
        ],
        {},
        /--static-share: not with --coordinators/,
      ],
      [
        ['--cell', 'c', '--rules', rules, '--http', '127.0.0.1:0', '--coordinators', '127.0.0.1:7001'],
        { CELLQUOTA_UNKNOWN_TENANT: 'allow' },
        /CELLQUOTA_UNKNOWN_TENANT|--unknown-tenant: not with --coordinators/,
      ],
    ];
    for (const [argv, env, message] of cases) {
      const t = io();
      assert.equal(await runAgentCommand(argv, env, t.io), 2, argv.join(' '));
      assert.match(t.err.join(''), message);
    }
    const help = io();
    assert.equal(await runAgentCommand(['--help'], {}, help.io), 0);
    assert.match(help.out.join(''), /--rls-socket\s+Unix socket for the RLS gRPC server.*\[CELLQUOTA_RLS_SOCKET\]/);
  } finally {
    dir.remove();
  }
});

void test('settings: defaults, typed values and strings parse alike', () => {
  const c = parseAgentConfig({
    cell: 'eu-west',
    rules: 'r.yaml',
    rlsSocket: '/run/rl.sock',
    rlsListen: '127.0.0.1:8089',
    workers: '3',
    socketMode: '0640',
    socketOwner: '1000:1001',
    unknownTenant: 'tier:bronze',
    staticShare: '0.34',
    responseHeaders: 'true',
  });
  assert.deepEqual(c.rlsListen, { host: '127.0.0.1', port: 8089 });
  const leased = parseAgentConfig({
    cell: 'eu-west',
    rules: 'r.yaml',
    rlsSocket: '/run/rl.sock',
    coordinators: '10.0.0.1:7001, 10.0.0.2:7001',
  });
  assert.deepEqual(leased.coordinators, [
    { host: '10.0.0.1', port: 7001 },
    { host: '10.0.0.2', port: 7001 },
  ]);
  const byId = parseAgentConfig({
    cell: 'eu-west',
    rules: 'r.yaml',
    rlsSocket: '/run/rl.sock',
    coordinators: 'n1=10.0.0.1:7001,n2=lb-n2.example:443',
  });
  assert.deepEqual(
    byId.coordinators,
    [
      { host: '10.0.0.1', port: 7001, id: 'n1' },
      { host: 'lb-n2.example', port: 443, id: 'n2' },
    ],
    'ID=HOST:PORT keeps the replica id',
  );
  assert.throws(
    () =>
      parseAgentConfig({
        cell: 'eu-west',
        rules: 'r.yaml',
        rlsSocket: '/run/rl.sock',
        coordinators: 'n1=10.0.0.1:7001,n1=10.0.0.2:7001',
      }),
    /replica id 'n1' is listed twice/,
  );
  assert.throws(
    () =>
      parseAgentConfig({
        cell: 'eu-west',
        rules: 'r.yaml',
        rlsSocket: '/run/rl.sock',
        coordinators: 'N 1=10.0.0.1:7001',
      }),
    /replica id before '=' must be lowercase/,
  );
  assert.equal(c.workers, 3);
  assert.equal(c.socketMode, 0o640);
  assert.deepEqual(c.socketOwner, { uid: 1000, gid: 1001 });
  assert.deepEqual(c.unknownTenant, { kind: 'tier', tier: 'bronze' });
  assert.equal(c.staticShare, 0.34);
  assert.equal(c.responseHeaders, true);
  assert.equal(c.logLevel, 'info');
  assert.equal(c.tableFull, 'open');
  assert.throws(
    () => parseAgentConfig({ cell: 'x', rules: 'r', rlsListen: '127.0.0.1:65535', workers: 2 }),
    /exceed 65535/,
  );
});

void test('a real agent process: endpoints printed, serving, quota source logged, clean stop on SIGTERM', async () => {
  const dir = tempDir();
  const socket = join(dir.path, 'rls.sock');
  const cli = fileURLToPath(new URL('../../../cell-agent/agent-cli.ts', import.meta.url));
  const child = spawn(
    process.execPath,
    [
      '--import',
      'tsx',
      cli,
      '--cell',
      'proc',
      '--rules',
      dir.file('rules.yaml', RULES),
      '--rls-socket',
      socket,
      '--http',
      '127.0.0.1:0',
      '--coordinators',
      '127.0.0.1:7001,127.0.0.1:7002',
      '--table-capacity',
      '1000',
      '--lag-threshold-ms',
      '0',
    ],
    {
      cwd: fileURLToPath(new URL('../../..', import.meta.url)),
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, CELLQUOTA_LOG_LEVEL: 'info' },
    },
  );
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (b: Buffer) => {
    stdout += b.toString();
  });
  child.stderr.on('data', (b: Buffer) => {
    stderr += b.toString();
  });
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  try {
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`no endpoints printed; stdout: ${stdout} stderr: ${stderr}`)),
        30_000,
      );
      const poll = setInterval(() => {
        // The endpoints and the start-up log line (pino writes asynchronously: either may come first).
        if (
          (stdout.includes('http  ') || /http\s+http:\/\//.test(stdout)) &&
          stdout.includes('"msg":"cell agent started')
        ) {
          clearInterval(poll);
          clearTimeout(timer);
          resolve();
        }
      }, 20);
      void exited.then(() => {
        clearInterval(poll);
        clearTimeout(timer);
        reject(new Error(`exited early; stdout: ${stdout} stderr: ${stderr}`));
      });
    });
    assert.match(stdout, new RegExp(`rls unix\\s+${socket.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}`));
    assert.match(
      stdout,
      /tiers, tenants and floors come from the coordinator leader: a global key is refused until its first grant/,
    );
    const started = stdout
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as Record<string, unknown>)
      .find((l) => typeof l['msg'] === 'string' && l['msg'].startsWith('cell agent started'));
    assert.ok(started !== undefined, 'a start-up log line');
    assert.match(String(started['msg']), /tiers, tenants and floors come from the coordinator leader/);
    assert.deepEqual(started['coordinators'], ['127.0.0.1:7001', '127.0.0.1:7002']);
    assert.equal(started['staticShare'], undefined, 'no static share with coordinators');
    assert.equal(started['cell'], 'proc');
    const client = new RlsClient(unixTarget(socket));
    try {
      assert.equal((await client.check({ domain: 'api', descriptors: [d(['k', 'v'])] })).overall_code, 'OK');
      assert.equal((await client.check({ domain: 'api', descriptors: [d(['k', 'v'])] })).overall_code, 'OVER_LIMIT');
    } finally {
      client.close();
    }
    child.kill('SIGTERM');
    assert.equal(await exited, 0, `exit code; stderr: ${stderr}`);
    assert.equal(existsSync(socket), false, 'the socket is removed');
    assert.match(stdout, /cell agent stopped/);
  } finally {
    if (child.exitCode === null) child.kill('SIGKILL');
    dir.remove();
  }
});

void test('--merge-domains (here CELLQUOTA_MERGE_DOMAINS): two files of one domain are one domain, in the workers too', async () => {
  const dir = tempDir();
  const socket = join(dir.path, 'rls.sock');
  const cli = fileURLToPath(new URL('../../../cell-agent/agent-cli.ts', import.meta.url));
  const child = spawn(
    process.execPath,
    [
      '--import',
      'tsx',
      cli,
      '--cell',
      'merge',
      '--rules',
      domainFiles(dir, 'rules', ['m']),
      '--rls-socket',
      socket,
      '--workers',
      '1',
      '--table-capacity',
      '1000',
    ],
    {
      cwd: fileURLToPath(new URL('../../..', import.meta.url)),
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, CELLQUOTA_MERGE_DOMAINS: 'true', CELLQUOTA_LOG_LEVEL: 'warn' },
    },
  );
  let output = '';
  child.stdout.on('data', (b: Buffer) => {
    output += b.toString();
  });
  child.stderr.on('data', (b: Buffer) => {
    output += b.toString();
  });
  const client = new RlsClient(unixTarget(socket));
  try {
    // Served once the socket answers; a rule from each file: k (1 an hour, a.yaml) and m (2 an hour, b.yaml).
    await waitFor(
      'the agent to answer on its socket',
      async () =>
        existsSync(socket)
          ? (await client.check({ domain: 'api', descriptors: [d(['k', 'v'])] })).overall_code
          : undefined,
      { timeoutMs: 30_000 },
    );
    assert.equal(
      (await client.check({ domain: 'api', descriptors: [d(['k', 'v'])] })).overall_code,
      'OVER_LIMIT',
      `k from a.yaml; ${output}`,
    );
    const m = [];
    for (let i = 0; i < 3; i++)
      m.push((await client.check({ domain: 'api', descriptors: [d(['m', 'v'])] })).overall_code);
    assert.deepEqual(m, ['OK', 'OK', 'OVER_LIMIT'], `m from b.yaml; ${output}`);
  } finally {
    client.close();
    child.kill('SIGTERM');
    if (child.exitCode === null) await new Promise((r) => child.once('exit', r));
    dir.remove();
  }
});
