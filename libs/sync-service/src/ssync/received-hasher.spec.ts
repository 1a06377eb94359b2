import { describe, expect, it } from '@jest/globals';
import { ReceivedFileHasher, type SlabAllocator } from './received-hasher.js';

// The hasher's slabs are made when first needed: a receive that takes the sender's chain right after it opens (the
// hasher is then closed) or a small file allocates no more than it uses.
describe('ReceivedFileHasher slabs', () => {
  it('allocates a slab only when none is free, and never more than its limit', async () => {
    let allocated = 0;
    const allocate: SlabAllocator = (size, shared) => {
      allocated++;
      return Buffer.from(shared ? new SharedArrayBuffer(size) : new ArrayBuffer(size));
    };
    const idle = new ReceivedFileHasher({ fileHandle: () => undefined, slabSize: 64 * 1024, slabs: 3, allocate });
    expect(allocated).toBe(0);
    await idle.close();
    expect(allocated).toBe(0);

    const h = new ReceivedFileHasher({ fileHandle: () => undefined, slabSize: 64 * 1024, slabs: 3, allocate });
    const a = await h.acquire(0);
    expect(allocated).toBe(1);
    h.release(a);
    const again = await h.acquire(0);
    expect(again).toBe(a);
    expect(allocated).toBe(1);
    const b = await h.acquire(64 * 1024);
    const c = await h.acquire(2 * 64 * 1024);
    expect(allocated).toBe(3);
    // at the limit: the next request waits for a slab given back instead of allocating one
    let fourth: unknown;
    const waiting = h.acquire(3 * 64 * 1024).then((s) => (fourth = s));
    await new Promise((r) => setTimeout(r, 20));
    expect(fourth).toBeUndefined();
    h.release(b);
    await waiting;
    expect(fourth).toBe(b);
    expect(allocated).toBe(3);
    h.release(again);
    h.release(c);
    h.release(b);
    await h.close();
  });
});
