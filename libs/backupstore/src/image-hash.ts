import type { ImageHashReply, ImageHashRequest, ImageHashWorkerData } from './image-hash-worker.js';
import { WorkerChannel } from './pipeline.js';

const IMAGE_HASH_WORKER = new URL('./image-hash-worker.js', import.meta.url);

/**
 * SHA-512 of a whole image, computed in order on a worker thread so that it runs beside the block pipeline instead of
 * on the event loop. Updates are hashed in the order they are submitted; each returns a promise that resolves once
 * its bytes are hashed, so a caller passing a view of shared memory reuses that memory only then (the window of
 * memory in flight is the caller's, e.g. the slots of a {@link SlotPool}). Views of non-shared memory are copied.
 */
export class ImageHasher {
  private readonly channel: WorkerChannel<ImageHashRequest, ImageHashReply>;

  /** `memory`: shared memory (e.g. a {@link SlotPool}'s) whose views are hashed in place, never copied. */
  constructor(private readonly memory?: SharedArrayBuffer) {
    this.channel = new WorkerChannel<ImageHashRequest, ImageHashReply>(
      IMAGE_HASH_WORKER,
      { memory } satisfies ImageHashWorkerData,
      'image SHA-512',
    );
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
      return String(r.hex);
    } finally {
      await this.close();
    }
  }

  async close(): Promise<void> {
    await this.channel.close();
  }
}
