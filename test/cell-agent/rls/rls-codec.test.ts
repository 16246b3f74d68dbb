// The hand-written RLS codec against protobufjs (through @grpc/proto-loader) loading the very
// .proto files Envoy's messages are defined by (proto/envoy/**): both directions, random messages,
// unknown fields, and garbage that must come back as a decode error, never as an exception.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as protoLoader from '@grpc/proto-loader';
import fc from 'fast-check';
import {
  decodeHealthCheckRequest,
  POOLED_DESCRIPTORS,
  POOLED_ENTRIES,
  decodeRateLimitRequest,
  decodeRateLimitRequestReused,
  decodeRateLimitResponse,
  encodeHealthCheckResponse,
  encodeHealthListResponse,
  encodeRateLimitRequest,
  encodeRateLimitResponse,
} from '../../../cell-agent/rls/rls-codec.js';
import type { RlsRequest, RlsResponse } from '../../../cell-agent/messages/rls-messages.js';
import { PROTO_DIR } from '../../../testkit/rls-client.js';

const defs = protoLoader.loadSync(['envoy/service/ratelimit/v3/rls.proto', 'grpc/health/v1/health.proto'], {
  includeDirs: [PROTO_DIR],
  keepCase: true,
  longs: Number,
  enums: Number,
  defaults: true,
  oneofs: true,
});
interface Method {
  requestSerialize(v: unknown): Buffer;
  requestDeserialize(b: Buffer): unknown;
  responseSerialize(v: unknown): Buffer;
  responseDeserialize(b: Buffer): unknown;
}
const rls = (defs['envoy.service.ratelimit.v3.RateLimitService'] as unknown as Record<string, Method>)[
  'ShouldRateLimit'
] as Method;
const healthCheck = (defs['grpc.health.v1.Health'] as unknown as Record<string, Method>)['Check'] as Method;
const healthList = (defs['grpc.health.v1.Health'] as unknown as Record<string, Method>)['List'] as Method;

// Short strings of any characters, and ASCII ones past the lengths where the codec changes how it
// measures, writes and interns a string (16, 24 and 32: rls-codec.ts, ascii-interner.ts).
const text = fc.oneof(fc.string({ maxLength: 12, unit: 'grapheme' }), fc.string({ minLength: 13, maxLength: 40 }));
const requestArb: fc.Arbitrary<RlsRequest> = fc.record({
  domain: text,
  hitsAddend: fc.nat({ max: 0xffffffff }),
  descriptors: fc.array(
    fc.record({
      entries: fc.array(fc.record({ key: text, value: text }), { maxLength: 4 }),
      limit: fc.option(
        fc.record({ requestsPerUnit: fc.nat({ max: 0xffffffff }), unit: fc.integer({ min: 0, max: 6 }) }),
        { nil: null },
      ),
      hitsAddend: fc.option(fc.oneof(fc.nat({ max: 1000 }), fc.nat({ max: Number.MAX_SAFE_INTEGER })), { nil: null }),
    }),
    { maxLength: 5 },
  ),
});

function toProtobufjs(r: RlsRequest): unknown {
  return {
    domain: r.domain,
    hits_addend: r.hitsAddend,
    descriptors: r.descriptors.map((d) => ({
      entries: d.entries,
      ...(d.limit === null ? {} : { limit: { requests_per_unit: d.limit.requestsPerUnit, unit: d.limit.unit } }),
      ...(d.hitsAddend === null ? {} : { hits_addend: { value: d.hitsAddend } }),
    })),
  };
}

void test('requests encoded by protobufjs decode to the same request; ours encode to what protobufjs reads', () => {
  fc.assert(
    fc.property(requestArb, (generated) => {
      const req = structuredClone(generated);
      const decoded = decodeRateLimitRequest(rls.requestSerialize(toProtobufjs(req)));
      assert.ok(decoded.ok, 'decodes');
      assert.deepEqual(decoded.value, structuredClone(req));
      const back = rls.requestDeserialize(encodeRateLimitRequest(req)) as {
        domain: string;
        hits_addend: number;
        descriptors: {
          entries: { key: string; value: string }[];
          limit: { requests_per_unit: number; unit: number } | null;
          hits_addend: { value: number } | null;
        }[];
      };
      assert.equal(back.domain, req.domain);
      assert.equal(back.hits_addend, req.hitsAddend);
      assert.equal(back.descriptors.length, req.descriptors.length);
      back.descriptors.forEach((d, i) => {
        const want = req.descriptors[i];
        assert.ok(want !== undefined, 'descriptor exists');
        assert.deepEqual(
          d.entries.map((e) => ({ key: e.key, value: e.value })),
          want.entries,
        );
        assert.deepEqual(
          d.limit === null ? null : { requestsPerUnit: d.limit.requests_per_unit, unit: d.limit.unit },
          want.limit,
        );
        assert.equal(d.hits_addend === null ? null : d.hits_addend.value, want.hitsAddend);
      });
    }),
    { numRuns: 300 },
  );
});

const responseArb: fc.Arbitrary<RlsResponse> = fc.record({
  overallCode: fc.constantFrom(0, 1, 2),
  statuses: fc.array(
    fc.record({
      code: fc.constantFrom(0, 1, 2),
      currentLimit: fc.option(
        fc.record({
          requestsPerUnit: fc.nat({ max: 0xffffffff }),
          unit: fc.constantFrom(0, 1, 2, 3, 4, 5, 6, 7),
          name: text,
        }),
        { nil: null },
      ),
      limitRemaining: fc.nat({ max: 0xffffffff }),
      durationUntilReset: fc.option(
        fc.record({
          seconds: fc.integer({ min: -1e12, max: 1e12 }),
          nanos: fc.integer({ min: -999_999_999, max: 999_999_999 }),
        }),
        { nil: null },
      ),
    }),
    { maxLength: 5 },
  ),
  responseHeadersToAdd: fc.array(fc.record({ key: text, value: text }), { maxLength: 3 }),
  requestHeadersToAdd: fc.array(fc.record({ key: text, value: text }), { maxLength: 3 }),
  rawBody: fc.option(fc.uint8Array({ minLength: 1, maxLength: 20 }), { nil: null }),
});

void test('responses we encode are read by protobufjs as Envoy would, and decode back', () => {
  fc.assert(
    fc.property(responseArb, (generated) => {
      const res = structuredClone(generated);
      const bytes = encodeRateLimitResponse(res);
      const pb = rls.responseDeserialize(bytes) as {
        overall_code: number;
        raw_body: Buffer;
        statuses: {
          code: number;
          limit_remaining: number;
          current_limit: { requests_per_unit: number; unit: number; name: string } | null;
          duration_until_reset: { seconds: number; nanos: number } | null;
        }[];
        response_headers_to_add: { key: string; value: string }[];
        request_headers_to_add: { key: string; value: string }[];
      };
      assert.equal(pb.overall_code, res.overallCode);
      assert.equal(pb.statuses.length, res.statuses.length);
      pb.statuses.forEach((s, i) => {
        const want = res.statuses[i];
        assert.ok(want !== undefined, 'status exists');
        assert.equal(s.code, want.code);
        assert.equal(s.limit_remaining, want.limitRemaining);
        assert.deepEqual(
          s.current_limit === null
            ? null
            : {
                requestsPerUnit: s.current_limit.requests_per_unit,
                unit: s.current_limit.unit,
                name: s.current_limit.name,
              },
          want.currentLimit,
        );
        assert.deepEqual(
          s.duration_until_reset === null
            ? null
            : { seconds: s.duration_until_reset.seconds, nanos: s.duration_until_reset.nanos },
          want.durationUntilReset,
        );
      });
      assert.deepEqual(
        pb.response_headers_to_add.map((h) => ({ key: h.key, value: h.value })),
        res.responseHeadersToAdd,
      );
      assert.deepEqual(
        pb.request_headers_to_add.map((h) => ({ key: h.key, value: h.value })),
        res.requestHeadersToAdd,
      );
      assert.deepEqual(new Uint8Array(pb.raw_body), res.rawBody ?? new Uint8Array(0));
      const ours = decodeRateLimitResponse(bytes);
      assert.ok(ours.ok, 'decodes');
      assert.deepEqual(
        { ...ours.value, rawBody: ours.value.rawBody === null ? null : new Uint8Array(ours.value.rawBody) },
        structuredClone(res),
      );
    }),
    { numRuns: 300 },
  );
});

void test('a frozen header (encoded once, then copied) encodes as the same header unfrozen, answer after answer', () => {
  const headerArb = fc.record({ key: text, value: text });
  fc.assert(
    fc.property(responseArb, fc.array(headerArb, { maxLength: 4 }), (generated, generatedHeaders) => {
      const plain = structuredClone(generated);
      const constants = structuredClone(generatedHeaders);
      const shared = constants.map((h) => Object.freeze({ ...h }));
      const withPlain = { ...plain, responseHeadersToAdd: [...plain.responseHeadersToAdd, ...constants] };
      const withFrozen = {
        ...plain,
        responseHeadersToAdd: [...plain.responseHeadersToAdd, ...shared],
        requestHeadersToAdd: [...shared, ...plain.requestHeadersToAdd],
      };
      const withPlainBoth = { ...withPlain, requestHeadersToAdd: [...constants, ...plain.requestHeadersToAdd] };
      const want = encodeRateLimitResponse(withPlainBoth, true);
      for (let i = 0; i < 2; i++) assert.deepEqual(encodeRateLimitResponse(withFrozen, true), want);
      const back = decodeRateLimitResponse(want.subarray(5));
      assert.ok(back.ok, 'decodes');
      assert.deepEqual(back.value.responseHeadersToAdd, withPlain.responseHeadersToAdd);
    }),
    { numRuns: 200 },
  );
});

void test('a frozen current_limit (its field encoded once, then copied) encodes as the same limit unfrozen, answer after answer', () => {
  fc.assert(
    fc.property(fc.array(responseArb, { minLength: 1, maxLength: 4 }), (generated) => {
      const plain = structuredClone(generated);
      // The same answers with every current_limit frozen, each encoded twice, in turn with the others:
      // a kept field is met again after other limits, as an agent meets its rules' limits.
      const frozen = plain.map((m) => ({
        ...m,
        statuses: m.statuses.map((st) => ({
          ...st,
          currentLimit: st.currentLimit === null ? null : Object.freeze({ ...st.currentLimit }),
        })),
      }));
      const want = plain.map((m) => encodeRateLimitResponse(m, true));
      for (let round = 0; round < 2; round++)
        frozen.forEach((m, i) => assert.deepEqual(encodeRateLimitResponse(m, true), want[i]));
      frozen.forEach((m, i) => {
        const back = decodeRateLimitResponse((want[i] as Buffer).subarray(5));
        assert.ok(back.ok, 'decodes');
        assert.deepEqual(
          back.value.statuses.map((st) => st.currentLimit),
          m.statuses.map((st) => st.currentLimit),
        );
      });
    }),
    { numRuns: 200 },
  );
});

void test('a frozen current_limit out of range is refused as an unfrozen one is, and encodes nothing', () => {
  const bad = Object.freeze({ requestsPerUnit: 2 ** 32, unit: 1, name: 'x' });
  const response = {
    overallCode: 1,
    statuses: [{ code: 1, currentLimit: bad, limitRemaining: 0, durationUntilReset: null }],
    responseHeadersToAdd: [],
    requestHeadersToAdd: [],
    rawBody: null,
  } as const;
  for (let i = 0; i < 2; i++)
    assert.throws(() => encodeRateLimitResponse(response), /requests_per_unit must be a uint32, got 4294967296/);
});

void test('a request decoded again gives the same strings; strings around the interning bound decode exactly', () => {
  const values = ['tenant-13', 'a'.repeat(31), 'b'.repeat(32), 'c'.repeat(33), 'caf\u00e9', '\u00e9'.repeat(16), ''];
  for (const value of values) {
    const bytes = encodeRateLimitRequest({
      domain: 'bench-limited',
      hitsAddend: 0,
      descriptors: [{ entries: [{ key: 'tenant', value }], limit: null, hitsAddend: null }],
    });
    const first = decodeRateLimitRequest(bytes);
    const second = decodeRateLimitRequest(Buffer.from(bytes));
    assert.ok(first.ok && second.ok, 'decodes');
    assert.equal(first.value.descriptors[0]?.entries[0]?.value, value);
    assert.equal(second.value.descriptors[0]?.entries[0]?.value, value);
    assert.equal(second.value.domain, 'bench-limited');
  }
});

// Requests past the reused decoding's kept objects (descriptors and entries beyond
// POOLED_DESCRIPTORS / POOLED_ENTRIES are made fresh), among bytes that are not a request at all.
const pooledArb: fc.Arbitrary<RlsRequest> = fc.record({
  domain: text,
  hitsAddend: fc.nat({ max: 0xffffffff }),
  descriptors: fc.array(
    fc.record({
      entries: fc.array(fc.record({ key: text, value: text }), { maxLength: POOLED_ENTRIES + 3 }),
      limit: fc.option(fc.record({ requestsPerUnit: fc.nat({ max: 1000 }), unit: fc.integer({ min: 0, max: 6 }) }), {
        nil: null,
      }),
      hitsAddend: fc.option(fc.nat({ max: 1000 }), { nil: null }),
    }),
    { maxLength: POOLED_DESCRIPTORS + 3 },
  ),
});

void test('the reused decoding gives each request of a sequence exactly, the fresh one its own objects', () => {
  fc.assert(
    fc.property(
      fc.array(
        fc.oneof({ weight: 4, arbitrary: pooledArb }, { weight: 1, arbitrary: fc.uint8Array({ maxLength: 24 }) }),
        {
          minLength: 2,
          maxLength: 12,
        },
      ),
      (sequence) => {
        for (const item of sequence) {
          const bytes = item instanceof Uint8Array ? item : rls.requestSerialize(toProtobufjs(item));
          const reused = decodeRateLimitRequestReused(bytes);
          const fresh = decodeRateLimitRequest(bytes);
          // Read before the next decoding: what the lean server does with it.
          assert.deepEqual(reused, fresh);
          if (!(item instanceof Uint8Array)) assert.deepEqual(reused, { ok: true, value: structuredClone(item) });
        }
      },
    ),
    { numRuns: 300 },
  );
  // The common check, request after request: the same objects, nothing left of the one before.
  const one = (value: string, limit: boolean): Buffer =>
    encodeRateLimitRequest({
      domain: 'api',
      hitsAddend: 0,
      descriptors: [
        {
          entries: [{ key: 'tenant', value }],
          limit: limit ? { requestsPerUnit: 5, unit: 2 } : null,
          hitsAddend: null,
        },
      ],
    });
  const a = decodeRateLimitRequestReused(one('t1', true));
  assert.ok(a.ok, 'decodes');
  const [aDescriptor] = a.value.descriptors;
  const [aEntry] = aDescriptor?.entries ?? [];
  const b = decodeRateLimitRequestReused(one('t2', false));
  assert.ok(b.ok, 'decodes');
  assert.equal(b, a, 'the same answer object');
  assert.equal(b.value.descriptors[0], aDescriptor, 'the same descriptor object');
  assert.equal(b.value.descriptors[0]?.entries[0], aEntry, 'the same entry object');
  assert.deepEqual(b.value, {
    domain: 'api',
    hitsAddend: 0,
    descriptors: [{ entries: [{ key: 'tenant', value: 't2' }], limit: null, hitsAddend: null }],
  });
  const fresh = decodeRateLimitRequest(one('t3', false));
  assert.ok(fresh.ok, 'decodes');
  assert.notEqual(fresh.value.descriptors[0], aDescriptor, 'the fresh decoding copies');
  assert.equal(b.value.descriptors[0]?.entries[0]?.value, 't3', 'it decoded through the reused objects');
});

void test('unknown fields are skipped, every wire type; a repeated singular message merges', () => {
  const base = rls.requestSerialize({ domain: 'api', descriptors: [{ entries: [{ key: 'k', value: 'v' }] }] });
  // field 15 varint, field 16 fixed64, field 17 bytes, field 18 fixed32
  const unknown = Buffer.from([
    0x78, 0x96, 0x01, 0x81, 0x01, 1, 2, 3, 4, 5, 6, 7, 8, 0x8a, 0x01, 2, 0xaa, 0xbb, 0x95, 0x01, 9, 9, 9, 9,
  ]);
  const decoded = decodeRateLimitRequest(Buffer.concat([unknown, base, unknown]));
  assert.ok(decoded.ok, 'decodes');
  assert.deepEqual(decoded.value, {
    domain: 'api',
    hitsAddend: 0,
    descriptors: [{ entries: [{ key: 'k', value: 'v' }], limit: null, hitsAddend: null }],
  });
  // limit {requests_per_unit: 5} then limit {unit: MINUTE}: merged into {5, MINUTE}
  const desc = Buffer.from([0x12, 0x02, 0x08, 0x05, 0x12, 0x02, 0x10, 0x02]);
  const merged = decodeRateLimitRequest(Buffer.concat([Buffer.from([0x12, desc.length]), desc]));
  assert.ok(merged.ok, 'decodes');
  assert.deepEqual(merged.value.descriptors[0]?.limit, { requestsPerUnit: 5, unit: 2 });
});

void test('garbage and truncated messages come back as errors, never as exceptions', () => {
  const good = rls.requestSerialize({
    domain: 'api',
    descriptors: [{ entries: [{ key: 'k', value: 'value' }] }],
    hits_addend: 3,
  });
  for (let cut = 1; cut < good.length; cut++) {
    const r = decodeRateLimitRequest(good.subarray(0, cut));
    if (!r.ok) assert.match(r.error, /^malformed RateLimitRequest: /);
  }
  assert.deepEqual(decodeRateLimitRequest(Buffer.from([0x0a, 0x05, 0x61])), {
    ok: false,
    error: 'malformed RateLimitRequest: length-delimited field runs past the end of its message',
  });
  assert.equal(decodeRateLimitRequest(Buffer.from([0x00])).ok, false, 'field 0');
  assert.equal(decodeRateLimitRequest(Buffer.from([0x0b])).ok, false, 'group wire type');
  assert.equal(
    decodeRateLimitRequest(Buffer.from([0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01])).ok,
    false,
    'varint too long',
  );
  assert.equal(decodeRateLimitRequest(Buffer.from([0x0d, 1, 2, 3, 4])).ok, false, 'domain with a wrong wire type');
  fc.assert(
    fc.property(fc.uint8Array({ maxLength: 64 }), (bytes) => {
      const r = decodeRateLimitRequest(bytes);
      assert.equal(typeof r.ok, 'boolean');
      const h = decodeHealthCheckRequest(bytes);
      assert.equal(typeof h.ok, 'boolean');
    }),
    { numRuns: 2000 },
  );
});

void test('health messages match grpc.health.v1', () => {
  const req = decodeHealthCheckRequest(
    healthCheck.requestSerialize({ service: 'envoy.service.ratelimit.v3.RateLimitService' }),
  );
  assert.deepEqual(req, { ok: true, value: { service: 'envoy.service.ratelimit.v3.RateLimitService' } });
  assert.deepEqual(healthCheck.responseDeserialize(encodeHealthCheckResponse({ status: 2 })), { status: 2 });
  const list = healthList.responseDeserialize(
    encodeHealthListResponse(
      new Map([
        ['', 1],
        ['x', 2],
      ]),
    ),
  ) as { statuses: Record<string, { status: number }> };
  assert.deepEqual(list.statuses, { '': { status: 1 }, x: { status: 2 } });
});
