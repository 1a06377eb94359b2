import { randomBytes, createHash } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ProgressSink } from '../contract.js';

/** A raw image with data, a 1 MiB run of zeros, more data and a tail that is not a multiple of 512. */
export function sparseImage(tail = 1000): Buffer {
  return Buffer.concat([randomBytes(300_032), Buffer.alloc(1 << 20), randomBytes(200_192), Buffer.alloc(64 << 10), randomBytes(tail)]);
}

export function padTo512(b: Buffer): Buffer {
  const pad = (512 - (b.length % 512)) % 512;
  return pad ? Buffer.concat([b, Buffer.alloc(pad)]) : b;
}

export function sha(alg: string, b: Buffer): string {
  return createHash(alg).update(b).digest('hex');
}

export function compressWith(cmd: 'xz' | 'zstd' | 'gzip', b: Buffer): Buffer {
  const args = cmd === 'zstd' ? ['-c', '-q'] : ['-c'];
  return execFileSync(cmd, args, { input: b, maxBuffer: 1 << 30 });
}

/** A qcow2 (v3) header; `backing` names a backing file, `externalData` sets incompatible feature bit 2. */
export function qcow2Header(virtualSize: number, o: { backing?: boolean; externalData?: boolean; version?: number } = {}): Buffer {
  const b = Buffer.alloc(65536);
  b.write('QFI\xfb', 0, 'latin1');
  b.writeUInt32BE(o.version ?? 3, 4);
  if (o.backing) {
    b.writeBigUInt64BE(512n, 8);
    b.writeUInt32BE(8, 16);
    b.write('base.img', 512);
  }
  b.writeUInt32BE(16, 20);
  b.writeBigUInt64BE(BigInt(virtualSize), 24);
  if (o.externalData) b.writeBigUInt64BE(1n << 2n, 72);
  b.writeUInt32BE(104, 100);
  return b;
}

export class RecordingProgress implements ProgressSink {
  /** The first size announced (Content-Length, -1 when unknown); `sizes` has every announcement. */
  size: number | undefined;
  sizes: number[] = [];
  updates: number[] = [];
  setSize(size: number): void {
    if (this.size === undefined) this.size = size;
    this.sizes.push(size);
  }
  updateProgress(processed: number): void {
    this.updates.push(processed);
  }
  /** Notes the source gave while it waited (retries). */
  notes: string[] = [];
  note(message: string): void {
    this.notes.push(message);
  }
  get last(): number | undefined {
    return this.updates.at(-1);
  }
}

export async function withTempDir<T>(fn: (dir: string) => Promise<T>): Promise<T> {
  const dir = await mkdtemp(join(tmpdir(), 'file-sources-'));
  try {
    return await fn(dir);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
