// gRPC's wire details the lean server relies on: grpc-timeout values, grpc-message's
// percent-encoding, and the reassembly of one length-prefixed message from arbitrary chunks.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import {
  GRPC_CODE,
  UnaryCollector,
  decodeGrpcMessage,
  encodeGrpcMessage,
  frameMessage,
  isGrpcContentType,
  parseGrpcTimeout,
} from '../../../cell-agent/rls/grpc-wire.js';

void test('grpc-timeout: every unit, absent, and malformed values', () => {
  assert.equal(parseGrpcTimeout('1H'), 3_600_000);
  assert.equal(parseGrpcTimeout('2M'), 120_000);
  assert.equal(parseGrpcTimeout('3S'), 3000);
  assert.equal(parseGrpcTimeout('20m'), 20);
  assert.equal(parseGrpcTimeout('1500u'), 1.5);
  assert.equal(parseGrpcTimeout('99999999n'), 99.999999);
  assert.equal(parseGrpcTimeout(undefined), null);
  for (const bad of ['', 'S', '10', '10s', '-1S', '1.5S', '123456789S', ' 1S'])
    assert.ok(Number.isNaN(parseGrpcTimeout(bad)), bad);
});

void test('content types: application/grpc with +proto or parameters, nothing else', () => {
  for (const ok of ['application/grpc', 'application/grpc+proto', 'application/grpc;charset=utf-8'])
    assert.ok(isGrpcContentType(ok), ok);
  for (const bad of [undefined, 'application/json', 'application/grpcx', 'application/grpc-web'])
    assert.equal(isGrpcContentType(bad), false, String(bad));
});

void test('grpc-message: percent-encoded outside printable ASCII, read back exactly', () => {
  assert.equal(encodeGrpcMessage('plain text'), 'plain text');
  assert.equal(encodeGrpcMessage('100% ü\n'), '100%25 %C3%BC%0A');
  fc.assert(
    fc.property(fc.string({ unit: 'grapheme' }), (s) => {
      const wire = encodeGrpcMessage(s);
      assert.match(wire, /^[\x20-\x7e]*$/);
      assert.equal(decodeGrpcMessage(wire), s);
    }),
  );
});

void test('one message from any chunking; the bound, the compression flag and extra bytes refused', () => {
  fc.assert(
    fc.property(fc.uint8Array({ maxLength: 300 }), fc.array(fc.nat(400), { maxLength: 6 }), (message, cuts) => {
      const framed = frameMessage(message);
      const points = [...new Set(cuts.map((c) => c % (framed.length + 1)))].sort((a, b) => a - b);
      const c = new UnaryCollector(300);
      let at = 0;
      for (const p of [...points, framed.length]) {
        assert.equal(c.push(framed.subarray(at, p)), null);
        at = p;
      }
      const body = c.finish();
      assert.equal(body.kind, 'message');
      if (body.kind === 'message') assert.deepEqual(new Uint8Array(body.bytes), message);
    }),
  );
  const big = new UnaryCollector(10);
  assert.deepEqual(big.push(frameMessage(new Uint8Array(11)).subarray(0, 5)), {
    kind: 'error',
    code: GRPC_CODE.RESOURCE_EXHAUSTED,
    message: 'received message larger than max (11 vs. 10)',
  });
  const compressed = frameMessage(new Uint8Array(3));
  compressed[0] = 1;
  assert.equal((new UnaryCollector(10).push(compressed) as { code: number }).code, GRPC_CODE.UNIMPLEMENTED);
  const two = new UnaryCollector(10);
  assert.equal(
    (two.push(Buffer.concat([frameMessage(new Uint8Array(2)), Buffer.from([0])])) as { code: number }).code,
    GRPC_CODE.UNIMPLEMENTED,
  );
  assert.equal((new UnaryCollector(10).finish() as { code: number }).code, GRPC_CODE.UNIMPLEMENTED, 'no message');
  const short = new UnaryCollector(10);
  short.push(frameMessage(new Uint8Array(4)).subarray(0, 7));
  assert.equal((short.finish() as { code: number }).code, GRPC_CODE.INTERNAL, 'ended inside the message');
});
