import { Worker } from 'node:worker_threads';

/**
 * The worker's code (CommonJS, loaded with `eval` so it works from sources and from dist alike): a streaming SHA-512
 * fed with data chunks and zero-range lengths, acknowledging each message so the sender can bound what is queued.
 */
const WORKER_SOURCE = `
const { parentPort } = require('node:worker_threads');
const { createHash } = require('node:crypto');
const hash = createHash('sha512');
const zeros = Buffer.alloc(${2 * 1024 * 1024});
parentPort.on('message', (m) => {
  if (m.type === 'data') {
    hash.update(m.data);
    parentPort.postMessage({ type: 'ack', bytes: m.data.byteLength });
  } else if (m.type === 'zeros') {
    let left = m.length;
    while (left > 0) { const n = Math.min(left, zeros.length); hash.update(zeros.subarray(0, n)); left -= n; }
    parentPort.postMessage({ type: 'ack', bytes: 0 });
  } else if (m.type === 'digest') {
    parentPort.postMessage({ type: 'digest', hex: hash.digest('hex') });
  }
});
`;

type WorkerMessage = { type: 'ack'; bytes: number } | { type: 'digest'; hex: string };

/**
 * SHA-512 of a whole image, computed in order on a worker thread so that it runs beside the block pipeline instead of
 * on the event loop. `update` copies the bytes (the caller keeps its buffer); at most `maxQueuedBytes` wait in the
 * worker's queue before `update` waits.
 */
export class ImageHasher {
  private readonly worker: Worker;
  private queued = 0;
  private waiters: (() => void)[] = [];
  private digestResolve: ((hex: string) => void) | undefined;
  private failure: Error | undefined;
  private closed = false;

  constructor(private readonly maxQueuedBytes = 64 * 1024 * 1024) {
    this.worker = new Worker(WORKER_SOURCE, { eval: true });
    this.worker.unref();
    this.worker.on('message', (m: WorkerMessage) => {
      if (m.type === 'ack') {
        this.queued -= m.bytes;
        const ws = this.waiters;
        this.waiters = [];
        for (const w of ws) w();
      } else {
        this.digestResolve?.(m.hex);
      }
    });
    this.worker.on('error', (err) => {
      this.failure = err;
      for (const w of this.waiters) w();
    });
  }

  private async room(): Promise<void> {
    while (this.queued > this.maxQueuedBytes && !this.failure) await new Promise<void>((r) => this.waiters.push(r));
    if (this.failure) throw this.failure;
  }

  async update(data: Uint8Array): Promise<void> {
    await this.room();
    const copy = new Uint8Array(data);
    this.queued += copy.byteLength;
    this.worker.postMessage({ type: 'data', data: copy }, [copy.buffer]);
  }

  /** Feeds `length` zero bytes (a hole). */
  async zeros(length: number): Promise<void> {
    if (length <= 0) return;
    await this.room();
    this.worker.postMessage({ type: 'zeros', length });
  }

  /** The hex digest; the hasher is closed afterwards. */
  async digest(): Promise<string> {
    if (this.failure) throw this.failure;
    const hex = await new Promise<string>((resolve, reject) => {
      this.digestResolve = resolve;
      this.worker.once('error', reject);
      this.worker.postMessage({ type: 'digest' });
    });
    await this.close();
    return hex;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.worker.terminate();
  }
}
