import { describe, expect, it } from '@jest/globals';
import { Semaphore } from './semaphore.js';

/** A promise and the function that resolves it. */
function gate(): { promise: Promise<void>; open: () => void } {
  let open!: () => void;
  const promise = new Promise<void>((r) => (open = r));
  return { promise, open };
}

/** Resolves after `n` microtask hops. */
async function hops(n: number): Promise<void> {
  for (let i = 0; i < n; i++) await Promise.resolve();
}

describe('Semaphore', () => {
  it('a release hands the slot to the waiter: a caller arriving in the same tick queues behind it', async () => {
    const s = new Semaphore(1);
    await s.acquire(); // A holds the slot
    const order: string[] = [];
    const b = s.acquire().then(() => order.push('b'));
    expect(s.waiting).toBe(1);
    s.release(); // A leaves; B has not resumed yet
    const c = s.acquire().then(() => order.push('c')); // arrives before B runs
    expect(s.holders).toBe(1);
    expect(s.waiting).toBe(1);
    await b;
    await hops(10);
    expect(order).toEqual(['b']); // C still waits: one holder, as the limit says
    s.release();
    await c;
    expect(order).toEqual(['b', 'c']);
    s.release();
    expect(s.holders).toBe(0);
  });

  it('run(): concurrency never exceeds the limit when new callers enter at every microtask offset after a release', async () => {
    for (const limit of [1, 2, 3]) {
      for (let offset = 0; offset <= 12; offset++) {
        const s = new Semaphore(limit);
        let running = 0;
        let max = 0;
        const task = (wait: Promise<void>) => async () => {
          running++;
          max = Math.max(max, running);
          await wait;
          running--;
        };
        const first = gate();
        const all: Promise<void>[] = [];
        for (let i = 0; i < limit; i++) all.push(s.run(task(first.promise))); // the holders
        for (let i = 0; i < limit; i++) all.push(s.run(task(hops(3)))); // waiters
        await hops(2);
        expect(s.waiting).toBe(limit);
        // The holders finish; `offset` microtask hops later (before, between or after the releases and the woken
        // waiters' resumption) a new caller arrives, as a loop woken by the same event would.
        first.open();
        all.push(hops(offset).then(() => s.run(task(hops(1)))));
        await Promise.all(all);
        expect({ limit, offset, max }).toEqual({ limit, offset, max: limit });
        expect(s.holders).toBe(0);
      }
    }
  });

  it('run() releases when the task throws; waiters are served in arrival order', async () => {
    const s = new Semaphore(1);
    const order: number[] = [];
    const runs = [0, 1, 2, 3].map((i) =>
      s.run(async () => {
        order.push(i);
        await hops(1);
        if (i === 1) throw new Error('task 1 failed');
      }),
    );
    const results = await Promise.allSettled(runs);
    expect(results.map((r) => r.status)).toEqual(['fulfilled', 'rejected', 'fulfilled', 'fulfilled']);
    expect(order).toEqual([0, 1, 2, 3]);
    expect(s.holders).toBe(0);
  });

  it('refuses a limit below 1 and a release without a holder', () => {
    expect(() => new Semaphore(0)).toThrow(/positive integer/);
    expect(() => new Semaphore(1.5)).toThrow(/positive integer/);
    expect(() => new Semaphore(1).release()).toThrow(/released more often than acquired/);
  });
});
