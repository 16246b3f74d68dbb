// The client address a request is counted under: the socket peer, or, when the peer is a trusted
// proxy, the address that proxy says it saw (X-Forwarded-For, read from the right; X-Real-IP when
// there is no X-Forwarded-For). Every front door (the embedded limiter, the agent's forward-auth,
// the gateway) takes its `remote_address` from here, so they all group a visitor the same way.
//
// Rules, in the order they apply:
// - The peer is the only address nobody can forge. If it is not trusted, it is the client and the
//   headers are ignored.
// - If it is trusted, X-Forwarded-For is walked from the right (the entry the nearest proxy
//   appended) past every trusted entry; the first untrusted one is the client. A client can prepend
//   whatever it likes, but it cannot get past the entry a trusted proxy appended.
// - A malformed entry stops the walk: the client is then the last address known to be trusted (the
//   hop that handed us the garbage), never a string the sender chose. The same holds for an
//   X-Real-IP that does not parse.
// - If every X-Forwarded-For entry is trusted, the leftmost one is the client (the request came from
//   one of our own proxies).
// - IPv4-mapped IPv6 (`::ffff:192.0.2.1`) is IPv4. IPv6 clients are grouped by their /64 (one
//   customer usually holds a whole /64; counting single addresses would let them rotate through 2^64
//   keys), configurable with `ipv6Prefix`.
//
// The parsing is ipaddr.js (the library Fastify's proxy-addr uses); only the header walking is ours.
import { isIPv4, isIPv6 } from 'node:net';
import ipaddr from 'ipaddr.js';
import { CellquotaError } from './errors.js';

type Ip = ipaddr.IPv4 | ipaddr.IPv6;
type Range = readonly [Ip, number];

/** A set of addresses and CIDR ranges, parsed once; `has` answers for any address string. */
export interface AddressSet {
  /** The entries as given (for logs and `--help`). */
  readonly entries: readonly string[];
  /** Whether `address` (IPv4, IPv6, IPv4-mapped IPv6; anything else: false) lies in the set. */
  has(address: string): boolean;
}

/** A bad entry in an address list; `entry` is the entry as given. */
export class AddressListError extends CellquotaError {
  readonly code = 'ADDRESS_LIST_INVALID';
  constructor(
    readonly entry: string,
    reason: string,
  ) {
    super(reason);
    this.name = 'AddressListError';
  }
}

/** Named ranges accepted beside addresses and CIDRs. */
const NAMED_RANGES: Readonly<Record<string, readonly string[]>> = {
  loopback: ['127.0.0.0/8', '::1/128'],
  private: ['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '100.64.0.0/10', 'fc00::/7'],
  linklocal: ['169.254.0.0/16', 'fe80::/10'],
};

/** At most this many entries in one list (a list is configuration; this only bounds a mistake). */
export const MAX_ADDRESS_LIST_ENTRIES = 1024;

/**
 * Parses addresses and CIDR ranges (IPv4 and IPv6, e.g. `10.0.0.0/8`, `2001:db8::/32`,
 * `127.0.0.1`) and the names `loopback`, `private` and `linklocal` into an {@link AddressSet}.
 * Throws {@link AddressListError} naming the first bad entry. `what` names the setting in the
 * message (default "trusted proxy").
 */
export function parseAddressList(list: readonly string[], what = 'trusted proxy'): AddressSet {
  if (list.length > MAX_ADDRESS_LIST_ENTRIES) {
    throw new AddressListError(
      String(list[MAX_ADDRESS_LIST_ENTRIES]),
      `too many ${what} entries: ${list.length} (at most ${MAX_ADDRESS_LIST_ENTRIES})`,
    );
  }
  const v4: Range[] = [];
  const v6: Range[] = [];
  for (const raw of list) {
    const entry = raw.trim();
    const named = NAMED_RANGES[entry.toLowerCase()];
    for (const cidr of named ?? [entry]) {
      const range = parseRange(cidr);
      if (typeof range === 'string') throw new AddressListError(raw, `bad ${what} "${raw}": ${range}`);
      (range[0].kind() === 'ipv4' ? v4 : v6).push(range);
    }
  }
  const set: AddressSet = Object.freeze({
    entries: Object.freeze(list.map((e) => e.trim())),
    has(address: string): boolean {
      const ip = parseIp(address);
      return ip !== null && inRanges(ip, v4, v6);
    },
  });
  PARSED.set(set, { v4, v6, v4Numeric: v4.map(([ip, bits]) => v4NumericRange(ip as ipaddr.IPv4, bits)) });
  return set;
}

/** {@link parseAddressList} for the `--trusted-proxies` setting. */
export function parseTrustedProxies(list: readonly string[]): AddressSet {
  return parseAddressList(list, 'trusted proxy');
}

export interface ClientAddressInput {
  /** The socket's remote address (`req.socket.remoteAddress`); undefined once the socket is gone. */
  readonly peer: string | undefined;
  /** The X-Forwarded-For header: one string, or several header lines (read as one list, in order). */
  readonly forwardedFor?: string | readonly string[] | undefined;
  /** The X-Real-IP header, used only when the peer is trusted and there is no X-Forwarded-For. */
  readonly realIp?: string | readonly string[] | undefined;
  /** Who may speak for the client (from {@link parseTrustedProxies}). */
  readonly trusted: AddressSet;
  /** IPv6 clients are grouped by this prefix length (0..128; default 64, 128 = single addresses). */
  readonly ipv6Prefix?: number;
}

/** The key for a request whose peer address is missing or unparseable (a closed socket). */
export const UNKNOWN_CLIENT = 'unknown';

/** At most this many X-Forwarded-For entries are walked; past them the last trusted hop is used. */
export const MAX_FORWARDED_HOPS = 32;

/**
 * The grouping key of the client that sent a request: a normalized IPv4 address (`192.0.2.1`), an
 * IPv6 network (`2001:db8:1:2::/64`; a single address without suffix when `ipv6Prefix` is 128), or
 * {@link UNKNOWN_CLIENT}. See the comment at the top of this file for the rules.
 */
export function clientAddress(input: ClientAddressInput): string {
  const prefix = input.ipv6Prefix ?? 64;
  if (!Number.isInteger(prefix) || prefix < 0 || prefix > 128)
    throw new RangeError(`ipv6Prefix must be an integer in 0..128, got ${prefix}`);
  const ranges = PARSED.get(input.trusted);
  if (ranges === undefined) throw new TypeError('trusted must come from parseTrustedProxies or parseAddressList');
  // Dotted quads, the common case, as numbers and without ipaddr objects (parseIp was the largest
  // cost of a forward-auth answer in a profile): node:net's isIPv4 accepts only the canonical form
  // (no leading zeros, four decimal parts), which is its own key. Any other form, of the peer or of
  // a hop, takes the general path below.
  const peerNumber = input.peer === undefined ? -1 : v4Number(input.peer);
  if (peerNumber >= 0) {
    if (!inV4(peerNumber, ranges.v4Numeric)) return input.peer as string;
    const key = walkForwardedForV4(joinHeader(input.forwardedFor), input.peer as string, ranges.v4Numeric);
    if (key !== null) return key;
  }
  const peer = input.peer === undefined ? null : parseIp(input.peer);
  if (peer === null) return UNKNOWN_CLIENT;
  if (!inRanges(peer, ranges.v4, ranges.v6)) return keyOf(peer, prefix);

  const xff = joinHeader(input.forwardedFor);
  if (xff !== undefined && xff.trim() !== '') return keyOf(walkForwardedFor(xff, peer, ranges), prefix);
  const realIp = joinHeader(input.realIp);
  if (realIp !== undefined) {
    const ip = realIp.includes(',') ? null : parseHop(realIp);
    return keyOf(ip ?? peer, prefix);
  }
  return keyOf(peer, prefix);
}

// ---------------------------------------------------------------------------------------------

interface Ranges {
  readonly v4: readonly Range[];
  readonly v6: readonly Range[];
  /** `v4` as [network, mask] numbers (v4NumericRange). */
  readonly v4Numeric: readonly V4Range[];
}
type V4Range = readonly [network: number, mask: number];

function v4NumericRange(ip: ipaddr.IPv4, bits: number): V4Range {
  const mask = bits === 0 ? 0 : (0xffffffff << (32 - bits)) >>> 0;
  const [a = 0, b = 0, c = 0, d = 0] = ip.octets;
  return [(((a << 24) | (b << 16) | (c << 8) | d) & mask) >>> 0, mask];
}

/** A canonical dotted quad (node:net's isIPv4: four decimal parts, no leading zeros) as an unsigned number, else -1. */
function v4Number(s: string): number {
  if (!isIPv4(s)) return -1;
  let n = 0;
  let part = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c === 46 /* . */) {
      n = n * 256 + part;
      part = 0;
    } else part = part * 10 + (c - 48);
  }
  return n * 256 + part;
}

function inV4(n: number, ranges: readonly V4Range[]): boolean {
  for (const [network, mask] of ranges) if ((n & mask) >>> 0 === network) return true;
  return false;
}

/**
 * walkForwardedFor for a trusted dotted-quad peer over hops that are all plain dotted quads (a
 * canonical dotted quad is its own key); null for anything else (no header, a port, brackets,
 * IPv6, a malformed hop), which the general path then decides from the start.
 */
function walkForwardedForV4(xff: string | undefined, peer: string, ranges: readonly V4Range[]): string | null {
  if (xff === undefined || xff.trim() === '') return null;
  let lastTrusted = peer;
  let end = xff.length;
  for (let hops = 0; hops < MAX_FORWARDED_HOPS && end >= 0; hops++) {
    const comma = xff.lastIndexOf(',', end - 1);
    const hop = xff.slice(comma + 1, end).trim();
    end = comma;
    const n = v4Number(hop);
    if (n < 0) return null;
    if (!inV4(n, ranges)) return hop;
    lastTrusted = hop;
    if (comma < 0) return hop; // every hop trusted: the leftmost is the client
  }
  return lastTrusted;
}
/** The parsed ranges behind each AddressSet (kept off its public surface). */
const PARSED = new WeakMap<AddressSet, Ranges>();

/** From the right: skip trusted hops; the first untrusted valid one is the client. */
function walkForwardedFor(xff: string, peer: Ip, ranges: Ranges): Ip {
  let lastTrusted = peer;
  let end = xff.length;
  for (let hops = 0; hops < MAX_FORWARDED_HOPS && end >= 0; hops++) {
    const comma = xff.lastIndexOf(',', end - 1);
    const hop = xff.slice(comma + 1, end);
    end = comma;
    const ip = parseHop(hop);
    if (ip === null) return lastTrusted;
    if (!inRanges(ip, ranges.v4, ranges.v6)) return ip;
    lastTrusted = ip;
    if (comma < 0) return ip; // every hop trusted: the leftmost is the client
  }
  return lastTrusted;
}

function joinHeader(h: string | readonly string[] | undefined): string | undefined {
  if (h === undefined) return undefined;
  return typeof h === 'string' ? h : h.length === 0 ? undefined : h.join(',');
}

/** One X-Forwarded-For / X-Real-IP entry: an address, optionally `[v6]`, `[v6]:port` or `v4:port`. */
function parseHop(raw: string): Ip | null {
  let s = raw.trim();
  if (s.length === 0 || s.length > 64) return null;
  if (s.startsWith('[')) {
    const close = s.indexOf(']');
    if (close < 0) return null;
    const rest = s.slice(close + 1);
    if (rest !== '' && !/^:\d{1,5}$/.test(rest)) return null;
    s = s.slice(1, close);
    return isIPv6(s) ? parseIp(s) : null;
  }
  const colon = s.indexOf(':');
  if (colon > 0 && colon === s.lastIndexOf(':')) {
    // IPv4 with a port (some proxies append it); a single colon is never valid IPv6.
    if (!/^\d{1,5}$/.test(s.slice(colon + 1))) return null;
    s = s.slice(0, colon);
  }
  return parseIp(s);
}

/**
 * Strict parse: dotted-quad IPv4 (no `127.1`, hex or octal forms, so one address has one key) or
 * IPv6 (a zone id is dropped). IPv4-mapped IPv6 becomes IPv4.
 */
function parseIp(s: string): Ip | null {
  // node:net's checks first: ipaddr.js's own isValid* throw and catch internally on a miss, which
  // measured ~15 µs per call against ~0.1 µs for these.
  if (isIPv4(s)) return new ipaddr.IPv4(s.split('.').map(Number));
  if (s.length > 7 && s.charCodeAt(0) === 58 && /^::ffff:/i.test(s) && isIPv4(s.slice(7)))
    return new ipaddr.IPv4(s.slice(7).split('.').map(Number));
  if (!isIPv6(s)) return null;
  let v6: ipaddr.IPv6;
  try {
    v6 = ipaddr.IPv6.parse(s);
  } catch {
    return null;
  }
  if (v6.isIPv4MappedAddress()) return v6.toIPv4Address();
  if (v6.zoneId !== undefined) delete v6.zoneId;
  return v6;
}

/** A range from an address or CIDR; an IPv4-mapped IPv6 range of /96 or longer becomes IPv4. */
function parseRange(s: string): Range | string {
  if (s === '') return 'empty entry';
  const slash = s.indexOf('/');
  const addrPart = slash < 0 ? s : s.slice(0, slash);
  const ip = parseIp(addrPart);
  if (ip === null) return 'not an IPv4 or IPv6 address or CIDR';
  const mappedV6 = ip.kind() === 'ipv4' && !isIPv4(addrPart);
  const max = ip.kind() === 'ipv4' && !mappedV6 ? 32 : 128;
  let bits = max;
  if (slash >= 0) {
    const p = s.slice(slash + 1);
    if (!/^\d{1,3}$/.test(p) || Number(p) > max) return `prefix length must be 0..${max}`;
    bits = Number(p);
  }
  if (mappedV6) {
    if (bits < 96) return 'an IPv4-mapped IPv6 range needs a prefix of at least 96';
    bits -= 96;
  }
  return [ip, bits];
}

function inRanges(ip: Ip, v4: readonly Range[], v6: readonly Range[]): boolean {
  const list = ip.kind() === 'ipv4' ? v4 : v6;
  for (const [net, bits] of list) if (ip.match(net, bits)) return true;
  return false;
}

function keyOf(ip: Ip, ipv6Prefix: number): string {
  if (ip.kind() === 'ipv4') return ip.toString();
  if (ipv6Prefix === 128) return ip.toString();
  const mask = v6Mask(ipv6Prefix);
  const net = new ipaddr.IPv6((ip as ipaddr.IPv6).parts.map((part, i) => part & (mask.parts[i] ?? 0)));
  return `${net.toString()}/${ipv6Prefix}`;
}

const masks = new Map<number, ipaddr.IPv6>();
function v6Mask(prefix: number): ipaddr.IPv6 {
  let m = masks.get(prefix);
  if (m === undefined) {
    m = ipaddr.IPv6.subnetMaskFromPrefixLength(prefix);
    masks.set(prefix, m);
  }
  return m;
}
