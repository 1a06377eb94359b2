import { describe, it, expect } from '@jest/globals';
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { advance, advanceMany, advanceZeros, multiBufferLanes } from './state.js';
import { Sha512BatchScheduler, sharedSha512Scheduler } from './scheduler.js';
import { Sha512ChainRecorder } from './recorder.js';
import { Sha512ChainVerifier } from './verifier.js';
import { Sha512ChainMismatchError } from './errors.js';
import { MiB, flipped, referenceSha512 } from './test-support/reference.js';
import { CPU_HAS_AVX2, CPU_HAS_AVX512, describeImpls } from './test-support/impls.js';
import { avx2Available, avx512Available, IMPL_LANES, sha512ChainImpl, IMPL_ENV } from './native.js';

const ADDON = fileURLToPath(new URL('../native/build/Release/sha512_chain.node', import.meta.url));

/** The state each message leads to, one OpenSSL call per message (the reference for advanceMany). */
async function oneByOne(states: Buffer[], data: Array<Uint8Array | null>, length: number): Promise<Buffer[]> {
  return Promise.all(states.map((s, i) => (data[i] === null ? advanceZeros(s, length) : advance(s, data[i]!))));
}

describe('SHA-512 implementations on this machine', () => {
  it('the addon offers AVX-512 and AVX2 exactly where /proc/cpuinfo reports them (x86-64 builds)', () => {
    console.log(
      `sha512-chain: this CPU ${CPU_HAS_AVX512 ? 'has' : 'has no'} AVX-512F/BW and ${CPU_HAS_AVX2 ? 'has' : 'has no'} AVX2; ` +
        `by default advanceMany runs ${sha512ChainImpl()}`,
    );
    const x64 = process.arch === 'x64';
    expect(avx512Available()).toBe(x64 && CPU_HAS_AVX512);
    expect(avx2Available()).toBe(x64 && CPU_HAS_AVX2);
    expect(multiBufferLanes()).toBe(IMPL_LANES[sha512ChainImpl()]);
  });

  it('BIS_SHA512_CHAIN_IMPL: auto picks what the CPU has, openssl forces OpenSSL, a bad value or an impossible avx512 is a clear error', () => {
    const widest = avx512Available() ? 'avx512' : avx2Available() ? 'avx2' : 'openssl';
    expect(sha512ChainImpl(undefined, {})).toBe(widest);
    expect(sha512ChainImpl(undefined, { [IMPL_ENV]: 'auto' })).toBe(widest);
    expect(sha512ChainImpl(undefined, { [IMPL_ENV]: 'openssl' })).toBe('openssl');
    expect(sha512ChainImpl('openssl', { [IMPL_ENV]: 'avx512' })).toBe('openssl');
    expect(() => sha512ChainImpl(undefined, { [IMPL_ENV]: 'sse' })).toThrow(
      'BIS_SHA512_CHAIN_IMPL="sse" is not a SHA-512 implementation: use openssl, avx2, avx512, auto',
    );
    if (avx512Available()) expect(sha512ChainImpl(undefined, { [IMPL_ENV]: 'avx512' })).toBe('avx512');
    else expect(() => sha512ChainImpl(undefined, { [IMPL_ENV]: 'avx512' })).toThrow(/BIS_SHA512_CHAIN_IMPL=avx512 but this CPU \(or build\) has no AVX-512F\/BW/);
    if (avx2Available()) expect(sha512ChainImpl(undefined, { [IMPL_ENV]: 'avx2' })).toBe('avx2');
    else expect(() => sha512ChainImpl(undefined, { [IMPL_ENV]: 'avx2' })).toThrow(/BIS_SHA512_CHAIN_IMPL=avx2 but this CPU \(or build\) has no AVX2/);
  });

  it('the addon refuses lanes other than 1, 4 and 8, 8 where the CPU lacks AVX-512 and 4 where it lacks AVX2', () => {
    const script = `
      const a = require(${JSON.stringify(ADDON)});
      const s = Buffer.alloc(64), d = [Buffer.alloc(128)];
      const tryIt = (lanes) => { try { a.advanceMany(s, d, 128, lanes); return 'ok'; } catch (e) { return e.message; } };
      console.log(JSON.stringify({ one: tryIt(1), two: tryIt(2), four: tryIt(4), eight: tryIt(8), supported: a.supportedLanes }));`;
    const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8' });
    expect(r.stderr).toBe('');
    expect(JSON.parse(r.stdout)).toEqual({
      one: 'ok',
      two: 'lanes must be 1 (OpenSSL per message), 4 (AVX2) or 8 (AVX-512)',
      four: avx2Available() ? 'ok' : 'lanes 4 needs AVX2, which this CPU or build does not have',
      eight: avx512Available() ? 'ok' : 'lanes 8 needs AVX-512F and AVX-512BW, which this CPU or build does not have',
      supported: [1, ...(avx2Available() ? [4] : []), ...(avx512Available() ? [8] : [])],
    });
  });
});

describeImpls('advanceMany', (impl) => {
  const advanceManyImpl = (states: Buffer[], data: Array<Uint8Array | null>, length: number) => advanceMany(states, data, length, impl);
  it('compresses as many messages at once as its implementation has lanes', () => {
    expect(multiBufferLanes(impl)).toBe(IMPL_LANES[impl]);
  });

  it('equals one OpenSSL advance per message: data, zeros, mixed, any count and length', async () => {
    for (const count of [1, 2, 3, 7, 8, 9, 16, 17]) {
      for (const length of [0, 128, 4096 + 128, 2 * MiB]) {
        const states = Array.from({ length: count }, () => randomBytes(64));
        for (const pattern of ['data', 'zeros', 'mixed'] as const) {
          const data = states.map((_, i) =>
            pattern === 'zeros' || (pattern === 'mixed' && i % 3 === 1) ? null : randomBytes(length),
          );
          const got = await advanceManyImpl(states, data, length);
          const want = await oneByOne(states, data, length);
          expect(got.map((s) => s.toString('hex'))).toEqual(want.map((s) => s.toString('hex')));
        }
      }
    }
  });

  it('a zero message and an explicit buffer of zeros give the same state', async () => {
    const s = randomBytes(64);
    const [a, b] = await advanceManyImpl([s, s], [null, Buffer.alloc(64 * 1024)], 64 * 1024);
    expect(a!.equals(b!)).toBe(true);
  });

  it('one changed byte in one message changes that message\'s state only', async () => {
    const states = Array.from({ length: 8 }, () => randomBytes(64));
    const data = states.map(() => randomBytes(8192));
    const before = await advanceManyImpl(states, data, 8192);
    const changed: Buffer[] = [...data];
    changed[5] = flipped(data[5]!, 4000);
    const after = await advanceManyImpl(states, changed, 8192);
    expect(after.map((s, i) => s.equals(before[i]!))).toEqual([true, true, true, true, true, false, true, true]);
  });

  it('rejects bad arguments with clear errors', async () => {
    const s = randomBytes(64);
    await expect(advanceMany([s], [], 128)).rejects.toThrow(/one state per message: 1 states, 0 messages/);
    await expect(advanceMany([s], [new Uint8Array(100)], 100)).rejects.toThrow(/multiple of 128/);
    await expect(advanceMany([s], [new Uint8Array(256)], 128)).rejects.toThrow(/data\[0\] must be exactly 128 bytes, got 256/);
    await expect(advanceMany([s.subarray(0, 10)], [null], 128)).rejects.toThrow(/states\[0\] must be exactly 64 bytes/);
    await expect(advanceMany([s], ['x' as unknown as Uint8Array], 128)).rejects.toThrow(/data\[0\] must be a Uint8Array or null/);
    await expect(advanceMany([], [], 128)).resolves.toEqual([]);
  });

  it('advanceManyAsync runs on threads of its own at nice 5 (BIS_SHA512_CHAIN_NICE), leaving the thread pool free', () => {
    // two calls of 8 x 16 MiB while the thread pool has one thread: a file-system call still completes at once, and the
    // threads doing the work run at the configured nice value
    const script = `
      const a = require(${JSON.stringify(ADDON)});
      const fs = require('node:fs');
      const nices = () => fs.readdirSync('/proc/self/task').map((t) => {
        try { return Number(fs.readFileSync('/proc/self/task/' + t + '/stat', 'utf8').split(') ')[1].split(' ')[16]); } catch { return 0; }
      });
      const L = 16 << 20;
      const LANES = ${IMPL_LANES[impl]};
      const data = Array.from({ length: 8 }, (_, i) => Buffer.alloc(L, i + 1));
      const states = require('node:crypto').randomBytes(64 * 8);
      (async () => {
        let settled = false;
        const jobs = Promise.all([a.advanceManyAsync(states, data, L, LANES), a.advanceManyAsync(states, data, L, LANES)]).then((r) => { settled = true; return r; });
        await fs.promises.stat('/');
        const statFirst = !settled;
        const seen = new Set();
        while (!settled) { for (const n of nices()) seen.add(n); await new Promise((r) => setTimeout(r, 2)); }
        const [x, y] = await jobs;
        const want = a.advanceMany(states, data, L, 1);
        console.log(JSON.stringify({ statFirst, lowered: seen.has(5), same: x.equals(want) && y.equals(want) }));
      })();`;
    for (const [nice, lowered] of [[undefined, true], ['0', false]] as const) {
      const env: NodeJS.ProcessEnv = { ...process.env, UV_THREADPOOL_SIZE: '1' };
      if (nice === undefined) delete env.BIS_SHA512_CHAIN_NICE;
      else env.BIS_SHA512_CHAIN_NICE = nice;
      const r = spawnSync(process.execPath, ['-e', script], { env, encoding: 'utf8' });
      expect(r.stderr).toBe('');
      expect(JSON.parse(r.stdout)).toEqual({ statFirst: true, lowered, same: true });
    }
  });
});

describeImpls('Sha512BatchScheduler', (impl) => {
  const lanes = IMPL_LANES[impl];
  const multi = lanes > 1;
  // The counts of calls below hold when every job is waiting before the first one's patience runs out: a patience far
  // longer than queueing them takes (1 ms, the default, ran out while a loaded machine queued them).
  it('a backlog is compressed in batches of up to its lanes, each result going to its own caller', async () => {
    const scheduler = new Sha512BatchScheduler({ concurrency: 1, patienceMs: 1000, impl });
    const states = Array.from({ length: 20 }, () => randomBytes(64));
    const data = states.map((_, i) => (i % 4 === 0 ? null : randomBytes(2048)));
    const got = await Promise.all(states.map((s, i) => scheduler.advance(s, data[i]!, 2048)));
    const want = await oneByOne(states, data, 2048);
    expect(got.map((s) => s.toString('hex'))).toEqual(want.map((s) => s.toString('hex')));
    expect(scheduler.stats.messages).toBe(20);
    // full passes as soon as a pass's worth of one kind wait, then the rest after their patience (one by one with one
    // lane): 3 calls with eight lanes, 5 with four, 20 with one
    expect(scheduler.stats.calls).toBe(Math.ceil(20 / lanes));
    expect(scheduler.waiting).toBe(0);
  });

  it('only messages of one length share a call', async () => {
    const scheduler = new Sha512BatchScheduler({ concurrency: 1, patienceMs: 1000, impl });
    const jobs = Array.from({ length: 12 }, (_, i) => ({ state: randomBytes(64), data: randomBytes(i % 2 ? 256 : 512) }));
    const got = await Promise.all(jobs.map((j) => scheduler.advance(j.state, j.data, j.data.length)));
    const want = await Promise.all(jobs.map((j) => advance(j.state, j.data)));
    expect(got.map((s) => s.toString('hex'))).toEqual(want.map((s) => s.toString('hex')));
    // eight lanes: no length has eight waiting, so after their patience the six of 512 bytes (the oldest's length)
    // share one pass, the six of 256 bytes another; four lanes: a pass of four 512s as soon as four wait, then four
    // 256s, then the two 512s and the two 256s after their patience
    if (lanes === 8) expect(scheduler.stats.calls).toBe(2);
    if (lanes === 4) expect(scheduler.stats.calls).toBe(4);
  });

  it('keeps zero messages apart from data while each kind fills passes, and mixes them only to fill a late pass', async () => {
    const scheduler = new Sha512BatchScheduler({ concurrency: 1, patienceMs: 30, impl });
    // eight of each kind, interleaved: one pass of data, one of zeros
    const jobs = Array.from({ length: 16 }, (_, i) => ({ state: randomBytes(64), data: i % 2 ? randomBytes(1024) : null }));
    const got = await Promise.all(jobs.map((j) => scheduler.advance(j.state, j.data, 1024)));
    const want = await Promise.all(jobs.map((j) => (j.data ? advance(j.state, j.data) : advanceZeros(j.state, 1024))));
    expect(got.map((s) => s.toString('hex'))).toEqual(want.map((s) => s.toString('hex')));
    if (multi) expect(scheduler.stats).toEqual({ calls: 16 / lanes, messages: 16, mixedCalls: 0 });
    // three zeros and two data messages never fill a pass of one kind: when the oldest's patience runs out they share one
    const few = Array.from({ length: 5 }, (_, i) => ({ state: randomBytes(64), data: i < 3 ? null : randomBytes(1024) }));
    const got2 = await Promise.all(few.map((j) => scheduler.advance(j.state, j.data, 1024)));
    const want2 = await Promise.all(few.map((j) => (j.data ? advance(j.state, j.data) : advanceZeros(j.state, 1024))));
    expect(got2.map((s) => s.toString('hex'))).toEqual(want2.map((s) => s.toString('hex')));
    // eight lanes: all five in one mixed pass; four lanes: the three zeros with one data message, then the last one
    if (lanes === 8) expect(scheduler.stats).toEqual({ calls: 3, messages: 21, mixedCalls: 1 });
    if (lanes === 4) expect(scheduler.stats).toEqual({ calls: 6, messages: 21, mixedCalls: 1 });
  });

  it('rejects a bad concurrency or patience', async () => {
    expect(() => new Sha512BatchScheduler({ concurrency: 0 })).toThrow(/concurrency must be a positive integer/);
    expect(() => new Sha512BatchScheduler({ patienceMs: -1 })).toThrow(/patienceMs must be a non-negative number/);
    await expect(new Sha512BatchScheduler({ impl }).advance(randomBytes(64), null, 128, Number.NaN)).rejects.toThrow(/patienceMs/);
  });

  it('a job given more patience waits for a fuller pass, and never longer than its patience', async () => {
    const scheduler = new Sha512BatchScheduler({ concurrency: 1, impl });
    const t0 = performance.now();
    const a = scheduler.advance(randomBytes(64), null, 1024, 40);
    const b = scheduler.advance(randomBytes(64), null, 1024, 40);
    await Promise.all([a, b]);
    const waited = performance.now() - t0;
    if (multi) {
      expect(scheduler.stats).toEqual({ calls: 1, messages: 2, mixedCalls: 0 });
      expect(waited).toBeGreaterThanOrEqual(35);
    }
    // (a job that waited for company forever would never settle: the test's timeout catches that)
  });

  it('a lone job does not wait for company longer than its patience', async () => {
    const scheduler = new Sha512BatchScheduler({ concurrency: 1, patienceMs: 20, impl });
    const state = randomBytes(64);
    const data = randomBytes(1024);
    const t0 = performance.now();
    const got = await scheduler.advance(state, data, 1024);
    const waited = performance.now() - t0;
    expect(got.equals(await advance(state, data))).toBe(true);
    expect(scheduler.stats).toEqual({ calls: 1, messages: 1, mixedCalls: 0 });
    // with several lanes it waits its patience (timers may fire a little early or late), else it starts at once
    if (multi) expect(waited).toBeGreaterThanOrEqual(15);
    else expect(scheduler.patienceMs).toBe(0);
  });

  it('two verifiers on the shared scheduler verify their chains, and a bad segment fails only its own', async () => {
    const SEG = 64 * 1024;
    const make = (n: number) => {
      const bytes = randomBytes(SEG * n);
      for (let k = 1; k < n; k += 3) bytes.fill(0, k * SEG, (k + 1) * SEG);
      const rec = new Sha512ChainRecorder(SEG);
      rec.updateSync(bytes);
      return { bytes, chain: rec.finish() };
    };
    const a = make(24);
    const b = make(17);
    const va = new Sha512ChainVerifier(a.chain);
    const vb = new Sha512ChainVerifier(b.chain);
    const seg = (bytes: Buffer, k: number) => (k % 3 === 1 ? null : bytes.subarray(k * SEG, (k + 1) * SEG));
    const before = sharedSha512Scheduler().stats.calls;
    const bad = flipped(b.bytes, 5 * SEG + 7);
    const results = await Promise.allSettled([
      ...Array.from({ length: 24 }, (_, k) => va.verifySegment(k, seg(a.bytes, k))),
      ...Array.from({ length: 17 }, (_, k) => vb.verifySegment(k, seg(bad, k))),
    ]);
    expect(va.checksum()).toBe(referenceSha512(a.bytes));
    const failed = results.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
    expect(failed).toHaveLength(1);
    expect(failed[0]!.reason).toBeInstanceOf(Sha512ChainMismatchError);
    expect(vb.pending()).toEqual([5]);
    if (multiBufferLanes() > 1) expect(sharedSha512Scheduler().stats.calls - before).toBeLessThan(41);
  });
});
