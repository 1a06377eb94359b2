/**
 * The image hasher's program (a worker thread started by {@link ImageHasher}): one streaming SHA-512 fed, in order,
 * with slices of shared memory (hashed in place) or copied bytes, and with zero-range lengths that it hashes from one
 * shared zero buffer (nothing is read or allocated for holes).
 */
import { createHash } from 'node:crypto';
import { parentPort, workerData } from 'node:worker_threads';

export interface ImageHashWorkerData {
  memory: SharedArrayBuffer | undefined;
}

export type ImageHashRequest =
  | { op: 'slot'; id: number; offset: number; length: number }
  | { op: 'bytes'; id: number; bytes: ArrayBuffer }
  | { op: 'zeros'; id: number; length: number }
  | { op: 'digest'; id: number };

export type ImageHashReply = { id: number; hex?: string } | { id: number; error: string };

const zeros = Buffer.alloc(1024 * 1024);
let hash = createHash('sha512');

function answer(memory: SharedArrayBuffer | undefined, m: ImageHashRequest): ImageHashReply {
  try {
    switch (m.op) {
      case 'slot':
        if (memory === undefined) throw new Error('no shared memory was given to the image hasher');
        hash.update(new Uint8Array(memory, m.offset, m.length));
        return { id: m.id };
      case 'bytes':
        hash.update(new Uint8Array(m.bytes));
        return { id: m.id };
      case 'zeros': {
        let left = m.length;
        while (left > 0) {
          const n = Math.min(left, zeros.length);
          hash.update(zeros.subarray(0, n));
          left -= n;
        }
        return { id: m.id };
      }
      case 'digest': {
        const hex = hash.digest('hex');
        hash = createHash('sha512');
        return { id: m.id, hex };
      }
    }
    const other = m as { id: number; op: unknown };
    return { id: other.id, error: `unknown image hash operation ${String(other.op)}` };
  } catch (e) {
    return { id: m.id, error: e instanceof Error ? e.message : String(e) };
  }
}

if (parentPort) {
  const port = parentPort;
  const { memory } = workerData as ImageHashWorkerData;
  port.on('message', (m: ImageHashRequest) => port.postMessage(answer(memory, m)));
}
