// Mutual TLS between peers, with certificates generated at test time by `openssl` (skipped, with a
// message saying so, when openssl is not on the machine).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PeerTransport, type PeerTlsOptions } from '../../../coordinator/transport/peer-transport.js';
import { heartbeat, Inbox, seqOf, silentLogger } from './transport-test-util.js';
import { Rng } from '../../../testkit/random.js';
import { sleep, waitFor } from '../../../testkit/wait.js';

function opensslAvailable(): boolean {
  try {
    execFileSync('openssl', ['version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

const hasOpenssl = opensslAvailable();

/** A CA and leaf certificates (EC P-256, SAN 127.0.0.1 + localhost, server and client auth). */
function makePki(
  dir: string,
  caName: string,
  leaves: readonly string[],
): { ca: string; leaves: Map<string, PeerTlsOptions> } {
  const run = (...args: string[]): void => {
    execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' });
  };
  run('ecparam', '-name', 'prime256v1', '-genkey', '-noout', '-out', `${caName}.key`);
  run(
    'req',
    '-x509',
    '-new',
    '-key',
    `${caName}.key`,
    '-sha256',
    '-days',
    '1',
    '-subj',
    `/CN=${caName}`,
    '-addext',
    'basicConstraints=critical,CA:TRUE',
    '-addext',
    'keyUsage=critical,keyCertSign,cRLSign',
    '-out',
    `${caName}.pem`,
  );
  writeFileSync(
    join(dir, 'leaf.ext'),
    [
      'basicConstraints=CA:FALSE',
      'keyUsage=critical,digitalSignature',
      'extendedKeyUsage=serverAuth,clientAuth',
      'subjectAltName=IP:127.0.0.1,DNS:localhost',
      '',
    ].join('\n'),
  );
  const ca = readFileSync(join(dir, `${caName}.pem`), 'utf8');
  const out = new Map<string, PeerTlsOptions>();
  for (const leaf of leaves) {
    const name = `${caName}-${leaf}`;
    run('ecparam', '-name', 'prime256v1', '-genkey', '-noout', '-out', `${name}.key`);
    run('req', '-new', '-key', `${name}.key`, '-subj', `/CN=${leaf}`, '-out', `${name}.csr`);
    run(
      'x509',
      '-req',
      '-in',
      `${name}.csr`,
      '-CA',
      `${caName}.pem`,
      '-CAkey',
      `${caName}.key`,
      '-CAcreateserial',
      '-days',
      '1',
      '-sha256',
      '-extfile',
      'leaf.ext',
      '-out',
      `${name}.pem`,
    );
    out.set(leaf, {
      ca,
      cert: readFileSync(join(dir, `${name}.pem`), 'utf8'),
      key: readFileSync(join(dir, `${name}.key`)),
    });
  }
  return { ca, leaves: out };
}

void test(
  'mutual TLS: peers with certificates from the cluster CA talk; others are kept out',
  {
    skip: hasOpenssl ? false : 'openssl is not on PATH: cannot generate certificates, mutual TLS test skipped',
  },
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'cellquota-peer-tls-'));
    const started: PeerTransport[] = [];
    try {
      const good = makePki(dir, 'cluster-ca', ['n1', 'n2']);
      const rogue = makePki(dir, 'rogue-ca', ['n3']);
      const tls = (pki: typeof good, leaf: string): PeerTlsOptions => {
        const t = pki.leaves.get(leaf);
        assert.ok(t !== undefined);
        return t;
      };

      const inbox1 = new Inbox();
      const inbox2 = new Inbox();
      const n1 = new PeerTransport({
        selfId: 'n1',
        clusterId: 'test-cluster',
        listen: '127.0.0.1:0',
        peers: new Map(),
        onMessages: inbox1.onMessages,
        logger: silentLogger(),
        tls: tls(good, 'n1'),
        random: new Rng(1).asRandom(),
      });
      const n2 = new PeerTransport({
        selfId: 'n2',
        clusterId: 'test-cluster',
        listen: '127.0.0.1:0',
        peers: new Map(),
        onMessages: inbox2.onMessages,
        logger: silentLogger(),
        tls: tls(good, 'n2'),
        random: new Rng(2).asRandom(),
      });
      started.push(n1, n2);
      const p1 = (await n1.start()).port;
      const p2 = (await n2.start()).port;
      const peers = new Map([
        ['n1', `127.0.0.1:${p1}`],
        ['n2', `127.0.0.1:${p2}`],
      ]);
      n1.setPeers(peers);
      n2.setPeers(peers);

      n1.send([heartbeat('n1', 'n2', 1)]);
      n2.send([heartbeat('n2', 'n1', 1)]);
      await waitFor('messages over mutual TLS', () => inbox1.count() === 1 && inbox2.count() === 1, {
        timeoutMs: 8000,
        everyMs: 10,
      });
      assert.deepEqual(inbox2.from('n1').map(seqOf), [1]);
      assert.equal(n1.stats().peers['n2']?.connected, true);

      // A node that trusts the cluster CA (so it accepts n1's server certificate) but presents a client
      // certificate from another CA, and one speaking plaintext: neither gets in.
      const intruder = new PeerTransport({
        selfId: 'n3',
        clusterId: 'test-cluster',
        listen: '127.0.0.1:0',
        peers: new Map([['n1', `127.0.0.1:${p1}`]]),
        onMessages: () => {},
        logger: silentLogger(),
        tls: { ...tls(rogue, 'n3'), ca: good.ca },
        random: new Rng(3).asRandom(),
      });
      const plaintext = new PeerTransport({
        selfId: 'n4',
        clusterId: 'test-cluster',
        listen: '127.0.0.1:0',
        peers: new Map([['n1', `127.0.0.1:${p1}`]]),
        onMessages: () => {},
        logger: silentLogger(),
        random: new Rng(4).asRandom(),
      });
      started.push(intruder, plaintext);
      await intruder.start();
      await plaintext.start();
      intruder.send([heartbeat('n3', 'n1', 9)]);
      plaintext.send([heartbeat('n4', 'n1', 9)]);
      await waitFor(
        'intruders retrying',
        () =>
          (intruder.stats().peers['n1']?.reconnects ?? 0) >= 2 && (plaintext.stats().peers['n1']?.reconnects ?? 0) >= 2,
        { timeoutMs: 8000, everyMs: 10 },
      );
      await sleep(50);
      assert.equal(intruder.stats().peers['n1']?.connected, false);
      assert.equal(plaintext.stats().peers['n1']?.connected, false);
      assert.equal(inbox1.count(), 1, 'nothing from the intruders');
    } finally {
      await Promise.all(started.map((t) => t.stop()));
      rmSync(dir, { recursive: true, force: true });
    }
  },
);
