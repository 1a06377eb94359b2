import { describe, expect, it } from '@jest/globals';
import { ItemExponentialRateLimiter, WorkQueue } from './workqueue.js';

describe('WorkQueue', () => {
  it('deduplicates keys that are waiting', async () => {
    const q = new WorkQueue<string>();
    q.add('a');
    q.add('b');
    q.add('a');
    expect(q.length).toBe(2);
    expect(await q.get()).toBe('a');
    expect(await q.get()).toBe('b');
    q.done('a');
    q.done('b');
    expect(q.length).toBe(0);
    q.shutDown();
  });

  it('never hands a key to two workers; a key added while processing comes back after done', async () => {
    const q = new WorkQueue<string>();
    q.add('a');
    const k = await q.get();
    q.add('a');
    expect(q.length).toBe(0);
    let second: string | undefined;
    const p = q.get().then((v) => (second = v));
    await new Promise((r) => setTimeout(r, 10));
    expect(second).toBeUndefined();
    q.done(k as string);
    await p;
    expect(second).toBe('a');
    q.done('a');
    q.shutDown();
  });

  it('addAfter delivers later; addRateLimited backs off exponentially per item; forget resets', async () => {
    const q = new WorkQueue<string>({ baseDelayMs: 20, maxDelayMs: 1000, qps: 0 });
    const t0 = Date.now();
    q.addAfter('x', 50);
    expect(await q.get()).toBe('x');
    expect(Date.now() - t0).toBeGreaterThanOrEqual(45);
    q.done('x');
    const rl = new ItemExponentialRateLimiter<string>({ baseDelayMs: 5, maxDelayMs: 40, qps: 0 });
    expect([rl.when('k'), rl.when('k'), rl.when('k'), rl.when('k'), rl.when('k')]).toEqual([5, 10, 20, 40, 40]);
    expect(rl.numRequeues('k')).toBe(5);
    expect(rl.when('other')).toBe(5);
    rl.forget('k');
    expect(rl.when('k')).toBe(5);
    q.addRateLimited('y');
    q.addRateLimited('y');
    expect(q.numRequeues('y')).toBe(2);
    const t1 = Date.now();
    expect(await q.get()).toBe('y');
    expect(Date.now() - t1).toBeGreaterThanOrEqual(15);
    q.done('y');
    q.shutDown();
  });

  it('the token bucket delays once the burst is spent', () => {
    const rl = new ItemExponentialRateLimiter<number>({ baseDelayMs: 1, maxDelayMs: 1, qps: 10, burst: 2 });
    expect(rl.when(1)).toBe(1);
    expect(rl.when(2)).toBe(1);
    expect(rl.when(3)).toBeGreaterThanOrEqual(90);
  });

  it('shutDown releases waiting getters and drops delayed keys; shutDownWithDrain waits for work in progress', async () => {
    const q = new WorkQueue<string>();
    const waiting = q.get();
    q.addAfter('later', 10_000);
    q.shutDown();
    expect(await waiting).toBeUndefined();
    expect(await q.get()).toBeUndefined();
    q.add('ignored');
    expect(q.length).toBe(0);

    const q2 = new WorkQueue<string>();
    q2.add('a');
    const k = await q2.get();
    let drained = false;
    const d = q2.shutDownWithDrain().then(() => (drained = true));
    await new Promise((r) => setTimeout(r, 10));
    expect(drained).toBe(false);
    q2.done(k as string);
    await d;
    expect(drained).toBe(true);
  });
});
