import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { Packr } from 'msgpackr';
import type { Message } from '../../../coordinator/raft/raft-types.js';
import {
  decodeFrame,
  defaultPeerCodecLimits,
  encodeFrame,
  MESSAGE_TYPES,
  PEER_FRAME_VERSION,
  validateMessage,
} from '../../../coordinator/transport/peer-codec.js';
import { messageArb, MESSAGE_TYPE_COUNT } from './transport-test-util.js';

const rawPackr = new Packr({ useRecords: false });

function binariesOf(m: Message): Uint8Array[] {
  if (m.type === 'append') return m.entries.map((e) => e.data);
  if (m.type === 'snapshot') return [m.chunk];
  return [];
}

function decodeOk(frame: Uint8Array): Message[] {
  const r = decodeFrame(frame);
  if (!r.ok) assert.fail(`expected a valid frame, got: ${r.error}`);
  return r.messages;
}

function decodeErr(frame: Uint8Array, limits = defaultPeerCodecLimits): string {
  const r = decodeFrame(frame, limits);
  if (r.ok) assert.fail('expected a malformed frame');
  return r.error;
}

/** A frame built from an arbitrary value, bypassing the typed encoder. */
function rawFrame(messages: unknown, version: unknown = PEER_FRAME_VERSION): Uint8Array {
  return rawPackr.pack([version, messages]);
}

void test('codec: the generator covers every message type', () => {
  assert.equal(MESSAGE_TYPES.length, MESSAGE_TYPE_COUNT);
  const seen = new Set(fc.sample(messageArb, { numRuns: 2000, seed: 7 }).map((m) => m.type));
  assert.deepEqual([...seen].sort(), [...MESSAGE_TYPES].sort());
});

void test('codec: batches of every message type round-trip exactly, binaries as plain Uint8Array', () => {
  fc.assert(
    fc.property(fc.array(messageArb, { maxLength: 12 }), (batch) => {
      const decoded = decodeOk(encodeFrame(batch));
      assert.deepStrictEqual(decoded, batch);
      for (const m of decoded) {
        for (const b of binariesOf(m)) {
          assert.equal(
            Object.getPrototypeOf(b),
            Uint8Array.prototype,
            'binary must come back as Uint8Array, not Buffer',
          );
        }
      }
    }),
    { numRuns: 300, seed: 42 },
  );
});

void test('codec: decoded binaries own their bytes; subarray views encode only their window', () => {
  const backing = new Uint8Array(1024).map((_, i) => i & 0xff);
  const chunk = backing.subarray(100, 300);
  const snap: Message = {
    type: 'snapshot',
    from: 'n1',
    to: 'n2',
    term: 3,
    meta: { index: 10, term: 2, conf: { voters: ['n1', 'n2', 'n3'], learners: [] } },
    offset: 100,
    totalBytes: 1024,
    chunk,
    done: false,
  };
  const entryData = backing.subarray(5, 9);
  const app: Message = {
    type: 'append',
    from: 'n1',
    to: 'n2',
    term: 3,
    prevIndex: 4,
    prevTerm: 2,
    commit: 4,
    entries: [
      { term: 3, index: 5, kind: 0, data: entryData },
      { term: 3, index: 6, kind: 2, data: new Uint8Array(0) },
    ],
  };
  const frame = encodeFrame([snap, app]);
  const [s, a] = decodeOk(frame);
  assert.ok(s !== undefined && s.type === 'snapshot' && a !== undefined && a.type === 'append');
  assert.deepStrictEqual(s.chunk, chunk.slice());
  assert.equal(s.chunk.byteLength, 200);
  assert.equal(s.chunk.byteOffset, 0);
  assert.equal(s.chunk.buffer.byteLength, 200, 'the chunk owns an exactly sized buffer, not a view into the frame');
  assert.deepStrictEqual(a.entries[0]?.data, new Uint8Array([5, 6, 7, 8]));
  assert.equal(a.entries[1]?.data.byteLength, 0);
  // Mutating the frame afterwards must not change what was decoded.
  frame.fill(0);
  assert.equal(s.chunk[0], 100);
});

void test('codec: extra fields are stripped, the result holds exactly the fields of its type', () => {
  const frame = rawFrame([{ type: 'timeout-now', from: 'n1', to: 'n2', term: 5, extra: 'x', nested: { a: 1 } }]);
  assert.deepStrictEqual(decodeOk(frame), [{ type: 'timeout-now', from: 'n1', to: 'n2', term: 5 }]);
});

void test('codec: malformed frames are reported, never thrown', () => {
  const good = { type: 'heartbeat', from: 'n1', to: 'n2', term: 1, commit: 2, readSeq: 0 };
  const cases: [string, Uint8Array, RegExp][] = [
    ['empty', new Uint8Array(0), /empty frame/],
    ['not msgpack', new Uint8Array([0xc1]), /not \[version/],
    ['truncated', encodeFrame([good as Message]).subarray(0, 10), /not msgpack/],
    ['trailing bytes', Uint8Array.from([...encodeFrame([good as Message]), 0x01]), /not msgpack/],
    ['not an envelope', rawPackr.pack({ v: 1 }), /not \[version/],
    ['wrong version', rawFrame([good], 2), /unsupported frame version 2/],
    ['messages not an array', rawFrame('nope'), /messages is not an array/],
    ['message not a map', rawFrame([[1, 2, 3]]), /message 0: message is not a map/],
    ['unknown type', rawFrame([{ ...good, type: 'gossip' }]), /unknown message type "gossip"/],
    ['type not a string', rawFrame([{ ...good, type: 7 }]), /unknown message type 7/],
    ['negative term', rawFrame([{ ...good, term: -1 }]), /term is not an integer/],
    ['fractional index', rawFrame([{ ...good, commit: 1.5 }]), /commit is not an integer/],
    ['NaN', rawFrame([{ ...good, commit: NaN }]), /commit is not an integer/],
    ['Infinity', rawFrame([{ ...good, commit: Infinity }]), /commit is not an integer/],
    ['unsafe integer', rawFrame([{ ...good, commit: 2 ** 60 }]), /commit is not an integer/],
    ['number as string', rawFrame([{ ...good, term: '1' }]), /term is not an integer/],
    [
      'missing field',
      rawFrame([{ type: 'heartbeat', from: 'n1', to: 'n2', term: 1, commit: 2 }]),
      /readSeq is not an integer/,
    ],
    ['empty id', rawFrame([{ ...good, from: '' }]), /from is not a node id/],
    ['id too long', rawFrame([{ ...good, to: 'x'.repeat(257) }]), /to is not a node id/],
    ['id not a string', rawFrame([{ ...good, from: 1 }]), /from is not a node id/],
    [
      'boolean not a boolean',
      rawFrame([{ type: 'vote-resp', from: 'n1', to: 'n2', term: 1, reject: 0 }]),
      /reject is not a boolean/,
    ],
    [
      'entry kind unknown',
      rawFrame([
        {
          type: 'append',
          from: 'n1',
          to: 'n2',
          term: 1,
          prevIndex: 0,
          prevTerm: 0,
          commit: 0,
          entries: [{ term: 1, index: 1, kind: 9, data: new Uint8Array(1) }],
        },
      ]),
      /kind 9 is unknown/,
    ],
    [
      'entry data a string',
      rawFrame([
        {
          type: 'append',
          from: 'n1',
          to: 'n2',
          term: 1,
          prevIndex: 0,
          prevTerm: 0,
          commit: 0,
          entries: [{ term: 1, index: 1, kind: 0, data: 'abc' }],
        },
      ]),
      /data is not binary/,
    ],
    [
      'entries not an array',
      rawFrame([{ type: 'append', from: 'n1', to: 'n2', term: 1, prevIndex: 0, prevTerm: 0, commit: 0, entries: {} }]),
      /entries is not an array/,
    ],
    [
      'chunk beyond totalBytes',
      rawFrame([
        {
          type: 'snapshot',
          from: 'n1',
          to: 'n2',
          term: 1,
          meta: { index: 1, term: 1, conf: { voters: ['n1'], learners: [] } },
          offset: 10,
          totalBytes: 12,
          chunk: new Uint8Array(5),
          done: true,
        },
      ]),
      /lies beyond totalBytes/,
    ],
    [
      'bad conf',
      rawFrame([
        {
          type: 'snapshot',
          from: 'n1',
          to: 'n2',
          term: 1,
          meta: { index: 1, term: 1, conf: { voters: [''], learners: [] } },
          offset: 0,
          totalBytes: 1,
          chunk: new Uint8Array(1),
          done: true,
        },
      ]),
      /voters\[0\] is not a node id/,
    ],
    [
      'read-index-resp below -1',
      rawFrame([{ type: 'read-index-resp', from: 'n1', to: 'n2', term: 1, ctx: 'c', index: -2 }]),
      /index is not an integer >= -1/,
    ],
    [
      'ctx too long',
      rawFrame([{ type: 'read-index', from: 'n1', to: 'n2', term: 1, ctx: 'c'.repeat(5000) }]),
      /ctx is not a string/,
    ],
    ['one bad message spoils the frame', rawFrame([good, { ...good, term: -3 }]), /message 1: term/],
  ];
  for (const [name, frame, expected] of cases) {
    const error = decodeErr(frame);
    assert.match(error, expected, name);
    assert.ok(error.length <= 300, `${name}: error text is bounded`);
  }
  // read-index-resp may carry -1 (the leader could not serve the read).
  assert.equal(
    decodeOk(rawFrame([{ type: 'read-index-resp', from: 'n1', to: 'n2', term: 1, ctx: 'c', index: -1 }])).length,
    1,
  );
});

void test('codec: frames over the size limit are refused before decoding', () => {
  const big: Message = {
    type: 'append',
    from: 'n1',
    to: 'n2',
    term: 1,
    prevIndex: 0,
    prevTerm: 0,
    commit: 0,
    entries: [{ term: 1, index: 1, kind: 0, data: new Uint8Array(2048) }],
  };
  const frame = encodeFrame([big]);
  assert.match(decodeErr(frame, { ...defaultPeerCodecLimits, maxFrameBytes: 1024 }), /exceeds the limit/);
  assert.equal(decodeOk(frame).length, 1);
});

void test('codec: corrupted and arbitrary frames never throw', () => {
  fc.assert(
    fc.property(
      fc.array(messageArb, { minLength: 1, maxLength: 4 }),
      fc.array(fc.tuple(fc.nat(), fc.nat(255)), { minLength: 1, maxLength: 8 }),
      fc.nat(),
      (batch, flips, cut) => {
        const frame = Uint8Array.from(encodeFrame(batch));
        for (const [pos, value] of flips) frame[pos % frame.length] = value;
        for (const f of [frame, frame.subarray(0, cut % frame.length)]) {
          const r = decodeFrame(f);
          if (r.ok) for (const m of r.messages) validateMessage(m);
        }
      },
    ),
    { numRuns: 300, seed: 3 },
  );
  fc.assert(
    fc.property(fc.anything(), (value) => {
      let frame: Uint8Array;
      try {
        frame = rawFrame([value]);
      } catch {
        return; // not encodable: nothing to decode
      }
      decodeFrame(frame);
      decodeFrame(rawPackr.pack(value));
    }),
    { numRuns: 300, seed: 4 },
  );
  fc.assert(
    fc.property(fc.uint8Array({ maxLength: 200 }), (bytes) => {
      decodeFrame(bytes);
    }),
    { numRuns: 300, seed: 5 },
  );
});
