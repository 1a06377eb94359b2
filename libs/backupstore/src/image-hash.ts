import { WorkerChannel } from './pipeline.js';

/**
 * The worker's code (CommonJS, loaded with `eval` so it works from sources and from dist alike): a streaming SHA-512
 * fed, in order, with slices of shared memory (hashed in place) or copied bytes, and with zero-range lengths that it
 * hashes from one shared zero buffer (nothing is read or allocated for holes).
 */
const WORKER_SOURCE = `
'use strict';
const { parentPort, workerData } = require('node:worker_threads');
const memory = workerData && workerData.memory;
const { createHash } = require('node:crypto');
let hash = createHash('sha512');
const zeros = Buffer.alloc(1024 * 1024);
parentPort.on('message', (m) => {
  try {
    if (m.op === 'slot') {
      hash.update(new Uint8Array(memory, m.offset, m.length));
      parentPort.postMessage({ id: m.id });
    } else if (m.op === 'bytes') {
      hash.update(new Uint8Array(m.bytes));
      parentPort.postMessage({ id: m.id });
    } else if (m.op === 'zeros') {
      let left = m.length;
      while (left > 0) { const n = Math.min(left, zeros.length); hash.update(zeros.subarray(0, n)); left -= n; }
      parentPort.postMessage({ id: m.id });
    } else if (m.op === 'digest') {
      parentPort.postMessage({ id: m.id, hex: hash.digest('hex') });
      hash = createHash('sha512');
    } else {
      parentPort.postMessage({ id: m.id, error: 'unknown image hash operation ' + String(m.op) });
    }
  } catch (e) {
    parentPort.postMessage({ id: m.id, error: e && e.message ? e.message : String(e) });
  }
});
`;

/**
 * SHA-512 of a whole image, computed in order on a worker thread so that it runs beside the block pipeline instead of
 * on the event loop. Updates are hashed in the order they are submitted; each returns a promise that resolves once
 * its bytes are hashed, so a caller passing a view of shared memory reuses that memory only then (the window of
 * memory in flight is the caller's, e.g. the slots of a {@link SlotPool}). Views of non-shared memory are copied.
 */
export class ImageHasher {
  private readonly channel: WorkerChannel;

  /** `memory`: shared memory (e.g. a {@link SlotPool}'s) whose views are hashed in place, never copied. */
  constructor(private readonly memory?: SharedArrayBuffer) {
    this.channel = new WorkerChannel(WORKER_SOURCE, { memory }, 'image SHA-512');
  }

  /** Hashes `data` after everything submitted before it; resolves when done (then `data` may be reused). */
  update(data: Uint8Array): Promise<void> {
    if (data.byteLength === 0) return Promise.resolve();
    if (this.memory !== undefined && data.buffer === this.memory) {
      return this.channel.send({ op: 'slot', offset: data.byteOffset, length: data.byteLength }).then(() => undefined);
    }
    const copy = new Uint8Array(data);
    return this.channel.send({ op: 'bytes', bytes: copy.buffer }, [copy.buffer]).then(() => undefined);
  }

  /** Feeds `length` zero bytes (a hole or an all-zero block). */
  zeros(length: number): Promise<void> {
    if (length <= 0) return Promise.resolve();
    return this.channel.send({ op: 'zeros', length }).then(() => undefined);
  }

  /** The hex digest of everything submitted; the hasher is closed afterwards. */
  async digest(): Promise<string> {
    try {
      const r = await this.channel.send({ op: 'digest' });
      return String(r['hex']);
    } finally {
      await this.close();
    }
  }

  async close(): Promise<void> {
    await this.channel.close();
  }
}
