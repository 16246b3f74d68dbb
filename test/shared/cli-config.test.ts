import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { z } from 'zod';
import { ConfigError, loadSettings, parseHostPort, settingsHelp, type SettingSpec } from '../../shared/cli-config.js';

const specs: SettingSpec[] = [
  { flag: 'id', description: 'node id' },
  { flag: 'data-dir', description: 'data directory' },
  { flag: 'tick-ms', description: 'tick interval' },
  { flag: 'verbose', description: 'more logs', boolean: true },
];
const schema = z.object({
  id: z.string().regex(/^[a-z0-9-]+$/, 'lowercase letters, digits and dashes'),
  dataDir: z.string().default('./data'),
  tickMs: z.coerce.number().int().min(1).max(1000).default(50),
  verbose: z.boolean().default(false),
});

void test('flags beat environment variables, which beat the config file; defaults fill the rest', () => {
  const dir = mkdtempSync(join(tmpdir(), 'cq-cfg-'));
  try {
    const file = join(dir, 'c.yaml');
    writeFileSync(file, 'id: from-file\ndata-dir: /file\ntick-ms: 20\n');
    const s = loadSettings(
      'cellquota coordinator',
      specs,
      schema,
      ['--config', file, '--id', 'from-flag', '--verbose'],
      { CELLQUOTA_DATA_DIR: '/env' },
    );
    assert.deepEqual(s, { id: 'from-flag', dataDir: '/env', tickMs: 20, verbose: true });
    const d = loadSettings('x', specs, schema, ['--id=n1'], {});
    assert.deepEqual(d, { id: 'n1', dataDir: './data', tickMs: 50, verbose: false });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

void test('a bad value names the setting and where it came from', () => {
  assert.throws(
    () => loadSettings('cellquota coordinator', specs, schema, ['--id', 'N1!'], {}),
    (e: unknown) => e instanceof ConfigError && e.exitCode === 2 && /--id: lowercase letters/.test(e.message),
  );
  assert.throws(
    () => loadSettings('cellquota coordinator', specs, schema, ['--id', 'n1'], { CELLQUOTA_TICK_MS: '0' }),
    (e: unknown) => e instanceof ConfigError && /CELLQUOTA_TICK_MS/.test(e.message),
  );
  assert.throws(() => loadSettings('c', specs, schema, ['--nope', '1'], {}), /unknown flag --nope/);
  assert.throws(() => loadSettings('c', specs, schema, ['--id'], {}), /--id needs a value/);
  assert.throws(() => loadSettings('c', specs, schema, ['--config', '/does/not/exist'], {}), /cannot read config file/);
});

void test('help lists every flag with its variable; host:port parsing', () => {
  assert.match(settingsHelp(specs), /--data-dir\s+data directory \[CELLQUOTA_DATA_DIR\]/);
  assert.deepEqual(parseHostPort('127.0.0.1:7001'), { host: '127.0.0.1', port: 7001 });
  assert.deepEqual(parseHostPort('[::1]:80'), { host: '::1', port: 80 });
  assert.equal(parseHostPort('nohost'), null);
  assert.equal(parseHostPort('h:70000'), null);
});
