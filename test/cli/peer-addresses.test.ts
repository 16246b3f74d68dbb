// A replica's admin URL or lease address derived from --peers: its peer host with this replica's
// port, and unknown where replicas share a host (the guess would name this replica's own port).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { guessPeerAddresses } from '../../cli/peer-addresses.js';

void test('replicas on hosts of their own: each one is its peer host with this port', () => {
  const peers = new Map([
    ['n1', '10.0.0.1:7001'],
    ['n2', '10.0.0.2:7001'],
    ['n3', '[fd00::3]:7001'],
  ]);
  const g = guessPeerAddresses(peers, 'n1', 8081);
  assert.deepEqual(g.ambiguous, []);
  assert.equal(g.addressOf('n1'), '10.0.0.1:8081');
  assert.equal(g.addressOf('n2'), '10.0.0.2:8081');
  assert.equal(g.addressOf('n3'), '[fd00::3]:8081');
  assert.equal(g.addressOf('n9'), null, 'not a replica');
  assert.equal(guessPeerAddresses(peers, 'n1', null).addressOf('n2'), null, 'no port for the service');
});

void test('replicas sharing a host (loopback): the others are unknown, never this replica’s own port', () => {
  const peers = new Map([
    ['n1', '127.0.0.1:7001'],
    ['n2', '127.0.0.1:7002'],
    ['n3', '10.0.0.3:7001'],
  ]);
  const fromN1 = guessPeerAddresses(peers, 'n1', 8081);
  assert.deepEqual(fromN1.ambiguous, ['n2']);
  assert.equal(fromN1.addressOf('n2'), null);
  assert.equal(fromN1.addressOf('n1'), '127.0.0.1:8081', 'this replica itself is known');
  assert.equal(fromN1.addressOf('n3'), '10.0.0.3:8081');
  assert.deepEqual(guessPeerAddresses(peers, 'n3', 8081).ambiguous, ['n1', 'n2']);
});
