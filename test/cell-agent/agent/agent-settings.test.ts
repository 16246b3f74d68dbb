// The agent's settings read in their own thread (agent-settings.ts: zod lives and dies there) give
// what they give in this thread: the same config, the same trusted proxies, the same errors.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError } from '../../../shared/cli-config.js';
import { loadAgentSettings } from '../../../cell-agent/agent-settings.js';
import { tempDir } from '../../../testkit/temp-dir.js';

const RULES = 'domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n';

void test('settings read in a thread of their own: the same config and errors as in this thread', async () => {
  const dir = tempDir();
  try {
    const rules = dir.file('rules.yaml', RULES);
    const config = dir.file('agent.yaml', 'workers: 2\nsocket-owner: "101:102"\n');
    const argv = ['--cell', 'eu-1', '--rules', rules, '--rls-listen', '127.0.0.1:0', '--config', config];
    const env = { CELLQUOTA_TRUSTED_PROXIES: '10.0.0.0/8,loopback', CELLQUOTA_HTTP: '9091' };
    const inThread = await loadAgentSettings('cellquota agent', argv, env, { thread: true });
    const here = await loadAgentSettings('cellquota agent', argv, env, { thread: false });
    const { trustedProxies: threadProxies, ...threadRest } = inThread;
    const { trustedProxies: hereProxies, ...hereRest } = here;
    assert.deepEqual(threadRest, hereRest);
    assert.equal(inThread.workers, 2);
    assert.deepEqual(inThread.socketOwner, { uid: 101, gid: 102 });
    assert.deepEqual(inThread.http, { host: '127.0.0.1', port: 9091 });
    assert.deepEqual(threadProxies.entries, hereProxies.entries);
    for (const address of ['10.1.2.3', '127.0.0.1', '::1', '192.168.0.1', 'not-an-ip'])
      assert.equal(threadProxies.has(address), hereProxies.has(address), address);
    assert.equal(threadProxies.has('10.1.2.3'), true);

    const bad = ['--cell', 'eu-1', '--rules', rules, '--rls-socket', '/tmp/x.sock', '--workers', 'many'];
    const errors = await Promise.all(
      [true, false].map((thread) =>
        loadAgentSettings('cellquota agent', bad, {}, { thread }).then(
          () => assert.fail('bad settings were accepted'),
          (error: unknown) => error,
        ),
      ),
    );
    for (const error of errors) {
      assert.ok(error instanceof ConfigError);
      assert.match(error.message, /--workers/);
    }
    assert.equal((errors[0] as Error).message, (errors[1] as Error).message);
  } finally {
    dir.remove();
  }
});

void test('a settings thread that gives no answer in time fails the start with an error saying so', async () => {
  const dir = tempDir();
  try {
    const argv = ['--cell', 'eu-1', '--rules', dir.file('rules.yaml', RULES), '--rls-listen', '127.0.0.1:0'];
    // No thread boots and answers before a timer of 0 ms fires: the deadline passes first.
    await assert.rejects(
      loadAgentSettings('cellquota agent', argv, {}, { thread: true, deadlineMs: 0 }),
      (error: unknown) => {
        assert.ok(!(error instanceof ConfigError));
        assert.equal((error as Error).message, 'cellquota agent: the settings thread gave no answer within 0 ms');
        return true;
      },
    );
    // The same settings with the default deadline: answered.
    const config = await loadAgentSettings('cellquota agent', argv, {}, { thread: true });
    assert.equal(config.cell, 'eu-1');
  } finally {
    dir.remove();
  }
});
