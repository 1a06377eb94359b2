/**
 * The block workers' program (a worker thread started by {@link BlockWorkerPool}): hashes, zero-checks, frames and
 * decodes blocks in place in the shared memory of a {@link SlotPool}, answering each request by its id.
 */
import { createHash } from 'node:crypto';
import { parentPort, workerData } from 'node:worker_threads';
import { compressSync } from 'lz4-napi';
import { decodeFrameInto, storedFrameData, writeStoredFrameEnds, xxh32 } from './lz4-frame.js';

export interface BlockWorkerData {
  memory: SharedArrayBuffer;
}

/** Backup: zero check, block name and (with `lz4`) the ends of an uncompressed frame written at `outOffset`. */
export interface PrepareRequest {
  op: 'prepare';
  id: number;
  offset: number;
  length: number;
  lz4: boolean;
  outOffset: number;
}

/** Restore: the data range (or the decoded data) of a stored block, its name and whether it is all zeros. */
export interface CheckRequest {
  op: 'check';
  id: number;
  offset: number;
  length: number;
  verify: boolean;
  nameDecoded: boolean;
  dataOffset: number;
  dataCapacity: number;
}

export type BlockRequest = PrepareRequest | CheckRequest;

export type PrepareReply =
  | { id: number; zero: true }
  | { id: number; zero: false; checksum: string; storedLength: number; xxh: number };

export type CheckReply =
  | { id: number; fast: false }
  | { id: number; fast: true; decoded: boolean; checksum: string; zero: boolean; dataOffset: number; dataLength: number };

export interface ErrorReply {
  id: number;
  error: string;
}

export type BlockReply = PrepareReply | CheckReply | ErrorReply;

const ZERO = Buffer.alloc(64 * 1024);
const PROBES = 4;
const PROBE = 16 * 1024;

function isZero(b: Uint8Array): boolean {
  const n = b.length;
  if (n === 0) return true;
  if (b[0] !== 0 || b[n - 1] !== 0) return false;
  for (let o = 0; o < n; o += ZERO.length) {
    const l = Math.min(ZERO.length, n - o);
    if (Buffer.compare(b.subarray(o, o + l), ZERO.subarray(0, l)) !== 0) return false;
  }
  return true;
}

function blockName(b: Uint8Array): string {
  return createHash('sha512').update(b).digest('hex').slice(0, 64);
}

/**
 * LZ4 on a few spread samples: when even they do not shrink, the block is stored as an uncompressed frame block
 * (what the LZ4 compressor would do after spending a full compression on it).
 */
function incompressible(b: Buffer): boolean {
  if (b.length < PROBES * PROBE * 2) return false;
  const step = Math.floor((b.length - PROBE) / (PROBES - 1));
  let raw = 0;
  let packed = 0;
  for (let k = 0; k < PROBES; k++) {
    const s = b.subarray(k * step, k * step + PROBE);
    raw += s.length;
    packed += compressSync(s).length - 4;
  }
  return packed >= raw * 0.98;
}

function prepare(memory: SharedArrayBuffer, m: PrepareRequest): PrepareReply {
  const view = Buffer.from(memory, m.offset, m.length);
  if (isZero(view)) return { id: m.id, zero: true };
  const checksum = blockName(view);
  let storedLength = 0;
  let xxh = 0;
  if (m.lz4 && incompressible(view)) {
    xxh = xxh32(view, 0);
    storedLength = writeStoredFrameEnds(view.length, new Uint8Array(memory), m.outOffset, xxh);
  }
  return { id: m.id, zero: false, checksum, storedLength, xxh };
}

function check(memory: SharedArrayBuffer, m: CheckRequest): CheckReply {
  const view = Buffer.from(memory, m.offset, m.length);
  let range: [number, number] | undefined;
  const lz4Frame = view.length >= 4 && view.readUInt32LE(0) === 0x184d2204;
  if (lz4Frame) range = storedFrameData(view);
  else if (view.length >= 2 && view[0] === 0x1f && view[1] === 0x8b) range = undefined;
  else range = [0, view.length];
  if (!range && lz4Frame) {
    // A compressed frame: decoded here, straight into the slot's block area, and always checked by its name.
    const out = Buffer.from(memory, m.dataOffset, m.dataCapacity);
    const n = decodeFrameInto(view, out);
    if (n < 0) return { id: m.id, fast: false };
    const data = out.subarray(0, n);
    return {
      id: m.id,
      fast: true,
      decoded: true,
      checksum: m.nameDecoded ? blockName(data) : '',
      zero: isZero(data),
      dataOffset: 0,
      dataLength: n,
    };
  }
  if (!range) return { id: m.id, fast: false };
  const data = view.subarray(range[0], range[0] + range[1]);
  const checksum = m.verify ? blockName(data) : '';
  return { id: m.id, fast: true, decoded: false, checksum, zero: isZero(data), dataOffset: range[0], dataLength: range[1] };
}

function answer(memory: SharedArrayBuffer, m: BlockRequest): BlockReply {
  try {
    switch (m.op) {
      case 'prepare':
        return prepare(memory, m);
      case 'check':
        return check(memory, m);
    }
    const other = m as { id: number; op: unknown };
    return { id: other.id, error: `unknown block worker operation ${String(other.op)}` };
  } catch (e) {
    return { id: m.id, error: e instanceof Error ? e.message : String(e) };
  }
}

if (parentPort) {
  const port = parentPort;
  const { memory } = workerData as BlockWorkerData;
  port.on('message', (m: BlockRequest) => port.postMessage(answer(memory, m)));
}
