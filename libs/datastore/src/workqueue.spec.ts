import { describe, expect, it } from '@jest/globals';
import { ItemExponentialRateLimiter, WorkQueue } from './workqueue.js';
import { ManualClock } from './clock.js';
import { seededRandom } from './retry.js';

/** Lets every queued callback and promise reaction run (one macrotask turn). */
const settle = () => new Promise<void>((r) => setImmediate(r));

/** The value of `p` if it has settled by now, else 'pending'. */
async function peek<T>(p: Promise<T>): Promise<T | 'pending'> {
  let out: T | 'pending' = 'pending';
  void p.then((v) => (out = v));
  await settle();
  return out;
}

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
    await settle();
    expect(second).toBeUndefined();
    q.done(k as string);
    await p;
    expect(second).toBe('a');
    q.done('a');
    q.shutDown();
  });

  it('hands out low-priority keys after the others (one in eight while both wait); a key added again at normal priority moves up', async () => {
    const q = new WorkQueue<string>();
    for (let i = 0; i < 3; i++) q.add(`new-${i}`, true);
    for (let i = 0; i < 10; i++) q.add(`change-${i}`);
    q.add('new-2'); // a change of an object waiting at low priority
    q.add('change-0', true); // already waiting at normal priority: stays there
    expect(q.length).toBe(13);
    const order: string[] = [];
    for (let i = 0; i < 13; i++) {
      const k = (await q.get())!;
      order.push(k);
      q.done(k);
    }
    expect(order).toEqual([
      'change-0', 'change-1', 'change-2', 'change-3', 'change-4', 'change-5', 'change-6',
      'new-0', // the eighth key handed out while both kinds wait
      'change-7', 'change-8', 'change-9', 'new-2', 'new-1',
    ]);
    expect(q.length).toBe(0);
  });

  it('addAfter delivers after the delay, not before; an earlier pending time wins', async () => {
    const clock = new ManualClock();
    const q = new WorkQueue<string>({ qps: 0 }, clock);
    q.addAfter('x', 50);
    const got = q.get();
    clock.advance(49);
    expect(await peek(got)).toBe('pending');
    clock.advance(1);
    expect(await peek(got)).toBe('x');
    q.done('x');
    // a later time for a key already delayed is ignored; an earlier one replaces it
    q.addAfter('y', 30);
    q.addAfter('y', 100);
    q.addAfter('z', 100);
    q.addAfter('z', 10);
    expect(clock.pending).toBe(2);
    clock.advance(10);
    expect(await q.get()).toBe('z');
    clock.advance(19);
    expect(q.length).toBe(0);
    clock.advance(1);
    expect(await q.get()).toBe('y');
    clock.advance(1000);
    expect(q.length).toBe(0); // y was delivered once
    q.shutDown();
  });

  it('addRateLimited backs off exponentially per item; forget resets', async () => {
    const rl = new ItemExponentialRateLimiter<string>({ baseDelayMs: 5, maxDelayMs: 40, qps: 0, jitter: 0 });
    expect([rl.when('k'), rl.when('k'), rl.when('k'), rl.when('k'), rl.when('k')]).toEqual([5, 10, 20, 40, 40]);
    expect(rl.numRequeues('k')).toBe(5);
    expect(rl.when('other')).toBe(5);
    rl.forget('k');
    expect(rl.when('k')).toBe(5);

    const clock = new ManualClock();
    const q = new WorkQueue<string>({ baseDelayMs: 20, maxDelayMs: 1000, qps: 0, jitter: 0 }, clock);
    q.addRateLimited('y'); // due at 20
    q.addRateLimited('y'); // 40: the earlier time wins
    expect(q.numRequeues('y')).toBe(2);
    const got = q.get();
    clock.advance(19);
    expect(await peek(got)).toBe('pending');
    clock.advance(1);
    expect(await peek(got)).toBe('y');
    q.done('y');
    q.forget('y');
    expect(q.numRequeues('y')).toBe(0);
    q.shutDown();
    expect(clock.pending).toBe(0); // shutDown cleared the later timer
  });

  it('never drops a failing item: after any number of failures it comes back within the capped, jittered delay', async () => {
    const clock = new ManualClock();
    const q = new WorkQueue<string>({ baseDelayMs: 10, maxDelayMs: 80, qps: 0, jitter: 0.5, random: seededRandom(7) }, clock);
    const delays: number[] = [];
    q.add('k');
    expect(await q.get()).toBe('k');
    for (let i = 0; i < 40; i++) {
      // the reconcile of 'k' failed again
      const before = clock.now();
      q.addRateLimited('k');
      q.done('k');
      const next = q.get();
      // it comes back once its delay passes, and never later than the cap
      while ((await peek(next)) === 'pending') {
        expect(clock.now() - before).toBeLessThan(80);
        clock.advance(1);
      }
      expect(await next).toBe('k');
      delays.push(clock.now() - before);
    }
    q.done('k');
    expect(q.numRequeues('k')).toBe(40);
    // grows, then stays within [cap·(1−jitter), cap]
    expect(delays[0]).toBeLessThanOrEqual(10);
    for (const d of delays.slice(5)) {
      expect(d).toBeGreaterThanOrEqual(40);
      expect(d).toBeLessThanOrEqual(80);
    }
    q.shutDown();
  });

  it('the token bucket delays once the burst is spent, and refills with time', () => {
    const clock = new ManualClock();
    const rl = new ItemExponentialRateLimiter<number>({ baseDelayMs: 1, maxDelayMs: 1, qps: 10, burst: 2, jitter: 0 }, () => clock.now());
    expect(rl.when(1)).toBe(1);
    expect(rl.when(2)).toBe(1);
    expect(rl.when(3)).toBe(100); // one token short at 10 qps
    clock.advance(250); // 2.5 tokens back on the one owed: 1.5
    expect(rl.when(4)).toBe(1);
    expect(rl.when(5)).toBe(50); // half a token short
    clock.advance(10_000); // refills to the burst, no further
    expect([rl.when(6), rl.when(7), rl.when(8)]).toEqual([1, 1, 100]);
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
    await settle();
    expect(drained).toBe(false);
    q2.done(k as string);
    await d;
    expect(drained).toBe(true);
  });
});

describe('WorkQueue metrics', () => {
  it('reports adds (not the deduplicated ones), depth and retries to its metrics', async () => {
    const clock = new ManualClock(0);
    const q = new WorkQueue<string>({ baseDelayMs: 10, jitter: 0, qps: 0 }, clock);
    const seen = { adds: 0, retries: 0, depths: [] as number[] };
    q.metrics = { added: () => seen.adds++, depth: (n) => seen.depths.push(n), retried: () => seen.retries++ };
    q.add('a');
    q.add('a'); // already waiting
    q.add('b');
    expect(seen.adds).toBe(2);
    expect(seen.depths.at(-1)).toBe(2);
    const k = await q.get();
    expect(seen.depths.at(-1)).toBe(1);
    q.addRateLimited(k as string);
    expect(seen.retries).toBe(1);
    q.done(k as string);
    clock.advance(10);
    expect(seen.adds).toBe(3); // the retry's add after its backoff
    expect(seen.depths.at(-1)).toBe(2);
    q.shutDown();
    expect(seen.depths.at(-1)).toBe(0);
  });
});
