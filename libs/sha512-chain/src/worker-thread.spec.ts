import { describe, it, expect } from '@jest/globals';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { randomData, referenceSha512 } from './test-support/reference.js';

// The image sink hashes on a worker thread, so the addon must load in more than one thread (N-API addons are
// context-aware; this one keeps no mutable global state).
const addonPath = fileURLToPath(new URL('../native/build/Release/sha512_chain.node', import.meta.url));

describe('the addon in worker threads', () => {
  it('loads and hashes in two worker threads at once, matching node:crypto', async () => {
    const data = randomData(128 * 1000 + 55);
    const code = `
      const { parentPort, workerData } = require('node:worker_threads');
      const addon = require(workerData.addonPath);
      const iv = Buffer.from(workerData.iv, 'hex');
      const data = Buffer.from(workerData.data);
      const whole = data.length - (data.length % 128);
      addon.advanceAsync(iv, data.subarray(0, whole)).then((s) =>
        parentPort.postMessage(addon.finalize(s, data.length, data.subarray(whole)).toString('hex')));
    `;
    const iv =
      '6a09e667f3bcc908bb67ae8584caa73b3c6ef372fe94f82ba54ff53a5f1d36f1' +
      '510e527fade682d19b05688c2b3e6c1f1f83d9abfb41bd6b5be0cd19137e2179';
    const run = (): Promise<string> =>
      new Promise((resolve, reject) => {
        const w = new Worker(code, { eval: true, workerData: { addonPath, iv, data } });
        w.once('message', (m: string) => {
          resolve(m);
          void w.terminate();
        });
        w.once('error', reject);
      });
    const [a, b] = await Promise.all([run(), run()]);
    expect(a).toBe(referenceSha512(data));
    expect(b).toBe(a);
  });
});
