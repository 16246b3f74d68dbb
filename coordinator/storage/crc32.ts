// CRC-32 (IEEE 802.3, the polynomial zlib and PNG use) over byte arrays. Node ≥ 20.15 ships it in
// node:zlib (native, fast); older Node 20 releases fall back to the table-driven version below.
// Both give identical results (test/coordinator/storage checks that), so records written by one
// are read by the other.
import * as zlib from 'node:zlib';

const table = ((): Uint32Array => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();

/** Table-driven CRC-32; `prev` continues a checksum over earlier bytes (crc32(b, crc32(a)) = crc32(a ++ b)). */
export function crc32Portable(data: Uint8Array, prev = 0): number {
  let c = (prev ^ 0xffffffff) >>> 0;
  for (let i = 0; i < data.length; i++) c = (table[(c ^ (data[i] ?? 0)) & 0xff] ?? 0) ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

// Looked up at run time: the typings say it always exists, Node 20.0–20.14 says otherwise.
const native = (zlib as { crc32?: (data: Uint8Array, value?: number) => number }).crc32;

/** CRC-32 of `data`, continuing from `prev`. */
export const crc32: (data: Uint8Array, prev?: number) => number =
  typeof native === 'function' ? (data, prev = 0) => native(data, prev) : crc32Portable;

/** Whether crc32 is the native node:zlib implementation. */
export const crc32IsNative = typeof native === 'function';
