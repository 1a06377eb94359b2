import { Sha512ChainFormatError } from './errors.js';
import { SHA512_BLOCK, SHA512_STATE_BYTES, type Sha512State } from './state.js';

/**
 * The SHA-512 of an image plus the chaining state at every segment boundary.
 *
 * `states.length === ceil(size / segmentSize)` (0 for an empty image); `states[k]` is the state after every whole
 * 128-byte block that ends at or before `min((k + 1) * segmentSize, size)`; `checksum` is the SHA-512 (lowercase hex)
 * of the whole image, i.e. `finalizeHex(states[last], size, tail)`.
 */
export interface Sha512Chain {
  segmentSize: number;
  size: number;
  checksum: string;
  states: Sha512State[];
}

/** Largest segment the encoding (u32) and the verifier accept: 1 GiB. */
export const MAX_CHAIN_SEGMENT = 1024 * 1024 * 1024;

export function assertSegmentSize(segmentSize: unknown): asserts segmentSize is number {
  if (
    typeof segmentSize !== 'number' ||
    !Number.isSafeInteger(segmentSize) ||
    segmentSize <= 0 ||
    segmentSize > MAX_CHAIN_SEGMENT ||
    segmentSize % SHA512_BLOCK !== 0
  ) {
    throw new RangeError(
      `segment size must be a positive multiple of 128 bytes up to ${MAX_CHAIN_SEGMENT}, got ${String(segmentSize)}`,
    );
  }
}

/** Number of segments (and recorded states) of an image of `size` bytes. */
export function segmentCount(size: number, segmentSize: number): number {
  return Math.ceil(size / segmentSize);
}

const HEX_DIGEST = /^[0-9a-f]{128}$/;

/** Checks the shape of a chain (not its truth: that is what the verifier is for). Throws naming the problem. */
export function assertChain(chain: Sha512Chain): void {
  if (typeof chain !== 'object' || chain === null) throw new TypeError('chain must be an object');
  assertSegmentSize(chain.segmentSize);
  if (!Number.isSafeInteger(chain.size) || chain.size < 0) {
    throw new RangeError(`chain size must be a non-negative safe integer, got ${String(chain.size)}`);
  }
  if (typeof chain.checksum !== 'string' || !HEX_DIGEST.test(chain.checksum)) {
    throw new RangeError('chain checksum must be 128 lowercase hex digits (a SHA-512)');
  }
  if (!Array.isArray(chain.states)) throw new TypeError('chain states must be an array');
  const expected = segmentCount(chain.size, chain.segmentSize);
  if (chain.states.length !== expected) {
    throw new RangeError(
      `chain has ${chain.states.length} states but an image of ${chain.size} bytes in segments of ` +
        `${chain.segmentSize} bytes needs ${expected}`,
    );
  }
  chain.states.forEach((s, i) => {
    if (!(s instanceof Uint8Array) || s.length !== SHA512_STATE_BYTES) {
      throw new RangeError(`chain state ${i} must be 64 bytes`);
    }
  });
}

/** `BISS512C`: the first 8 bytes of an encoded chain. */
export const CHAIN_MAGIC = Buffer.from('BISS512C', 'latin1');
/** The encoding version written by `encodeChain`. */
export const CHAIN_VERSION = 1;
/** magic 8 + version 4 + segmentSize 4 + size 8 + checksum 64 + state count 4. */
export const CHAIN_HEADER_BYTES = 92;

/**
 * Encodes a chain (all integers big-endian):
 * `magic "BISS512C"` | `u32 version = 1` | `u32 segmentSize` | `u64 size` | `64 bytes checksum (raw SHA-512)` |
 * `u32 state count` | `count × 64 bytes states`.
 */
export function encodeChain(chain: Sha512Chain): Buffer {
  assertChain(chain);
  const states = Buffer.alloc(chain.states.length * SHA512_STATE_BYTES);
  chain.states.forEach((s, i) => states.set(s, i * SHA512_STATE_BYTES));
  return encodeChainParts(chain, states);
}

/**
 * `encodeChain` of a chain whose states are already back to back in one buffer (`states.length` = count × 64), for a
 * producer that keeps them compact instead of one object per state.
 */
export function encodeChainParts(header: Omit<Sha512Chain, 'states'>, states: Uint8Array): Buffer {
  assertSegmentSize(header.segmentSize);
  const count = states.length / SHA512_STATE_BYTES;
  if (!Number.isInteger(count) || count !== segmentCount(header.size, header.segmentSize)) {
    throw new RangeError(`${states.length} bytes of states do not fit size ${header.size} in segments of ${header.segmentSize} bytes`);
  }
  const out = Buffer.alloc(CHAIN_HEADER_BYTES + states.length);
  CHAIN_MAGIC.copy(out, 0);
  out.writeUInt32BE(CHAIN_VERSION, 8);
  out.writeUInt32BE(header.segmentSize, 12);
  out.writeBigUInt64BE(BigInt(header.size), 16);
  out.write(header.checksum, 24, 'hex');
  out.writeUInt32BE(count, 88);
  out.set(states, CHAIN_HEADER_BYTES);
  return out;
}

/** Decodes `encodeChain` output; throws `Sha512ChainFormatError` naming what is wrong. States are copies. */
export function decodeChain(bytes: Uint8Array): Sha512Chain {
  if (!(bytes instanceof Uint8Array)) throw new Sha512ChainFormatError('input is not a byte array');
  const buf = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length);
  if (buf.length < CHAIN_MAGIC.length || !buf.subarray(0, CHAIN_MAGIC.length).equals(CHAIN_MAGIC)) {
    throw new Sha512ChainFormatError('bad magic (expected "BISS512C")');
  }
  if (buf.length < CHAIN_HEADER_BYTES) {
    throw new Sha512ChainFormatError(`truncated header: ${buf.length} bytes, need ${CHAIN_HEADER_BYTES}`);
  }
  const version = buf.readUInt32BE(8);
  if (version !== CHAIN_VERSION) {
    throw new Sha512ChainFormatError(`unsupported version ${version} (this library reads version ${CHAIN_VERSION})`);
  }
  const segmentSize = buf.readUInt32BE(12);
  try {
    assertSegmentSize(segmentSize);
  } catch (err) {
    throw new Sha512ChainFormatError((err as Error).message);
  }
  const bigSize = buf.readBigUInt64BE(16);
  if (bigSize > BigInt(Number.MAX_SAFE_INTEGER)) {
    throw new Sha512ChainFormatError(`size ${bigSize} is larger than the largest safe integer`);
  }
  const size = Number(bigSize);
  const checksum = buf.toString('hex', 24, 88);
  const count = buf.readUInt32BE(88);
  const expected = segmentCount(size, segmentSize);
  if (count !== expected) {
    throw new Sha512ChainFormatError(
      `state count ${count} does not match size ${size} in segments of ${segmentSize} bytes (needs ${expected})`,
    );
  }
  const total = CHAIN_HEADER_BYTES + count * SHA512_STATE_BYTES;
  if (buf.length < total) {
    throw new Sha512ChainFormatError(`truncated states: ${buf.length} bytes, need ${total} for ${count} states`);
  }
  if (buf.length > total) {
    throw new Sha512ChainFormatError(`${buf.length - total} unexpected bytes after the last state`);
  }
  const states: Sha512State[] = [];
  for (let i = 0; i < count; i++) {
    const at = CHAIN_HEADER_BYTES + i * SHA512_STATE_BYTES;
    states.push(Buffer.from(buf.subarray(at, at + SHA512_STATE_BYTES)));
  }
  return { segmentSize, size, checksum, states };
}
