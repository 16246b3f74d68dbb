import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { BlockList, isIPv6 } from 'node:net';
import {
  AddressListError,
  UNKNOWN_CLIENT,
  clientAddress,
  parseAddressList,
  parseTrustedProxies,
} from '../../shared/client-address.js';

const trusted = parseTrustedProxies(['10.0.0.0/8', '127.0.0.1', '2001:db8:ffff::/48']);
const none = parseTrustedProxies([]);

void test('an untrusted peer is the client, whatever the headers say', () => {
  assert.equal(
    clientAddress({ peer: '203.0.113.7', forwardedFor: '1.1.1.1', realIp: '2.2.2.2', trusted }),
    '203.0.113.7',
  );
  assert.equal(clientAddress({ peer: '10.1.2.3', forwardedFor: '1.1.1.1', trusted: none }), '10.1.2.3');
});

void test('behind a trusted proxy: the rightmost untrusted X-Forwarded-For entry', () => {
  assert.equal(clientAddress({ peer: '10.0.0.5', forwardedFor: '198.51.100.9', trusted }), '198.51.100.9');
  // the client prepended a forged entry; the proxy appended the real one
  assert.equal(clientAddress({ peer: '10.0.0.5', forwardedFor: '1.2.3.4, 198.51.100.9', trusted }), '198.51.100.9');
  // two trusted hops, then the client
  assert.equal(
    clientAddress({ peer: '127.0.0.1', forwardedFor: '6.6.6.6,198.51.100.9, 10.9.9.9', trusted }),
    '198.51.100.9',
  );
  // several header lines are one list
  assert.equal(
    clientAddress({ peer: '127.0.0.1', forwardedFor: ['6.6.6.6', '198.51.100.9, 10.0.0.1'], trusted }),
    '198.51.100.9',
  );
  // every hop trusted: the leftmost
  assert.equal(clientAddress({ peer: '127.0.0.1', forwardedFor: '10.0.0.2, 10.0.0.1', trusted }), '10.0.0.2');
});

void test('X-Real-IP only when the peer is trusted and there is no X-Forwarded-For', () => {
  assert.equal(clientAddress({ peer: '10.0.0.5', realIp: '198.51.100.1', trusted }), '198.51.100.1');
  assert.equal(
    clientAddress({ peer: '10.0.0.5', forwardedFor: '198.51.100.2', realIp: '198.51.100.1', trusted }),
    '198.51.100.2',
  );
  assert.equal(clientAddress({ peer: '10.0.0.5', realIp: 'evil', trusted }), '10.0.0.5');
  assert.equal(clientAddress({ peer: '10.0.0.5', realIp: '1.1.1.1, 2.2.2.2', trusted }), '10.0.0.5');
  assert.equal(clientAddress({ peer: '10.0.0.5', trusted }), '10.0.0.5');
});

void test('malformed entries stop the walk at the last trusted hop, never an attacker-chosen key', () => {
  assert.equal(clientAddress({ peer: '10.0.0.5', forwardedFor: 'not-an-ip', trusted }), '10.0.0.5');
  assert.equal(
    clientAddress({ peer: '10.0.0.5', forwardedFor: '198.51.100.9, 10.0.0.7, garbage', trusted }),
    '10.0.0.5',
  );
  assert.equal(clientAddress({ peer: '10.0.0.5', forwardedFor: 'garbage, 10.0.0.7', trusted }), '10.0.0.7');
  assert.equal(clientAddress({ peer: '10.0.0.5', forwardedFor: '198.51.100.9,,', trusted }), '10.0.0.5');
  // non-canonical IPv4 forms would give one address several keys: refused
  for (const odd of ['127.1', '0x7f.0.0.1', '0177.0.0.1', '3232235777', '1.2.3.4.5', '1.2.3.256'])
    assert.equal(clientAddress({ peer: '10.0.0.5', forwardedFor: odd, trusted }), '10.0.0.5', odd);
  assert.equal(clientAddress({ peer: undefined, forwardedFor: '1.1.1.1', trusted }), UNKNOWN_CLIENT);
  assert.equal(clientAddress({ peer: 'garbage', trusted }), UNKNOWN_CLIENT);
});

void test('ports and brackets as some proxies write them', () => {
  assert.equal(clientAddress({ peer: '10.0.0.5', forwardedFor: '198.51.100.9:4711', trusted }), '198.51.100.9');
  assert.equal(
    clientAddress({ peer: '10.0.0.5', forwardedFor: '[2001:db8:1:2::9]:443', trusted }),
    '2001:db8:1:2::/64',
  );
  assert.equal(clientAddress({ peer: '10.0.0.5', forwardedFor: '[2001:db8:1:2::9]', trusted }), '2001:db8:1:2::/64');
  assert.equal(clientAddress({ peer: '10.0.0.5', forwardedFor: '198.51.100.9:port', trusted }), '10.0.0.5');
});

void test('IPv6 grouped by /64 by default; IPv4-mapped IPv6 is IPv4', () => {
  assert.equal(clientAddress({ peer: '2001:db8:1:2:aaaa::1', trusted }), '2001:db8:1:2::/64');
  assert.equal(clientAddress({ peer: '2001:DB8:1:2:bbbb::2', trusted }), '2001:db8:1:2::/64');
  assert.equal(clientAddress({ peer: '2001:db8:1:2:aaaa::1', trusted, ipv6Prefix: 128 }), '2001:db8:1:2:aaaa::1');
  assert.equal(clientAddress({ peer: '2001:db8:1:2:aaaa::1', trusted, ipv6Prefix: 48 }), '2001:db8:1::/48');
  assert.equal(clientAddress({ peer: '::ffff:203.0.113.7', trusted }), '203.0.113.7');
  // a mapped peer matches an IPv4 trusted range
  assert.equal(clientAddress({ peer: '::ffff:10.0.0.5', forwardedFor: '198.51.100.9', trusted }), '198.51.100.9');
  assert.equal(
    clientAddress({ peer: '2001:db8:ffff:1::1', forwardedFor: '::ffff:198.51.100.9', trusted }),
    '198.51.100.9',
  );
  assert.equal(clientAddress({ peer: 'fe80::1%eth0', trusted }), 'fe80::/64');
  assert.throws(() => clientAddress({ peer: '1.2.3.4', trusted, ipv6Prefix: 129 }), RangeError);
});

void test('address lists: CIDRs, single addresses, names; a bad entry is named', () => {
  const set = parseAddressList(['192.168.0.0/16', '::1', 'linklocal', '::ffff:172.16.0.0/108'], 'exempt');
  assert.equal(set.has('192.168.44.1'), true);
  assert.equal(set.has('::ffff:192.168.44.1'), true);
  assert.equal(set.has('::1'), true);
  assert.equal(set.has('169.254.1.1'), true);
  assert.equal(set.has('172.16.3.3'), true);
  assert.equal(set.has('172.32.0.1'), false);
  assert.equal(set.has('nonsense'), false);
  assert.deepEqual(set.entries, ['192.168.0.0/16', '::1', 'linklocal', '::ffff:172.16.0.0/108']);
  assert.equal(parseTrustedProxies(['loopback']).has('127.9.9.9'), true);
  assert.equal(parseTrustedProxies(['private']).has('fd00::1'), true);
  for (const [bad, why] of [
    ['10.0.0.0/33', /prefix length must be 0..32/],
    ['10.0.0.1/x', /prefix/],
    ['example.com', /not an IPv4 or IPv6/],
    ['', /empty/],
    ['::ffff:1.0.0.0/64', /at least 96/],
    ['10.0.0.0/8/8', /prefix/],
  ] as const) {
    assert.throws(
      () => parseTrustedProxies(['127.0.0.1', bad]),
      (e: unknown) =>
        e instanceof AddressListError && e.entry === bad && why.test(e.message) && e.message.includes(`"${bad}"`),
      bad,
    );
  }
  assert.throws(() => clientAddress({ peer: '1.2.3.4', trusted: { entries: [], has: () => true } }), TypeError);
});

const v4 = fc.tuple(fc.nat(255), fc.nat(255), fc.nat(255), fc.nat(255)).map((o) => o.join('.'));
const junk = fc.oneof(v4, fc.string({ maxLength: 20 }), fc.constant('10.0.0.1'), fc.constant('::ffff:10.0.0.3'));

void test('property: whatever a client prepends, the key is what the trusted proxy appended', () => {
  fc.assert(
    fc.property(fc.array(junk, { maxLength: 10 }), v4, (forged, real) => {
      fc.pre(!trusted.has(real));
      const xff = [...forged, real, '10.0.0.9'].join(', ');
      return clientAddress({ peer: '127.0.0.1', forwardedFor: xff, trusted }) === real;
    }),
  );
});

/** Whether `key` is the /64 group (the default IPv6 grouping) of one of the IPv6 addresses in `hops`. */
function groupOfAnIpv6Hop(key: string, hops: readonly string[]): boolean {
  if (!key.endsWith('/64') || !isIPv6(key.slice(0, -3))) return false;
  const group = new BlockList();
  group.addSubnet(key.slice(0, -3), 64, 'ipv6');
  return hops.some((h) => isIPv6(h.trim()) && group.check(h.trim(), 'ipv6'));
}

void test('property: the key is the peer, a trusted hop, or a well-formed untrusted address from the header', () => {
  fc.assert(
    fc.property(fc.array(junk, { maxLength: 8 }), (hops) => {
      const xff = hops.join(',');
      const key = clientAddress({ peer: '10.0.0.5', forwardedFor: xff, trusted });
      const candidates = new Set(['10.0.0.5', ...hops.map((h) => h.trim().replace(/^::ffff:/, ''))]);
      // An IPv6 hop (the junk strings include some, e.g. '::') is keyed by its /64.
      return (
        (candidates.has(key) && (key === '10.0.0.5' || /^\d+\.\d+\.\d+\.\d+$/.test(key))) || groupOfAnIpv6Hop(key, hops)
      );
    }),
  );
  assert.equal(clientAddress({ peer: '10.0.0.5', forwardedFor: '::', trusted }), '::/64', 'the counterexample seen');
});

void test('property: a dotted-quad peer and hops give the key their IPv4-mapped IPv6 forms give', () => {
  // The dotted quads take a numeric path, the mapped forms the general one: both must agree.
  const hop = fc.oneof(v4, fc.constant('10.1.2.3'), fc.constant('127.0.0.1'), fc.constant('10.255.0.1'));
  fc.assert(
    fc.property(
      fc.oneof(v4, fc.constant('127.0.0.1'), fc.constant('10.0.0.7')),
      fc.array(hop, { maxLength: 6 }),
      (peer, hops) => {
        const plain = clientAddress({ peer, forwardedFor: hops.join(', '), trusted });
        const mapped = clientAddress({
          peer: `::ffff:${peer}`,
          forwardedFor: hops.map((h) => `[::ffff:${h}]`).join(', '),
          trusted,
        });
        return plain === mapped;
      },
    ),
  );
});
